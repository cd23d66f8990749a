"""F32 weights in panels of 16 rows (F32_X16, csrc/repack/repack.h): the layout re-derived in
numpy; linear over them against float64 and, bit for bit, against the scalar twin; a row's
output the same in any batch; ops.repack_weight and Linear's use of it."""
import numpy as np
import pytest

from vllmx import _C, ops
from vllmx.layers.linear import Linear

F32 = 0
F32_X16 = _C.packed_dtype(F32, False)


def repacked(w):
    out = np.full_like(w, np.nan)
    _C.ops.repack_weight((out, F32_X16), w)
    return out


def test_dtype():
    assert _C.type_info(F32_X16) == ("F32_X16", 1, 4, False, True)


@pytest.mark.parametrize("n,k", [(16, 1), (37, 100), (48, 7), (203, 384)])
def test_layout_matches_spec(n, k):
    w = np.random.default_rng([n, k]).standard_normal((n, k)).astype(np.float32)
    out = repacked(w)
    panels = n // 16
    for p in range(panels):  # for each k, the panel's 16 rows' k-th elements
        assert np.array_equal(out[16 * p:16 * (p + 1)].reshape(-1),
                              w[16 * p:16 * (p + 1)].T.reshape(-1))
    assert np.array_equal(out[16 * panels:], w[16 * panels:])  # tail rows as stored


@pytest.mark.parametrize("n,k", [(16, 1), (37, 100), (48, 7), (203, 384), (64, 1536)])
def test_linear_over_panels(n, k):
    rng = np.random.default_rng([n, k, 1])
    w = rng.standard_normal((n, k)).astype(np.float32)
    wp = repacked(w)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((13, k)).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64).T + b
    rows = {}
    for t in (1, 5, 6, 7, 13):
        for reference in (False, True):
            out = np.full((t, n), np.nan, np.float32)
            _C.ops.linear(out, x[:t], (wp, F32_X16), b, reference=reference)
            assert np.abs(out - want[:t]).max() <= 1e-5 * np.abs(want).max()
            rows[t, reference] = out[0]
    # Row 0 is the same in any batch; on the panels the SIMD kernel equals its scalar twin bit
    # for bit (the tail rows run the row-wise kernels, whose twin sums in another order).
    p = n // 16 * 16
    assert all(np.array_equal(r, rows[1, False]) for (t, ref), r in rows.items() if not ref)
    assert all(np.array_equal(r[:p], rows[1, False][:p]) for r in rows.values())


def test_ops_repack_weight_and_linear():
    rng = np.random.default_rng(2)
    w = ops.Weight.from_numpy(rng.standard_normal((40, 96)).astype(np.float32))
    p = ops.repack_weight(w)
    lin = Linear(w)
    if _C.packed_dtype(F32) < 0:  # no AVX-512 panel kernel here: rows as they are
        assert p is w and lin.weight.dtype == F32
        return
    assert p.dtype == F32_X16 and p.shape == w.shape and p.data.ctypes.data % 64 == 0
    assert np.array_equal(p.data, repacked(w.data))
    assert lin.weight.dtype == F32_X16
    small = ops.Weight.from_numpy(rng.standard_normal((15, 96)).astype(np.float32))
    assert ops.repack_weight(small) is small  # no whole panel
    x = rng.standard_normal((3, 96)).astype(np.float32)
    want = x.astype(np.float64) @ w.data.astype(np.float64).T
    assert np.abs(lin(x) - want).max() < 1e-5 * np.abs(want).max()


def test_stacked_f32_experts_stay_rows():
    w = ops.Weight.from_numpy(np.ones((2, 32, 16), np.float32))
    assert ops.repack_experts(w) is w
