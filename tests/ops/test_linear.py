"""linear: dense (f32/f16/bf16, f32 math), GGUF block weights (8-bit activations, integer
dots) and their repacked forms (csrc/repack/repack.h) against a float64 numpy reference; fast path vs
scalar twin; batch invariance."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from simd_levels import SIMD_LEVELS, run_capped

from vllmx import _C

BLOCK_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
DENSE_TYPES = [Q.F32, Q.F16, Q.BF16]
ALL_TYPES = DENSE_TYPES + BLOCK_TYPES


def make_weight(rng, qtype, n, k):
    """(array passed to op_linear, its exact f64 values)."""
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    w += np.float32(0.02) * rng.standard_normal((n, 1)).astype(np.float32)
    if qtype == Q.F32:
        return w, w.astype(np.float64)
    if qtype == Q.F16:
        h = w.astype(np.float16)
        return h, h.astype(np.float64)
    if qtype == Q.BF16:
        b = quants.quantize(w, Q.BF16).view(np.uint16).reshape(n, k)
        return b, (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    blocks = quants.quantize(w, qtype)
    return blocks, quants.dequantize(blocks, qtype).astype(np.float64)


def make_x(rng, t, k):
    x = rng.standard_normal((t, k)).astype(np.float32)
    x *= np.exp(rng.uniform(-1, 1, (t, 1))).astype(np.float32)
    x[rng.random((t, k)) < 0.005] *= 10  # a few outliers, like real activations
    return x


def repack(w, qtype):
    """(packed array, packed dtype id) of a block weight; the layout exists on every CPU."""
    pt = _C.packed_dtype(int(qtype), False)
    out = np.empty_like(w)
    _C.ops.repack_weight((out, _C.packed_dtype(int(qtype), False)), (w, int(qtype)))
    return out, pt


def run(x, w, qtype, bias=None, reference=False):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    _C.ops.linear(out, x, (w, int(qtype)), bias, reference=reference)
    return out


def rel(a, b):
    return np.abs(a.astype(np.float64) - b).max() / np.abs(b).max()


def frob_rel(a, b):
    return np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b)


def quantized_product(x, w, w64, qtype):
    """x @ w^T as the kernel computes it, in f64: x rounded to the 8-bit activation type the
    weight pairs with; for the *_1 types the m * sum(x) term uses the block's f16 s field."""
    xt = Q.Q8_1 if qtype in (Q.Q4_1, Q.Q5_1) else Q.Q8_0
    ts = 36 if xt == Q.Q8_1 else 34
    qb = np.empty((x.shape[0], x.shape[1] // 32 * ts), np.uint8)
    _C.ops.quantize((qb, int(xt)), x)
    blk = qb.reshape(x.shape[0], -1, ts)
    d = blk[..., 0:2].copy().view(np.float16).astype(np.float64)[..., 0]
    q = blk[..., ts - 32:].copy().view(np.int8).astype(np.float64)
    out = (d[..., None] * q).reshape(x.shape) @ w64.T
    if xt == Q.Q8_1:
        s16 = blk[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0]
        err = s16 - d * q.sum(axis=-1)  # [T, blocks]
        m = w.reshape(w.shape[0], -1, quants.GGML_QUANT_SIZES[qtype][1])[..., 2:4]
        m = m.copy().view(np.float16).astype(np.float64)[..., 0]  # [N, blocks]
        out += err @ m.T
    return out


@pytest.mark.parametrize("k", [64, 256, 2048])
@pytest.mark.parametrize("t", [1, 3, 17, 64])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda q: q.name)
def test_linear_vs_numpy(qtype, t, k):
    rng = np.random.default_rng([int(qtype), t, k])
    n = int(rng.choice([1, 7, 33, 97, 131]))
    w, w64 = make_weight(rng, qtype, n, k)
    x = make_x(rng, t, k)
    bias = rng.standard_normal(n).astype(np.float32) * np.float32(0.1)
    for b in (None, bias):
        want = x.astype(np.float64) @ w64.T + (0 if b is None else b.astype(np.float64))
        fast = run(x, w, qtype, b)
        ref = run(x, w, qtype, b, reference=True)
        if qtype in DENSE_TYPES:
            assert rel(fast, want) < 1e-5
            assert rel(ref, want) < 1e-5
        else:
            # exact up to f32 rounding against the 8-bit activations the kernel uses ...
            want_q = quantized_product(x, w, w64, qtype) + (0 if b is None else b.astype(np.float64))
            assert rel(fast, want_q) < 1e-5
            assert rel(ref, want_q) < 1e-5
            # ... and within the activation-quantization error of the exact product
            assert frob_rel(fast, want) < 3e-2
        assert rel(fast, ref.astype(np.float64)) < 1e-5


@pytest.mark.parametrize("k", [64, 576])
@pytest.mark.parametrize("t", [1, 3, 17, 64])
@pytest.mark.parametrize("n", [7, 16, 37, 96, 203])
@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_linear_packed_vs_numpy(qtype, n, t, k):
    """Packed weights (panels of 16 rows + tail rows in block layout) give the block weights'
    results up to f32 rounding; the packed kernel equals its scalar twin bit for bit."""
    rng = np.random.default_rng([int(qtype), n, t, k, 7])
    w, w64 = make_weight(rng, qtype, n, k)
    wp, pt = repack(w, qtype)
    x = make_x(rng, t, k)
    bias = rng.standard_normal(n).astype(np.float32) * np.float32(0.1)
    full = n // 16 * 16
    for b in (None, bias):
        want_q = quantized_product(x, w, w64, qtype) + (0 if b is None else b.astype(np.float64))
        fast = run(x, wp, pt, b)
        ref = run(x, wp, pt, b, reference=True)
        assert rel(fast, want_q) < 1e-5
        assert rel(ref, want_q) < 1e-5
        assert np.array_equal(fast[:, :full].view(np.uint32), ref[:, :full].view(np.uint32))
        # the tail rows run the block kernels: exactly what the unpacked weight gives
        assert np.array_equal(fast[:, full:], run(x, w, qtype, b)[:, full:])


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda q: q.name)
def test_linear_dense_k_tails(qtype):
    """K not a multiple of the SIMD width (dense) / odd block counts (blocks)."""
    rng = np.random.default_rng(int(qtype) + 50)
    ks = [1, 5, 15, 16, 17, 31, 33, 47, 100] if qtype in DENSE_TYPES else [32, 96, 160, 224]
    for k in ks:
        w, w64 = make_weight(rng, qtype, 9, k)
        x = make_x(rng, 4, k)
        want = x.astype(np.float64) @ w64.T
        if qtype in DENSE_TYPES:
            assert rel(run(x, w, qtype), want) < 1e-5
        else:
            assert rel(run(x, w, qtype), quantized_product(x, w, w64, qtype)) < 1e-5
            assert frob_rel(run(x, w, qtype), want) < 3e-2
        assert rel(run(x, w, qtype), run(x, w, qtype, reference=True).astype(np.float64)) < 1e-5


@pytest.mark.parametrize("qtype,packed", [pytest.param(q, False, id=q.name) for q in ALL_TYPES] +
                         [pytest.param(q, True, id=q.name + "_X16") for q in BLOCK_TYPES])
def test_batch_invariance(qtype, packed):
    """Row t of a batched call equals that row computed alone, bit for bit (threaded sizes)."""
    rng = np.random.default_rng(int(qtype) + 200)
    n, k = 515, 2048
    w, _ = make_weight(rng, qtype, n, k)
    if packed:
        w, qtype = repack(w, qtype)
    bias = rng.standard_normal(n).astype(np.float32)
    x = make_x(rng, 17, k)
    full = run(x, w, qtype, bias)
    for t in range(17):
        alone = run(x[t:t + 1].copy(), w, qtype, bias)
        assert np.array_equal(full[t].view(np.uint32), alone[0].view(np.uint32)), t
    # the same rows at other positions of a bigger batch
    big = make_x(rng, 64, k)
    big[40:57] = x
    out = run(big, w, qtype, bias)
    assert np.array_equal(out[40:57].view(np.uint32), full.view(np.uint32))
    # the reference twin is batch invariant too
    r_full = run(x[:3], w, qtype, bias, reference=True)
    r_one = run(x[2:3].copy(), w, qtype, bias, reference=True)
    assert np.array_equal(r_full[2].view(np.uint32), r_one[0].view(np.uint32))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_packed_batch_invariance_across_t(qtype):
    """A row's output is the same bit for bit whatever T (1, 3, 17, 64) and whichever row it
    is in, for panel and tail rows (n = 16 * 12 + 5), threaded and not."""
    rng = np.random.default_rng(int(qtype) + 300)
    n, k = 16 * 12 + 5, 1536
    w, _ = make_weight(rng, qtype, n, k)
    wp, pt = repack(w, qtype)
    bias = rng.standard_normal(n).astype(np.float32)
    x = make_x(rng, 64, k)
    full = run(x, wp, pt, bias)
    for t in (1, 3, 17):
        for start in (0, 64 - t, 5):
            part = run(x[start:start + t].copy(), wp, pt, bias)
            assert np.array_equal(part.view(np.uint32), full[start:start + t].view(np.uint32))


_ISA_SCRIPT = r"""
import numpy as np, sys
from gguf import GGMLQuantizationType as Q, quants
from vllmx import _C
rng = np.random.default_rng(5)
PACKED = [(q, _C.packed_dtype(int(q), False)) for q in [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]]
for qt in [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0] + PACKED:
    qt, pt = qt if isinstance(qt, tuple) else (qt, None)
    for n, k, t in [(37, 2080, 5), (300, 1024, 1), (5, 96, 9)]:
        w32 = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        if qt == Q.F32: w = w32
        elif qt == Q.F16: w = w32.astype(np.float16)
        elif qt == Q.BF16: w = (w32.view(np.uint32) >> 16).astype(np.uint16)
        else: w = quants.quantize(w32, qt)
        dt = qt
        if pt is not None:
            wp = np.empty_like(w); _C.ops.repack_weight((wp, _C.packed_dtype(int(qt), False)),
                                                        (w, int(qt))); w, dt = wp, pt
        x = rng.standard_normal((t, k)).astype(np.float32)
        outs = []
        for ref in (False, True):
            o = np.empty((t, n), np.float32)
            _C.ops.linear(o, x, (w, int(dt)), None, reference=ref)
            outs.append(o)
        err = np.abs(outs[0] - outs[1]).max() / np.abs(outs[1]).max()
        assert err < 1e-5, (int(dt), n, k, t, err)
        if pt is not None:  # the packed kernel and its twin agree bit for bit (panel rows)
            f = n // 16 * 16
            assert np.array_equal(outs[0][:, :f], outs[1][:, :f]), (int(dt), "packed twin")
        o1 = np.empty((1, n), np.float32)
        _C.ops.linear(o1, x[t - 1:].copy(), (w, int(dt)), None, reference=False)
        assert np.array_equal(o1[0], outs[0][t - 1]), (int(dt), "batch invariance")
for qt, ts in [(Q.Q8_0, 34), (Q.Q8_1, 36)]:
    x = rng.standard_normal((7, 256)).astype(np.float32) * 3
    x[0, :32] = rng.integers(-120, 120, 32) + 0.5; x[0, 0] = 127  # exact .5 ties (d = 1)
    a = np.empty((7, 8 * ts), np.uint8); b = a.copy()
    _C.ops.quantize((a, int(qt)), x,
                    reference=False); _C.ops.quantize((b, int(qt)), x, reference=True)
    assert np.array_equal(a, b), qt.name
print("ok")
"""


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_simd_paths(isa):
    """Each SIMD level (capped with VLLMX_ISA) agrees with the scalar twin."""
    r = run_capped(isa, _ISA_SCRIPT)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_bad_args_raise():
    rng = np.random.default_rng(9)
    x = make_x(rng, 3, 64)
    w, _ = make_weight(rng, Q.Q4_0, 32, 96)
    with pytest.raises(ValueError, match=r"linear: x F32\[3, 64\] and w Q4_0\[32, 96\] disagree on K"):
        run(x, w, Q.Q4_0)
    w, _ = make_weight(rng, Q.F32, 8, 64)
    with pytest.raises(ValueError, match="linear: out"):
        _C.ops.linear(np.empty((3, 9), np.float32), x, w)
    with pytest.raises(ValueError, match="linear: out"):
        _C.ops.linear(np.empty((2, 8), np.float32), x, w)
    with pytest.raises(ValueError, match="linear: bias"):
        _C.ops.linear(np.empty((3, 8), np.float32), x, w, np.ones(7, np.float32))
    with pytest.raises(ValueError, match="linear: bias"):
        _C.ops.linear(np.empty((3, 8), np.float32), x, w, np.ones(8, np.float16))
    with pytest.raises(ValueError, match="linear: x"):
        _C.ops.linear(np.empty((3, 8), np.float32), x.astype(np.float16), w)
    with pytest.raises(ValueError, match="linear: x"):
        _C.ops.linear(np.empty((3, 8), np.float32), x[0].copy(), w)
    with pytest.raises(ValueError, match="linear: out"):
        _C.ops.linear(np.empty((3, 8), np.float16), x, w)
    with pytest.raises(ValueError, match="Q8_K"):  # an activation-only type
        _C.ops.linear(np.empty((3, 2), np.float32), make_x(rng, 3, 256),
                      (np.zeros((2, 292), np.uint8), int(Q.Q8_K)))
    with pytest.raises(ValueError, match="I32"):
        _C.ops.linear(np.empty((3, 8), np.float32), x, np.ones((8, 64), np.int32))


@pytest.mark.parametrize("qtype", [Q.F32, Q.BF16, Q.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("t", [1, 5, 33])
def test_batched_linear_groups(qtype, t):
    """batched_linear (MLA's absorbed per-head projections): each group exactly linear's result
    on that group's columns alone, and float64's within linear's bound."""
    rng = np.random.default_rng([int(qtype), t])
    g, n, k = 5, 48, 64
    mats = [make_weight(rng, qtype, n, k) for _ in range(g)]
    w = np.stack([m[0] for m in mats])
    w64 = np.stack([m[1] for m in mats])
    x = rng.standard_normal((t, g, k)).astype(np.float32)
    out = np.full((t, g, n), np.nan, np.float32)
    _C.ops.batched_linear(out, x, (w, int(qtype)))
    for j in range(g):
        assert np.array_equal(out[:, j], run(np.ascontiguousarray(x[:, j]), w[j], qtype))
        if qtype in DENSE_TYPES:
            assert rel(out[:, j], x[:, j].astype(np.float64) @ w64[j].T) < 1e-5
        else:
            assert frob_rel(out[:, j], x[:, j].astype(np.float64) @ w64[j].T) < 3e-2


def test_batched_linear_bad_shapes():
    x = np.zeros((3, 4, 8), np.float32)
    with pytest.raises(ValueError, match=r"w F32\[4, 6, 9\] must be \[G, N, K\] = \[4, N, 8\]"):
        _C.ops.batched_linear(np.zeros((3, 4, 6), np.float32), x, np.zeros((4, 6, 9), np.float32))
    with pytest.raises(ValueError, match=r"out F32\[3, 4, 5\] must be \[3, 4, 6\]"):
        _C.ops.batched_linear(np.zeros((3, 4, 5), np.float32), x, np.zeros((4, 6, 8), np.float32))
