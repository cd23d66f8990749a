"""topk_softmax (MoE routing) against a float64 reference on fresh random router logits: the
k most probable experts (ties to the lower id), their softmax weights, renormalized or not."""
import numpy as np
import pytest

from vllmx import _C


def reference(g: np.ndarray, k: int, renormalize: bool):
    g64 = g.astype(np.float64)
    p = np.exp(g64 - g64.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ids = np.argsort(-g64, axis=1, kind="stable")[:, :k]  # stable: lower id first on ties
    w = np.take_along_axis(p, ids, 1)
    if renormalize:
        w /= w.sum(1, keepdims=True)
    return w, ids.astype(np.int32)


def route(g: np.ndarray, k: int, renormalize: bool, reference_twin: bool = False):
    w = np.full((g.shape[0], k), np.nan, np.float32)
    ids = np.full((g.shape[0], k), -1, np.int32)
    _C.ops.topk_softmax(w, ids, g, renormalize, reference=reference_twin)
    return w, ids


@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("shape", [(1, 8, 2), (37, 64, 6), (5, 128, 8), (300, 60, 4), (3, 7, 7)])
def test_matches_float64_reference(shape, renormalize, twin):
    t, e, k = shape
    rng = np.random.default_rng(t * 1000 + e + k)
    g = (rng.standard_normal((t, e)) * 3).astype(np.float32)
    w, ids = route(g, k, renormalize, twin)
    w_ref, ids_ref = reference(g, k, renormalize)
    np.testing.assert_array_equal(ids, ids_ref)
    assert np.abs(w - w_ref).max() < 1e-6
    if renormalize:
        assert np.allclose(w.sum(1), 1.0, atol=1e-6)


def test_ties_go_to_the_lower_expert():
    g = np.array([[1.0, 3.0, 3.0, 0.5, 3.0, 2.0]], np.float32)
    for twin in (False, True):
        _, ids = route(g, 4, True, twin)
        assert ids.tolist() == [[1, 2, 4, 5]]


def test_bad_arguments_name_the_problem():
    g = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match=r"k = 9 experts per token must be in 1\.\.8"):
        _C.ops.topk_softmax(np.empty((4, 9), np.float32), np.empty((4, 9), np.int32), g, True)
    with pytest.raises(ValueError, match=r"topk_softmax: topk_ids must be I32, got I64\[4, 2\]"):
        _C.ops.topk_softmax(np.empty((4, 2), np.float32), np.empty((4, 2), np.int64), g, True)
    with pytest.raises(ValueError, match="must both be"):
        _C.ops.topk_softmax(np.empty((3, 2), np.float32), np.empty((4, 2), np.int32), g, True)
