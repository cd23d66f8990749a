"""fused_experts (MoE with SwiGLU experts) against a float64 numpy reference on fresh random
inputs: dense experts (f32/f16/bf16) within f32 rounding; GGUF block experts (plain and
repacked) bit for bit equal to the same tokens run through the linear op one at a time, and
within the activation quantization's error of the f64 product; experts that get no token;
batch invariance; the contract's errors."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from vllmx import _C, ops


def make_experts(rng, qtype, e, n, k):
    """(stacked weight [e, n, k] as the op takes it, its exact f64 values)."""
    w = (rng.standard_normal((e, n, k)) / np.sqrt(k)).astype(np.float32)
    if qtype == Q.F32:
        return w, w.astype(np.float64)
    if qtype == Q.F16:
        h = w.astype(np.float16)
        return h, h.astype(np.float64)
    if qtype == Q.BF16:
        b = quants.quantize(w.reshape(e * n, k), Q.BF16).view(np.uint16).reshape(e, n, k)
        return b, (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    blocks = ops.quantize_weight(w.reshape(e * n, k), int(qtype))  # gguf lacks the k-quants
    w64 = quants.dequantize(blocks, qtype).astype(np.float64).reshape(e, n, k)
    return blocks.reshape(e, n, -1), w64


def route(rng, t, e, k, used=None):
    """Random distinct experts per token (from `used` if given) and positive weights."""
    pool = np.arange(e) if used is None else np.asarray(used)
    ids = np.stack([rng.choice(pool, k, replace=False) for _ in range(t)]).astype(np.int32)
    w = rng.uniform(0.05, 1.0, (t, k)).astype(np.float32)
    return w, ids


def reference(x, w13, w2, tw, ids):
    x64 = x.astype(np.float64)
    inter = w13.shape[1] // 2
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            gu = w13[e] @ x64[t]
            g, u = gu[:inter], gu[inter:]
            out[t] += tw[t, j] * (w2[e] @ (g / (1.0 + np.exp(-g)) * u))
    return out


def run(x, w13, w2, dt13, dt2, tw, ids, reference_twin=False):
    out = np.full(x.shape, np.nan, np.float32)
    _C.ops.fused_experts(out, x, (w13, int(dt13)), (w2, int(dt2)), tw, ids,
                         reference=reference_twin)
    return out


def rel(a, b):
    return np.abs(a.astype(np.float64) - b).max() / np.abs(b).max()


# (experts, top-k, tokens): some experts get no token (T * k < E, or routing to a subset).
SHAPES = [(8, 2, 1), (8, 2, 3), (16, 4, 37), (64, 8, 5), (8, 8, 9), (32, 2, 100)]


@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda q: q.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "E{}k{}T{}".format(*s))
def test_dense_vs_float64(shape, qtype, twin):
    e, k, t = shape
    rng = np.random.default_rng()
    h, inter = 64, 48
    w13, w13_64 = make_experts(rng, qtype, e, 2 * inter, h)
    w2, w2_64 = make_experts(rng, qtype, e, h, inter)
    x = rng.standard_normal((t, h)).astype(np.float32)
    # every other shape routes to half the experts only, so some stay idle
    used = None if t % 2 == 0 or k > e // 2 else rng.choice(e, e // 2, replace=False)
    tw, ids = route(rng, t, e, k, used)
    out = run(x, w13, w2, qtype, qtype, tw, ids, twin)
    assert rel(out, reference(x, w13_64, w2_64, tw, ids)) < 1e-5


def linear(x, w, dt):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    _C.ops.linear(out, x, (np.ascontiguousarray(w), int(dt)), None)
    return out


def one_token_at_a_time(x, w13, w2, dt13, dt2, tw, ids):
    """The experts through the linear op, one (token, rank) at a time, summed in rank order."""
    out = np.empty(x.shape, np.float32)
    inter = w13.shape[1] // 2
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            gu = linear(x[t:t + 1], w13[e], dt13)
            act = np.empty((1, inter), np.float32)
            _C.ops.silu_and_mul(act, gu)
            y = tw[t, j] * linear(act, w2[e], dt2)[0]
            out[t] = y if j == 0 else out[t] + y
    return out


def repack_experts(w, qtype):
    pt = _C.packed_dtype(int(qtype), False)
    out = np.empty_like(w)
    for e in range(w.shape[0]):
        _C.ops.repack_weight((out[e], pt), (w[e], int(qtype)))
    return out, pt


@pytest.mark.parametrize("packed", [False, True], ids=["blocks", "x16"])
@pytest.mark.parametrize("qtypes", [(Q.Q8_0, Q.Q8_0), (Q.Q4_0, Q.Q4_1), (Q.Q4_K, Q.Q6_K),
                                    (Q.Q5_K, Q.Q8_0)], ids=lambda q: f"{q[0].name}-{q[1].name}")
def test_quantized_experts(qtypes, packed):
    q13, q2 = qtypes
    rng = np.random.default_rng()
    e, k, t, h, inter = 8, 2, 19, 256, 256
    w13, w13_64 = make_experts(rng, q13, e, 2 * inter, h)
    w2, w2_64 = make_experts(rng, q2, e, h, inter)
    dt13, dt2 = q13, q2
    if packed:
        w13, dt13 = repack_experts(w13, q13)
        w2, dt2 = repack_experts(w2, q2)
    x = rng.standard_normal((t, h)).astype(np.float32)
    tw, ids = route(rng, t, e, k, used=[0, 2, 3, 5, 6])
    out = run(x, w13, w2, dt13, dt2, tw, ids)
    assert np.array_equal(out, one_token_at_a_time(x, w13, w2, dt13, dt2, tw, ids))
    want = reference(x, w13_64, w2_64, tw, ids)
    assert np.linalg.norm(out - want) / np.linalg.norm(want) < 3e-2
    # The scalar twin: the intermediate activations it quantizes to 8 bits land on the other
    # side of a rounding step now and then, and the step reaches the output through w2 (over
    # 240 random runs: up to 1e-3 max. relative, 4e-4 in norm); a wrong expert or weight is O(1).
    twin = run(x, w13, w2, dt13, dt2, tw, ids, reference_twin=True)
    assert np.linalg.norm(out - twin) / np.linalg.norm(twin) < 2e-3


@pytest.mark.parametrize("qtype", [Q.F32, Q.BF16, Q.Q4_K], ids=lambda q: q.name)
def test_batch_invariance(qtype):
    """A token's output is bit-identical alone, at another row of a bigger batch, and beside
    other tokens that share or avoid its experts (threaded sizes: H = 1024, 64 tokens)."""
    rng = np.random.default_rng()
    e, k, h, inter = 16, 4, 1024, 512
    w13, _ = make_experts(rng, qtype, e, 2 * inter, h)
    w2, _ = make_experts(rng, qtype, e, h, inter)
    x = rng.standard_normal((64, h)).astype(np.float32)
    tw, ids = route(rng, 64, e, k)
    full = run(x, w13, w2, qtype, qtype, tw, ids)
    for t in (0, 17, 63):
        alone = run(x[t:t + 1].copy(), w13, w2, qtype, qtype, tw[t:t + 1].copy(),
                    ids[t:t + 1].copy())
        assert np.array_equal(alone[0].view(np.uint32), full[t].view(np.uint32)), t
    perm = rng.permutation(64)
    shuffled = run(x[perm], w13, w2, qtype, qtype, tw[perm], ids[perm])
    assert np.array_equal(shuffled.view(np.uint32), full[perm].view(np.uint32))


def test_empty_batch_and_rank_order():
    rng = np.random.default_rng()
    w13, _ = make_experts(rng, Q.F32, 8, 32, 16)
    w2, _ = make_experts(rng, Q.F32, 8, 16, 16)
    x = np.empty((0, 16), np.float32)
    out = run(x, w13, w2, Q.F32, Q.F32, np.empty((0, 2), np.float32), np.empty((0, 2), np.int32))
    assert out.shape == (0, 16)
    # the same expert twice in one token: twice its output, weights summed
    x = rng.standard_normal((1, 16)).astype(np.float32)
    a = run(x, w13, w2, Q.F32, Q.F32, np.array([[0.25, 0.5]], np.float32),
            np.array([[3, 3]], np.int32))
    b = run(x, w13, w2, Q.F32, Q.F32, np.array([[0.75]], np.float32), np.array([[3]], np.int32))
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_bad_arguments_name_the_problem():
    rng = np.random.default_rng()
    w13, _ = make_experts(rng, Q.F32, 8, 32, 16)
    w2, _ = make_experts(rng, Q.F32, 8, 16, 16)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    tw, ids = route(rng, 4, 8, 2)
    bad_ids = ids.copy()
    bad_ids[2, 1] = 8
    with pytest.raises(ValueError, match=r"fused_experts: topk_ids\[2, 1\] = 8 is not an expert"):
        run(x, w13, w2, Q.F32, Q.F32, tw, bad_ids)
    with pytest.raises(ValueError, match=r"fused_experts: w2 F32\[8, 16, 8\] must be \[E, H, I\]"):
        run(x, w13, w2[:, :, :8].copy(), Q.F32, Q.F32, tw, ids)
    with pytest.raises(ValueError,
                       match=r"w13 F32\[8, 32, 16\] must be \[E, 2 \* I, H\] with H = 8"):
        run(x[:, :8].copy(), w13, w2, Q.F32, Q.F32, tw, ids)
    with pytest.raises(ValueError, match=r"fused_experts: topk_ids must be I32"):
        run(x, w13, w2, Q.F32, Q.F32, tw, ids.astype(np.int64))
    with pytest.raises(ValueError, match="must both be"):
        run(x, w13, w2, Q.F32, Q.F32, tw[:3].copy(), ids)
    with pytest.raises(ValueError, match=r"k = 9 experts per token must be in 1\.\.8"):
        run(x, w13, w2, Q.F32, Q.F32, np.ones((4, 9), np.float32), np.zeros((4, 9), np.int32))


def swigluoai64(gu: np.ndarray, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    inter = gu.shape[-1] // 2
    g = np.minimum(gu[..., :inter], limit)
    u = np.clip(gu[..., inter:], -limit, limit)
    return g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)


@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
def test_swigluoai_and_mul(twin):
    """gpt-oss's clamped SwiGLU, with values on both sides of the limits."""
    x = (np.random.default_rng(np.random.SeedSequence().entropy).standard_normal((9, 96))
         * 6).astype(np.float32)
    assert (np.abs(x) > 7).any()
    out = np.full((9, 48), np.nan, np.float32)
    _C.ops.swigluoai_and_mul(out, x, 1.702, 7.0, reference=twin)
    want = swigluoai64(x.astype(np.float64))
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-6


@pytest.mark.parametrize("qtype", [Q.F32, Q.BF16, Q.Q8_0], ids=lambda q: q.name)
def test_biases_and_swigluoai(qtype):
    """gpt-oss's experts: biases on both projections and the clamped SwiGLU, against float64."""
    rng = np.random.default_rng(np.random.SeedSequence().entropy)
    e, h, inter, t, k = 8, 64, 32, 21, 3
    w13, w13_64 = make_experts(rng, qtype, e, 2 * inter, h)
    w2, w2_64 = make_experts(rng, qtype, e, h, inter)
    b13 = rng.standard_normal((e, 2 * inter)).astype(np.float32)
    b2 = rng.standard_normal((e, h)).astype(np.float32)
    x = (rng.standard_normal((t, h)) * 4).astype(np.float32)
    tw, ids = route(rng, t, e, k)
    want = np.zeros((t, h))
    for i in range(t):
        for j in range(k):
            ex = ids[i, j]
            gu = w13_64[ex] @ x[i].astype(np.float64) + b13[ex]
            want[i] += tw[i, j] * (w2_64[ex] @ swigluoai64(gu) + b2[ex])
    got = ops.fused_experts(x, ops.Weight(w13, int(qtype), (e, 2 * inter, h)),
                            ops.Weight(w2, int(qtype), (e, h, inter)), tw, ids, b13, b2,
                            "swigluoai")
    tol = 1e-5 if qtype in (Q.F32, Q.BF16) else 3e-2
    assert np.abs(got - want).max() / np.abs(want).max() < tol
    plain = ops.fused_experts(x, ops.Weight(w13, int(qtype), (e, 2 * inter, h)),
                              ops.Weight(w2, int(qtype), (e, h, inter)), tw, ids)
    assert np.abs(plain - got).max() > 0.1 * np.abs(want).max()
    with pytest.raises(ValueError, match=r"w2_bias F32\[8, 63\] must be \[8, 64\]"):
        ops.fused_experts(x, ops.Weight(w13, int(qtype), (e, 2 * inter, h)),
                          ops.Weight(w2, int(qtype), (e, h, inter)), tw, ids, b13,
                          np.ascontiguousarray(b2[:, :63]))


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_relu2_experts_without_gate(qtype):
    """Nemotron-H's experts: up_proj alone ([E, I, H]), relu(x)^2, down_proj."""
    rng = np.random.default_rng(np.random.SeedSequence().entropy)
    e, h, inter, t, k = 8, 64, 64, 19, 3
    w1, w1_64 = make_experts(rng, qtype, e, inter, h)
    w2, w2_64 = make_experts(rng, qtype, e, h, inter)
    x = rng.standard_normal((t, h)).astype(np.float32)
    tw, ids = route(rng, t, e, k)
    want = np.zeros((t, h))
    for i in range(t):
        for j in range(k):
            u = np.maximum(w1_64[ids[i, j]] @ x[i].astype(np.float64), 0)
            want[i] += tw[i, j] * (w2_64[ids[i, j]] @ (u * u))
    got = ops.fused_experts(x, ops.Weight(w1, int(qtype), (e, inter, h)),
                            ops.Weight(w2, int(qtype), (e, h, inter)), tw, ids,
                            activation="relu2")
    tol = 1e-5 if qtype == Q.F32 else 3e-2
    assert np.abs(got - want).max() / np.abs(want).max() < tol
    x2 = rng.standard_normal((4, 10)).astype(np.float32)
    assert np.array_equal(ops.relu2(x2), np.maximum(x2, 0) ** 2)


@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
def test_expert_parallel_ranks_sum_to_the_whole(twin):
    """Expert parallelism: remap_expert_ids gives each rank's local ids (-1: another rank's),
    fused_experts skips the -1 pairs, and the ranks' outputs over their experts add up to the
    float64 reference over all of them."""
    rng = np.random.default_rng()
    e, n, h, t, k = 8, 24, 16, 9, 3
    w13, w13_64 = make_experts(rng, Q.F32, e, 2 * n, h)
    w2, w2_64 = make_experts(rng, Q.F32, e, h, n)
    x = rng.standard_normal((t, h)).astype(np.float32)
    tw, ids = route(rng, t, e, k)
    total = np.zeros((t, h), np.float64)
    for first in (0, 4):
        local = ops.remap_expert_ids(ids.copy(), first, 4)
        mine = (ids >= first) & (ids < first + 4)
        assert np.array_equal(local, np.where(mine, ids - first, -1))
        total += run(x, w13[first:first + 4].copy(), w2[first:first + 4].copy(), Q.F32, Q.F32,
                     tw, local, reference_twin=twin)
    assert rel(total.astype(np.float32), reference(x, w13_64, w2_64, tw, ids)) < 1e-5
    with pytest.raises(ValueError, match=r"topk_ids\[0, 0\] = -2 is not an expert"):
        run(x, w13, w2, Q.F32, Q.F32, tw, np.full((t, k), -2, np.int32))
