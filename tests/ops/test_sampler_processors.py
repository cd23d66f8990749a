"""apply_logits_processors (allowed ids, bad words, logit bias / bans, penalties) and
compute_logprobs (token logprob, rank, top-k) against float64 numpy references, fast path and
scalar twin."""
import numpy as np
import pytest

from vllmx import _C


def csr(rows, dtype=np.int32):
    indptr = np.zeros(len(rows) + 1, np.int32)
    indptr[1:] = np.cumsum([len(r) for r in rows])
    flat = np.concatenate([np.asarray(r, dtype) for r in rows]) if rows else np.zeros(0, dtype)
    return indptr, np.ascontiguousarray(flat, dtype)


def make_batch(rng, B, V):
    """Random per-row settings: prompt / output tokens, allowed ids, bad words, bias, bans,
    penalties (each present in some rows only)."""
    rows = []
    for b in range(B):
        r = dict(prompt=rng.integers(0, V, rng.integers(1, 30)).tolist(),
                 output=rng.integers(0, V // 4, rng.integers(0, 40)).tolist(),
                 allowed=[], words=[], bias={}, ban=[], rep=1.0, freq=0.0, pres=0.0)
        if b % 3 == 0:
            r["allowed"] = rng.choice(V, rng.integers(1, 50), replace=False).tolist()
        if b % 4 == 1:
            words = [[int(rng.integers(V))]]  # single token: always banned
            if len(r["output"]) >= 2:
                words.append(r["output"][-2:] + [int(rng.integers(V))])  # prefix matches
                words.append([r["output"][-1] + 1 if r["output"][-1] + 1 < V else 0,
                              int(rng.integers(V))])  # prefix does not match
            r["words"] = words
        if b % 2 == 0:
            ids = rng.choice(V, 10, replace=False)
            r["bias"] = {int(t): float(v) for t, v in zip(ids, rng.uniform(-100, 100, 10))}
        if b % 5 == 2:
            r["ban"] = rng.choice(V, 3, replace=False).tolist()
        if b % 3 != 1:
            r["rep"] = float(rng.choice([0.5, 1.0, 1.3, 2.0]))
            r["freq"] = float(rng.uniform(-2, 2))
            r["pres"] = float(rng.uniform(-2, 2))
        rows.append(r)
    return rows


def op_args(rows):
    a = {}
    a["allowed_indptr"], a["allowed_ids"] = csr([r["allowed"] for r in rows])
    a["bad_words_indptr"] = csr([[0] * len(r["words"]) for r in rows])[0]
    a["bad_word_token_indptr"], a["bad_word_tokens"] = csr([w for r in rows for w in r["words"]])
    a["output_tail_indptr"], a["output_tail"] = csr([r["output"][-5:] for r in rows])
    a["bias_indptr"], a["bias_ids"] = csr([list(r["bias"]) + r["ban"] for r in rows])
    a["bias_values"] = csr([list(r["bias"].values()) + [-np.inf] * len(r["ban"]) for r in rows],
                           np.float32)[1]
    pen = []
    for r in rows:
        seen = list(dict.fromkeys(r["prompt"] + r["output"]))
        pen.append((seen, [r["output"].count(t) for t in seen]))
    a["penalty_indptr"], a["penalty_ids"] = csr([p[0] for p in pen])
    a["output_counts"] = csr([p[1] for p in pen])[1]
    for k in ("rep", "freq", "pres"):
        a[{"rep": "repetition_penalty", "freq": "frequency_penalty",
           "pres": "presence_penalty"}[k]] = np.array([r[k] for r in rows], np.float32)
    return a


def reference(logits, rows):
    """vLLM's Sampler.apply_logits_processors + apply_penalties, in float64."""
    x = logits.astype(np.float64)
    V = x.shape[1]
    for b, r in enumerate(rows):
        if r["allowed"]:
            mask = np.ones(V, bool)
            mask[r["allowed"]] = False
            x[b, mask] = -np.inf
        for w in r["words"]:
            prefix = w[:-1]
            if len(prefix) <= len(r["output"]) and (
                    not prefix or r["output"][-len(prefix):] == prefix):
                x[b, w[-1]] = -np.inf
        for t, v in r["bias"].items():
            x[b, t] += np.float32(v)
        x[b, r["ban"]] = -np.inf
        counts = np.bincount(r["output"], minlength=V)
        seen = np.zeros(V, bool)
        seen[r["prompt"] + r["output"]] = True
        rp = np.float32(r["rep"])
        x[b] = np.where(seen, np.where(x[b] > 0, x[b] / rp, x[b] * rp), x[b])
        x[b] -= np.float32(r["freq"]) * counts + np.float32(r["pres"]) * (counts > 0)
    return x


@pytest.mark.parametrize("ref", [False, True])
def test_processors_match_numpy(ref):
    rng = np.random.default_rng(10)
    B, V = 24, 3000
    rows = make_batch(rng, B, V)
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    expect = reference(logits, rows)
    got = logits.copy()
    _C.ops.apply_logits_processors(got, **op_args(rows), reference=ref)
    fin = np.isfinite(expect)
    np.testing.assert_array_equal(np.isfinite(got), fin)
    np.testing.assert_array_equal(got[~fin], expect[~fin])  # -inf where banned / masked
    np.testing.assert_allclose(got[fin], expect[fin], rtol=1e-6, atol=1e-5)
    # Something happened in every group.
    assert (got[0] == -np.inf).sum() >= V - 50  # allowed mask on row 0
    assert not np.allclose(got[4], logits[4])  # bias + penalties


def test_groups_are_optional_and_single_ones_work():
    rng = np.random.default_rng(11)
    B, V = 3, 50
    logits = rng.standard_normal((B, V)).astype(np.float32)
    got = logits.copy()
    _C.ops.apply_logits_processors(got)  # nothing to do
    np.testing.assert_array_equal(got, logits)
    # Repetition penalty alone: positive logits divided, negative multiplied.
    got = logits.copy()
    ip, ids = csr([[1, 2], [], [3]])
    _C.ops.apply_logits_processors(got, penalty_indptr=ip, penalty_ids=ids,
                                  output_counts=np.array([0, 2, 1], np.int32),
                                  repetition_penalty=np.full(B, 2.0, np.float32),
                                  frequency_penalty=np.full(B, 0.5, np.float32),
                                  presence_penalty=np.full(B, 0.25, np.float32))
    def rp(x):
        return x / 2 if x > 0 else x * 2
    assert got[0, 1] == np.float32(rp(logits[0, 1]))  # prompt only: no frequency / presence
    assert got[0, 2] == pytest.approx(rp(logits[0, 2]) - 1.0 - 0.25, abs=1e-6)
    assert got[2, 3] == pytest.approx(rp(logits[2, 3]) - 0.5 - 0.25, abs=1e-6)
    got[0, 1:3] = logits[0, 1:3]
    got[2, 3] = logits[2, 3]
    np.testing.assert_array_equal(got, logits)  # nothing else moved


@pytest.mark.parametrize("ref", [False, True])
def test_bad_words_prefix_rule(ref):
    V = 20
    logits = np.zeros((3, V), np.float32)
    words = [[5], [1, 2, 7], [2, 8], [9, 2, 3, 4]]  # row 0: all four; rows 1, 2: none / [2, 8]
    a = dict(bad_words_indptr=np.array([0, 4, 4, 5], np.int32))
    a["bad_word_token_indptr"], a["bad_word_tokens"] = csr(words + [[2, 8]])
    a["output_tail_indptr"], a["output_tail"] = csr([[0, 1, 2], [1, 2], []])
    _C.ops.apply_logits_processors(logits, **a, reference=ref)
    assert set(np.flatnonzero(logits[0] == -np.inf)) == {5, 7, 8}  # [9,2,3,4]: prefix differs
    assert not np.isinf(logits[1]).any()
    assert not np.isinf(logits[2]).any()  # output too short for the prefix [2]


def test_processor_bad_inputs():
    B, V = 2, 10
    logits = np.zeros((B, V), np.float32)

    def bad(match="apply_logits_processors", **kw):
        with pytest.raises(ValueError, match=match):
            _C.ops.apply_logits_processors(logits, **kw)

    bad(allowed_indptr=np.array([0, 1, 2], np.int32), allowed_ids=np.array([1, V], np.int32))
    bad(allowed_indptr=np.array([0, 1], np.int32), allowed_ids=np.array([1], np.int32))
    bad(allowed_indptr=np.array([0, 2, 1], np.int32), allowed_ids=np.array([1], np.int32))
    bad(bias_indptr=np.array([0, 1, 1], np.int32), bias_ids=np.array([-1], np.int32),
        bias_values=np.ones(1, np.float32))
    bad(bias_indptr=np.array([0, 1, 1], np.int32), bias_ids=np.array([1], np.int32))
    pen = dict(penalty_indptr=np.array([0, 1, 1], np.int32), penalty_ids=np.array([1], np.int32),
               output_counts=np.ones(1, np.int32), frequency_penalty=np.zeros(B, np.float32),
               presence_penalty=np.zeros(B, np.float32))
    bad(repetition_penalty=np.array([1, 0], np.float32), **pen)
    bad(repetition_penalty=np.ones(B + 1, np.float32), **pen)
    bad(bad_words_indptr=np.array([0, 1, 1], np.int32))


# -- compute_logprobs ---------------------------------------------------------------------------
def log_softmax64(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def logprobs_call(logits, tokens, nums, ref):
    N = logits.shape[0]
    K = max(0, min(int(max(nums)), logits.shape[1]))
    out = (np.empty(N, np.float32), np.empty(N, np.int32), np.empty((N, K), np.int32),
           np.empty((N, K), np.float32))
    _C.ops.compute_logprobs(out[0], out[1], out[2] if K else None, out[3] if K else None, logits,
                            np.asarray(tokens, np.int32), np.asarray(nums, np.int32), reference=ref)
    return out


@pytest.mark.parametrize("ref", [False, True])
@pytest.mark.parametrize("V", [7, 3000, 151_000])
def test_logprobs_match_numpy(ref, V):
    rng = np.random.default_rng(V)
    N = 12
    logits = (rng.standard_normal((N, V)) * 3).astype(np.float32)
    logits[1, :5] = logits[1].max() + 1  # ties at the top: lower id first
    tokens = rng.integers(0, V, N)
    tokens[1] = 3
    nums = rng.choice([-1, 0, 1, 5, 20, 2000], N)
    nums[1], nums[2] = 5, V  # (whole vocabulary)
    lp, rank, top_ids, top_lps = logprobs_call(logits, tokens, nums, ref)
    ls = log_softmax64(logits)
    np.testing.assert_allclose(lp, ls[np.arange(N), tokens], atol=2e-5, rtol=1e-5)
    for n in range(N):
        k = min(nums[n], V)
        if k < 0:
            assert rank[n] == 0 and (top_ids[n] == -1).all()
            continue
        assert rank[n] == 1 + (logits[n] > logits[n, tokens[n]]).sum()
        order = np.lexsort((np.arange(V), -logits[n]))[:k]
        np.testing.assert_array_equal(top_ids[n, :k], order)
        np.testing.assert_allclose(top_lps[n, :k], ls[n, order], atol=2e-5, rtol=1e-5)
        assert (top_ids[n, k:] == -1).all() and (top_lps[n, k:] == -np.inf).all()
    assert rank[1] == 1 and list(top_ids[1])[:5] == [0, 1, 2, 3, 4]  # ties share rank 1


def test_logprobs_bad_inputs():
    logits = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match="compute_logprobs.*token_ids"):
        logprobs_call(logits, [0, 10], [1, 1], False)
    with pytest.raises(ValueError, match="compute_logprobs.*num_logprobs"):
        _C.ops.compute_logprobs(np.empty(2, np.float32), np.empty(2, np.int32),
                                np.empty((2, 1), np.int32), np.empty((2, 1), np.float32), logits,
                                np.zeros(2, np.int32), np.array([1, 2], np.int32))
    with pytest.raises(ValueError, match="compute_logprobs"):
        logprobs_call(logits, [0], [1], False)
