"""Dense weights in panels of 16 rows (F32_X16, F16_X16, BF16_X16, csrc/repack/repack.h): the
layout re-derived in numpy; linear over them against float64 and, bit for bit, against the
scalar twin; a row's output the same in any batch; ops.repack_weight and Linear's use of it."""
import numpy as np
import pytest

from vllmx import _C, ops
from vllmx.layers.linear import Linear

F32, F16, BF16 = 0, 1, 30
DENSE = {F32: np.float32, F16: np.float16, BF16: np.uint16}


def weight(rng, n, k, dt):
    """(stored array, its exact values in f64) of a random [n, k] weight of dtype dt."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    if dt == BF16:
        bits = (w.view(np.uint32) >> 16).astype(np.uint16)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    w = w.astype(DENSE[dt])
    return w, w.astype(np.float64)


def repacked(w, dt):
    out = np.zeros_like(w)
    _C.ops.repack_weight((out, _C.packed_dtype(dt, False)), (w, dt))
    return out


@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_dtypes(dt):
    name, bs, ts, quantized, supported = _C.type_info(_C.packed_dtype(dt, False))
    assert (name, bs, ts, quantized, supported) == (_C.type_info(dt)[0] + "_X16", 1,
                                                   _C.type_info(dt)[2], False, True)


@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("n,k", [(16, 1), (37, 100), (48, 7), (203, 384)])
def test_layout_matches_spec(dt, n, k):
    w, _ = weight(np.random.default_rng([n, k]), n, k, dt)
    out = repacked(w, dt)
    panels = n // 16
    for p in range(panels):  # for each k, the panel's 16 rows' k-th elements
        assert np.array_equal(out[16 * p:16 * (p + 1)].reshape(-1),
                              w[16 * p:16 * (p + 1)].T.reshape(-1))
    assert np.array_equal(out[16 * panels:], w[16 * panels:])  # tail rows as stored


@pytest.mark.parametrize("dt", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("n,k", [(16, 1), (37, 100), (48, 7), (203, 384), (64, 1536)])
def test_linear_over_panels(dt, n, k):
    rng = np.random.default_rng([n, k, 1])
    w, w64 = weight(rng, n, k, dt)
    wp = repacked(w, dt)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((13, k)).astype(np.float32)
    want = x.astype(np.float64) @ w64.T + b
    rows = {}
    for t in (1, 5, 6, 7, 13):
        for reference in (False, True):
            out = np.full((t, n), np.nan, np.float32)
            _C.ops.linear(out, x[:t], (wp, _C.packed_dtype(dt, False)), b, reference=reference)
            assert np.abs(out - want[:t]).max() <= 1e-5 * np.abs(want).max()
            rows[t, reference] = out[0]
    # Row 0 is the same in any batch; on the panels the SIMD kernel equals its scalar twin bit
    # for bit (the tail rows run the row-wise kernels, whose twin sums in another order).
    p = n // 16 * 16
    assert all(np.array_equal(r, rows[1, False]) for (t, ref), r in rows.items() if not ref)
    assert all(np.array_equal(r[:p], rows[1, False][:p]) for r in rows.values())


@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
def test_ops_repack_weight_and_linear(dt):
    rng = np.random.default_rng(2)
    wa, w64 = weight(rng, 40, 96, dt)
    w = ops.Weight(wa, dt, (40, 96))
    p = ops.repack_weight(w)
    lin = Linear(w)
    if _C.packed_dtype(dt) < 0:  # no AVX-512 panel kernel here: rows as they are
        assert p is w and lin.weight.dtype == dt
        return
    packed = _C.packed_dtype(dt)
    assert p.dtype == packed and p.shape == w.shape and p.data.ctypes.data % 64 == 0
    assert np.array_equal(p.data, repacked(wa, dt))
    assert lin.weight.dtype == packed
    small = ops.Weight(weight(rng, 15, 96, dt)[0], dt, (15, 96))
    assert ops.repack_weight(small) is small  # no whole panel
    x = rng.standard_normal((3, 96)).astype(np.float32)
    want = x.astype(np.float64) @ w64.T
    assert np.abs(lin(x) - want).max() < 1e-5 * np.abs(want).max()


def test_stacked_dense_experts_stay_rows():
    for a in (np.ones((2, 32, 16), np.float32), np.ones((2, 32, 16), np.float16)):
        w = ops.Weight.from_numpy(a)
        assert ops.repack_experts(w) is w
