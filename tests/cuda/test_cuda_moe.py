"""The MoE ops on the GPU against float64 references: topk_softmax and grouped_topk (f32 router
logits exactly; bf16 / f16 logits are compared with the reference on the same rounded values) and
fused_experts (cuda/fused_moe.cu) on the values the GPU was given."""
import numpy as np
import pytest

from tests.ops.test_fused_moe import route, swigluoai64
from tests.ops.test_moe_routing import ROUTINGS, grouped_reference, reference
from vllmx import _C
from vllmx.device import BF16, F16, F32, I32, DeviceArray

from .test_cuda_ops import as_f32, dev, host, rounded

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("shape", [(1, 8, 2), (37, 64, 6), (130, 128, 8), (5, 384, 8), (3, 7, 7),
                                   (8, 256, 8), (4, 40, 32), (2, 8192, 4)])
@pytest.mark.parametrize("ties", [False, True], ids=["spread", "ties"])
def test_topk_softmax(shape, renormalize, dtype, ties):
    """The k best experts in order (ties to the lower id) and their softmax weights: Qwen3.5's
    256 experts top-8, 32 picks (every lane of the warp keeps one), 8192 experts; with ties
    (logits of five values) a wrong tie-break or an expert picked twice changes the ids."""
    t, e, k = shape
    rng = np.random.default_rng(t + e + k)
    x = rng.integers(-2, 3, (t, e)) if ties else rng.standard_normal((t, e)) * 3
    g = host(x.astype(np.float32), dtype)
    w = DeviceArray.empty((t, k), F32)
    ids = DeviceArray.empty((t, k), I32)
    _C.ops.topk_softmax(w, ids, DeviceArray.from_numpy(g, dtype), renormalize)
    w_ref, ids_ref = reference(as_f32(g, dtype), k, renormalize)
    np.testing.assert_array_equal(ids.numpy(), ids_ref)
    assert np.abs(w.numpy() - w_ref).max() < 1e-6


def test_topk_softmax_more_than_a_warp_of_picks():
    """top_k over 32 is an error naming it, not a wrong answer."""
    g = DeviceArray.from_numpy(np.ones((2, 64), np.float32))
    w = DeviceArray.empty((2, 33), F32)
    ids = DeviceArray.empty((2, 33), I32)
    with pytest.raises(Exception, match="top_k 33 must be at most 32"):
        _C.ops.topk_softmax(w, ids, g, False)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("routing", ROUTINGS, ids=lambda r: f"E{r[1]}-k{r[2]}-G{r[3]}-{r[4]}")
def test_grouped_topk(routing, dtype):
    """grouped_topk on the GPU: the float64 reference's experts on the values the GPU was given
    (bf16 logits compared on their rounded values), its weights within f32 rounding."""
    t, e, k, groups, topk_group, sigmoid, with_bias, renorm, scaling = routing
    rng = np.random.default_rng(t * e + k)
    g = host((rng.standard_normal((t, e)) * 2).astype(np.float32), dtype)
    bias = rng.uniform(-0.3, 0.3, e).astype(np.float32) if with_bias else None
    w = DeviceArray.empty((t, k), F32)
    ids = DeviceArray.empty((t, k), I32)
    _C.ops.grouped_topk(w, ids, DeviceArray.from_numpy(g, dtype),
                        None if bias is None else DeviceArray.from_numpy(bias), groups,
                        topk_group, sigmoid, renorm, scaling)
    w_ref, ids_ref, _ = grouped_reference(as_f32(g, dtype), k, groups, topk_group, sigmoid,
                                          renorm, scaling, bias)
    np.testing.assert_array_equal(ids.numpy(), ids_ref)
    assert np.abs(w.numpy() - w_ref).max() < 1e-6 * scaling


# ---- fused_experts (cuda/fused_moe.cu) ----

def experts64(x64, w13, w2, tw, ids, b13=None, b2=None, activation="silu"):
    """The float64 reference of fused_experts for any activation, with optional biases: each
    rank's tokens expert by expert, as matrix products (prefill-sized batches stay quick)."""
    out = np.zeros(x64.shape, np.float64)
    for j in range(ids.shape[1]):
        for e in np.unique(ids[:, j]):
            rows = ids[:, j] == e
            gu = x64[rows] @ w13[e].T + (0 if b13 is None else b13[e])
            if activation == "relu2":
                a = np.maximum(gu, 0) ** 2
            elif activation == "swigluoai":
                a = swigluoai64(gu)
            else:
                g, u = gu[:, : gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
                a = g / (1.0 + np.exp(-g)) * u
            out[rows] += tw[rows, j, None] * (a @ w2[e].T + (0 if b2 is None else b2[e]))
    return out


def run_gpu(x, w13, w2, tw, ids, dtype, b13=None, b2=None, activation="silu"):
    """fused_experts on the GPU over x / w13 / w2 (f32 host values) in dtype: (out as f32, the
    f64 reference on the values the GPU was given)."""
    xs, w13s, w2s = (rounded(a, dtype) for a in (x, w13, w2))
    out = DeviceArray.empty(x.shape, dtype)
    bias = [None if b is None else DeviceArray.from_numpy(b.astype(np.float32)) for b in (b13, b2)]
    ops_out = ops_fused(out, dev(xs, dtype), dev(w13s, dtype), dev(w2s, dtype), tw, ids,
                        bias, activation)
    ref = experts64(xs.astype(np.float64), w13s.astype(np.float64), w2s.astype(np.float64),
                    tw.astype(np.float64), ids, b13, b2, activation)
    return as_f32(ops_out.numpy(), dtype), ref


def ops_fused(out, x, w13, w2, tw, ids, bias, activation):
    from vllmx.ops import _EXPERT_ACTIVATIONS

    _C.ops.fused_experts(out, x, w13, w2, DeviceArray.from_numpy(tw),
                         DeviceArray.from_numpy(ids), bias[0], bias[1],
                         _EXPERT_ACTIVATIONS[activation])
    return out


# Relative error bars: every intermediate (w13's product, the activation, w2's product) rounds
# to the activation dtype on the GPU, so bf16 carries ~3 roundings of 2^-9.
TOL = {F32: 1e-5, F16: 4e-3, BF16: 3e-2}

# (experts, top-k, tokens, hidden, intermediate): decode sizes (32-row tiles), batches wide
# enough for Hopper's swapped grouped wgmma tiles (5 and 40 rows an expert: the 16- and 64-wide
# ones), prefills with >= 96 rows an expert (128-row tiles; on Hopper the straight wgmma
# ones), sizes not a multiple of 8 (the generic kernel), and more pairs than one chunk holds
# (131072 for these sizes).
MOE_SHAPES = [(8, 2, 1, 64, 32), (64, 8, 5, 128, 64), (16, 4, 37, 96, 48),
              (64, 8, 40, 640, 320), (32, 4, 320, 1152, 576), (8, 2, 512, 64, 32),
              (16, 4, 1000, 256, 136), (8, 2, 7, 36, 20), (4, 4, 33000, 16, 8)]


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("shape", MOE_SHAPES, ids=lambda s: "E{}k{}T{}H{}I{}".format(*s))
def test_fused_experts_vs_float64(shape, dtype):
    e, k, t, h, i = shape
    rng = np.random.default_rng(e * 1000 + t + h)
    x = rng.standard_normal((t, h)).astype(np.float32)
    w13 = (rng.standard_normal((e, 2 * i, h)) / np.sqrt(h)).astype(np.float32)
    w2 = (rng.standard_normal((e, h, i)) / np.sqrt(i)).astype(np.float32)
    tw, ids = route(rng, t, e, k)
    got, ref = run_gpu(x, w13, w2, tw, ids, dtype)
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() / np.abs(ref).max() < TOL[dtype]


@pytest.mark.parametrize("activation", ["swigluoai", "relu2"])
@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_fused_experts_biases_and_activations(activation, dtype):
    e, k, t, h, i = 16, 4, 21, 64, 32
    rng = np.random.default_rng(7)
    g = i if activation == "relu2" else 2 * i
    x = (rng.standard_normal((t, h)) * 2).astype(np.float32)
    w13 = (rng.standard_normal((e, g, h)) * 2 / np.sqrt(h)).astype(np.float32)
    w2 = (rng.standard_normal((e, h, i)) / np.sqrt(i)).astype(np.float32)
    b13 = rng.standard_normal((e, g)).astype(np.float32)
    b2 = rng.standard_normal((e, h)).astype(np.float32)
    tw, ids = route(rng, t, e, k)
    got, ref = run_gpu(x, w13, w2, tw, ids, dtype, b13, b2, activation)
    assert np.abs(got - ref).max() / np.abs(ref).max() < TOL[dtype]


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_fused_experts_prefill_with_idle_experts(dtype):
    """A prefill-sized batch routed to 6 of 64 experts: the experts without rows are groups of
    no rows (the wgmma path's zero-row problems) and must leave the others' rows alone."""
    e, k, t, h, i = 64, 2, 3200, 128, 64
    rng = np.random.default_rng(23)
    x = rng.standard_normal((t, h)).astype(np.float32)
    w13 = (rng.standard_normal((e, 2 * i, h)) / np.sqrt(h)).astype(np.float32)
    w2 = (rng.standard_normal((e, h, i)) / np.sqrt(i)).astype(np.float32)
    tw, ids = route(rng, t, e, k, used=[3, 9, 10, 40, 41, 63])
    got, ref = run_gpu(x, w13, w2, tw, ids, dtype)
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() / np.abs(ref).max() < TOL[dtype]


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_fused_experts_token_alone_equals_in_batch(dtype):
    """A token's output bits do not depend on the tokens sharing its experts' tiles."""
    e, k, t, h, i = 8, 2, 24, 64, 32
    rng = np.random.default_rng(11)
    x = rng.standard_normal((t, h)).astype(np.float32)
    w13 = (rng.standard_normal((e, 2 * i, h)) / np.sqrt(h)).astype(np.float32)
    w2 = (rng.standard_normal((e, h, i)) / np.sqrt(i)).astype(np.float32)
    tw, ids = route(rng, t, e, k)
    batch, _ = run_gpu(x, w13, w2, tw, ids, dtype)
    for r in (0, 5, t - 1):
        alone, _ = run_gpu(x[r:r + 1], w13, w2, tw[r:r + 1], ids[r:r + 1], dtype)
        np.testing.assert_array_equal(alone[0], batch[r])


@pytest.mark.parametrize("shape", [(64, 8, 40, 640, 320), (32, 4, 320, 1152, 576)],
                         ids=["swap16", "swap64"])
def test_fused_experts_token_bits_independent_of_neighbours(shape):
    """Two bf16 batches of one size (so one kernel path: on Hopper the swapped wgmma tiles) that
    share a few tokens and nothing else: those tokens' output bits are the same in both."""
    e, k, t, h, i = shape
    rng = np.random.default_rng(t + h)
    w13 = (rng.standard_normal((e, 2 * i, h)) / np.sqrt(h)).astype(np.float32)
    w2 = (rng.standard_normal((e, h, i)) / np.sqrt(i)).astype(np.float32)
    xa = rng.standard_normal((t, h)).astype(np.float32)
    twa, idsa = route(rng, t, e, k)
    xb = rng.standard_normal((t, h)).astype(np.float32)
    twb, idsb = route(rng, t, e, k)
    shared = [0, t // 2, t - 1]
    xb[shared], twb[shared], idsb[shared] = xa[shared], twa[shared], idsa[shared]
    a, _ = run_gpu(xa, w13, w2, twa, idsa, BF16)
    b, _ = run_gpu(xb, w13, w2, twb, idsb, BF16)
    np.testing.assert_array_equal(a[shared], b[shared])
    assert not np.array_equal(a[1], b[1])  # the other rows did differ


def test_fused_experts_bad_arguments_name_the_problem():
    x = DeviceArray.empty((3, 64), BF16)
    out = DeviceArray.empty((3, 64), BF16)
    w13 = DeviceArray.empty((8, 64, 64), BF16)
    w2 = DeviceArray.empty((8, 64, 32), BF16)
    tw = DeviceArray.empty((3, 2), F32)
    ids = DeviceArray.from_numpy(np.zeros((3, 2), np.int32))
    with pytest.raises(Exception, match="activation"):
        _C.ops.fused_experts(out, x, w13, w2, tw, ids, None, None, 5)
    with pytest.raises(Exception, match="w13"):
        _C.ops.fused_experts(out, x, DeviceArray.empty((8, 64, 64), F16), w2, tw, ids, None,
                             None, 0)
    with pytest.raises(Exception, match="topk_weights"):
        _C.ops.fused_experts(out, x, w13, w2, DeviceArray.empty((3, 3), F32), ids, None, None,
                             0)


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_expert_parallel_remap_and_skip(dtype):
    """remap_expert_ids on the device equals the CPU's, and fused_experts over one rank's half
    of the experts with the others' pairs at -1 adds nothing for those: the float64 reference
    of the rank's pairs alone."""
    rng = np.random.default_rng(7)
    e, k, t, h, i = 16, 4, 37, 96, 48
    x = rng.standard_normal((t, h)).astype(np.float32)
    w13 = (rng.standard_normal((e // 2, 2 * i, h)) / np.sqrt(h)).astype(np.float32)
    w2 = (rng.standard_normal((e // 2, h, i)) / np.sqrt(i)).astype(np.float32)
    tw, ids = route(rng, t, e, k)
    d_ids = DeviceArray.from_numpy(ids)
    _C.ops.remap_expert_ids(d_ids, 8, 8)
    local = ids.copy()
    _C.ops.remap_expert_ids(local, 8, 8)
    assert np.array_equal(d_ids.numpy(), local)
    got, _ = run_gpu(x, w13, w2, tw, local, dtype)
    mine = local >= 0
    ref = experts64(rounded(x, dtype).astype(np.float64), rounded(w13, dtype).astype(np.float64),
                    rounded(w2, dtype).astype(np.float64),
                    np.where(mine, tw, 0).astype(np.float64), np.where(mine, local, 0))
    assert np.abs(got - ref).max() / np.abs(ref).max() < TOL[dtype]
