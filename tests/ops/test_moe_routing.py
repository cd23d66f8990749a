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


# grouped_topk (DeepSeek V2/V3, GLM-4.5): softmax or sigmoid scores, an optional choice bias,
# expert groups of which the topk_group best compete, renormalization and a scaling factor.

def grouped_reference(g, k, groups, topk_group, sigmoid, renormalize, scaling, bias):
    g64 = g.astype(np.float64)
    if sigmoid:
        scores = 1 / (1 + np.exp(-g64))
    else:
        scores = np.exp(g64 - g64.max(1, keepdims=True))
        scores /= scores.sum(1, keepdims=True)
    choice = scores if bias is None else scores + bias.astype(np.float64)
    t, e = g.shape
    per_group = np.sort(choice.reshape(t, groups, e // groups), axis=-1)[..., ::-1]
    group_score = per_group[..., :2].sum(-1) if bias is not None else per_group[..., 0]
    best_groups = np.argsort(-group_score, axis=1, kind="stable")[:, :topk_group]
    allowed = np.zeros((t, groups), bool)
    np.put_along_axis(allowed, best_groups, True, 1)
    masked = np.where(np.repeat(allowed, e // groups, axis=1), choice, -np.inf)
    ids = np.argsort(-masked, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(scores, ids, 1)
    if renormalize:
        w /= w.sum(1, keepdims=True)
    return w * scaling, ids.astype(np.int32), np.argsort(-choice, axis=1, kind="stable")[:, :k]


def grouped_route(g, k, groups, topk_group, sigmoid, renormalize, scaling, bias, twin=False):
    w = np.full((g.shape[0], k), np.nan, np.float32)
    ids = np.full((g.shape[0], k), -1, np.int32)
    _C.ops.grouped_topk(w, ids, g, bias, groups, topk_group, sigmoid, renormalize, scaling,
                        reference=twin)
    return w, ids


# (T, E, k, groups, topk_group, sigmoid, bias, renormalize, scaling): DeepSeek V2's
# group_limited_greedy (softmax, group max), V3's noaux_tc (sigmoid, a bias, the two best of a
# group), GLM-4.5 (one group, a bias), V2's greedy (one group, nothing else).
ROUTINGS = [(40, 64, 6, 8, 3, False, False, False, 16.0), (33, 64, 8, 8, 4, True, True, True, 2.5),
            (17, 32, 4, 1, 1, True, True, True, 1.0), (9, 16, 2, 1, 1, False, False, False, 1.0),
            (300, 60, 4, 6, 2, True, True, False, 1.5)]


@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
@pytest.mark.parametrize("routing", ROUTINGS, ids=lambda r: f"E{r[1]}-k{r[2]}-G{r[3]}-{r[4]}")
def test_grouped_matches_float64_reference(routing, twin):
    t, e, k, groups, topk_group, sigmoid, with_bias, renorm, scaling = routing
    rng = np.random.default_rng(np.random.SeedSequence().entropy)
    g = (rng.standard_normal((t, e)) * 2).astype(np.float32)
    bias = rng.uniform(-0.3, 0.3, e).astype(np.float32) if with_bias else None
    w, ids = grouped_route(g, k, groups, topk_group, sigmoid, renorm, scaling, bias, twin)
    w_ref, ids_ref, unrestricted = grouped_reference(g, k, groups, topk_group, sigmoid, renorm,
                                                     scaling, bias)
    np.testing.assert_array_equal(ids, ids_ref)
    assert np.abs(w - w_ref).max() < 1e-6 * scaling
    if topk_group < groups:  # the groups really restrict the choice
        assert (np.sort(unrestricted, 1) != np.sort(ids_ref, 1)).any()
    if with_bias:  # and the bias really moves it
        _, ids_nobias = grouped_route(g, k, groups, topk_group, sigmoid, renorm, scaling, None)
        assert (ids_nobias != ids).any()


def test_grouped_one_group_softmax_is_topk_softmax():
    g = np.random.default_rng(7).standard_normal((50, 64)).astype(np.float32)
    for renorm in (False, True):
        w, ids = grouped_route(g, 6, 1, 1, False, renorm, 1.0, None)
        w2, ids2 = route(g, 6, renorm)
        np.testing.assert_array_equal(ids, ids2)
        assert np.abs(w - w2).max() < 1e-6


def test_grouped_bad_arguments_name_the_problem():
    g = np.zeros((4, 12), np.float32)
    w, ids = np.empty((4, 2), np.float32), np.empty((4, 2), np.int32)
    with pytest.raises(ValueError, match="num_expert_group = 5 must divide the 12 experts"):
        _C.ops.grouped_topk(w, ids, g, None, 5, 1, True, True, 1.0)
    with pytest.raises(ValueError, match="topk_group = 5 groups of 3 experts must be in 1..4"):
        _C.ops.grouped_topk(w, ids, g, None, 4, 5, True, True, 1.0)
    with pytest.raises(ValueError, match="hold the k = 8 experts"):
        _C.ops.grouped_topk(np.empty((4, 8), np.float32), np.empty((4, 8), np.int32), g, None,
                            4, 2, True, True, 1.0)
    with pytest.raises(ValueError, match=r"e_score_correction_bias F32\[11\] must be \[12\]"):
        _C.ops.grouped_topk(w, ids, g, np.zeros(11, np.float32), 4, 2, True, True, 1.0)
    with pytest.raises(ValueError, match="groups of 1 expert are too small"):
        _C.ops.grouped_topk(w, ids, g, np.zeros(12, np.float32), 12, 2, True, True, 1.0)
    with pytest.raises(ValueError, match="routed_scaling_factor must be finite and positive"):
        _C.ops.grouped_topk(w, ids, g, None, 1, 1, True, True, 0.0)
