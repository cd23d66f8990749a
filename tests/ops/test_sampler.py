"""sample: greedy, seeded determinism / batch independence, the filtered distribution
(temperature, min_p, top_k, top_p) against exact float64 probabilities, logprobs."""
import numpy as np
import pytest

from vllmx import _C


def states(rng, B):
    return rng.integers(1, 2**63, size=(B, 2), dtype=np.uint64)


def call(logits, temperature, top_k=None, top_p=None, min_p=None, rng_state=None, ref=False,
         logprobs=True):
    B = logits.shape[0]
    full = lambda v, d, dt: np.ascontiguousarray(np.broadcast_to(np.asarray(d if v is None else v, dt), (B,)))
    t = full(temperature, 0.0, np.float32)
    k = full(top_k, 0, np.int32)
    p = full(top_p, 1.0, np.float32)
    m = full(min_p, 0.0, np.float32)
    if rng_state is None:
        rng_state = states(np.random.default_rng(0), B)
    ids = np.full(B, -7, np.int32)
    lp = np.full(B, np.nan, np.float32) if logprobs else None
    _C.ops.sample(ids, lp, np.ascontiguousarray(logits, np.float32), t, k, p, m, rng_state,
                  reference=ref)
    return ids, lp


def log_softmax64(logits):
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def filtered_probs(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """Exact (float64) distribution after temperature, min_p, top_k, top_p."""
    x = (logits.astype(np.float32) / np.float32(temperature)).astype(np.float64)
    w = np.exp(x - x.max())
    if min_p > 0:
        w[w < np.float32(min_p)] = 0
    idx = np.arange(len(w))
    order = np.lexsort((idx, -w))
    keep = order[w[order] > 0]
    if 0 < top_k < len(keep):
        keep = keep[:top_k]
    if top_p < 1:
        cum = np.cumsum(w[keep])
        L = int(np.argmax(cum >= np.float32(top_p) * cum[-1])) + 1
        keep = keep[:L]
    probs = np.zeros_like(w)
    probs[keep] = w[keep]
    return probs / probs.sum()


@pytest.mark.parametrize("ref", [False, True])
def test_greedy(ref):
    rng = np.random.default_rng(1)
    B, V = 9, 1537
    logits = rng.standard_normal((B, V)).astype(np.float32) * 4
    logits[3, 100] = logits[3, 900] = logits[3].max() + 1  # tie -> lowest index
    logits[5, 7] = np.nan  # ignored
    st = states(rng, B)
    st0 = st.copy()
    ids, lp = call(logits, 0.0, top_k=rng.integers(0, 5, B), top_p=0.3, min_p=0.2, rng_state=st,
                   ref=ref)
    assert ids[3] == 100
    expect = np.nanargmax(logits, axis=1)
    np.testing.assert_array_equal(ids, expect)
    np.testing.assert_array_equal(st, st0)  # greedy rows do not consume randomness
    ls = log_softmax64(np.nan_to_num(logits, nan=-np.inf))
    np.testing.assert_allclose(lp, ls[np.arange(B), ids], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("ref", [False, True])
def test_logprobs_random_rows(ref):
    rng = np.random.default_rng(2)
    B, V = 16, 151_000
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    ids, lp = call(logits, 0.8, top_k=40, top_p=0.9, ref=ref, rng_state=states(rng, B))
    ls = log_softmax64(logits)
    np.testing.assert_allclose(lp, ls[np.arange(B), ids], atol=2e-5, rtol=1e-5)
    ids2, lp2 = call(logits, 0.8, top_k=40, top_p=0.9, ref=ref, rng_state=states(rng, B),
                     logprobs=False)
    assert lp2 is None and np.all((ids2 >= 0) & (ids2 < V))


@pytest.mark.parametrize("ref", [False, True])
def test_grammar_masked_rows(ref):
    """Rows a grammar mask left -inf but for 1 to 2000 tokens, one with allowed logits 90-120
    below its maximum (exp's subnormal range, which the fast path takes as 0): greedy and
    sampled picks among the allowed tokens, log-probs as float64's."""
    rng = np.random.default_rng(11)
    B, V = 6, 49152
    logits = np.full((B, V), -np.inf, np.float32)
    allowed = [rng.choice(V, size=n, replace=False) for n in (1, 3, 40, 2000, 7, 500)]
    for b, a in enumerate(allowed):
        logits[b, a] = rng.standard_normal(len(a)) * 3
    logits[4, allowed[4][:3]] = logits[4, allowed[4]].max() - np.float32([90, 100, 120])
    ls = log_softmax64(logits)
    for t in (0.0, 1.0):
        ids, lp = call(logits, t, rng_state=states(rng, B), ref=ref)
        assert all(ids[b] in set(allowed[b].tolist()) for b in range(B))
        np.testing.assert_allclose(lp, ls[np.arange(B), ids], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("ref", [False, True])
def test_seeded_independent_of_batch(ref):
    rng = np.random.default_rng(3)
    V = 3000
    row = (rng.standard_normal(V) * 2).astype(np.float32)
    seed_state = np.array([[0x1234567890ABCDEF, 0x0FEDCBA987654321]], np.uint64)
    params = dict(temperature=0.9, top_k=100, top_p=0.95, min_p=0.01)

    st_alone = seed_state.copy()
    alone = [int(call(row[None], rng_state=st_alone, ref=ref, **params)[0][0]) for _ in range(20)]

    st_again = seed_state.copy()
    again = [int(call(row[None], rng_state=st_again, ref=ref, **params)[0][0]) for _ in range(20)]
    assert alone == again
    np.testing.assert_array_equal(st_alone, st_again)
    assert len(set(alone)) > 1  # it is actually random

    # The same row at position 4 of a batch of other rows with other settings.
    B = 9
    others = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    others[4] = row
    st = states(rng, B)
    st[4] = seed_state[0]
    t = rng.uniform(0.5, 1.5, B).astype(np.float32)
    t[[1, 6]] = 0
    k = rng.integers(0, 200, B).astype(np.int32)
    p = rng.uniform(0.5, 1.0, B).astype(np.float32)
    m = rng.uniform(0, 0.1, B).astype(np.float32)
    t[4], k[4], p[4], m[4] = params["temperature"], params["top_k"], params["top_p"], params["min_p"]
    batched = []
    for _ in range(20):
        ids, _ = call(others, t, k, p, m, rng_state=st, ref=ref)
        batched.append(int(ids[4]))
    assert batched == alone
    np.testing.assert_array_equal(st[4], st_alone[0])


def test_fast_matches_reference_draws():
    rng = np.random.default_rng(4)
    B, V = 64, 20_000
    logits = (rng.standard_normal((B, V)) * 2.5).astype(np.float32)
    t = rng.uniform(0.3, 1.5, B).astype(np.float32)
    k = rng.choice([0, 1, 5, 50, 1000, 30_000], B).astype(np.int32)
    p = rng.choice([1.0, 0.5, 0.9, 0.99], B).astype(np.float32)
    m = rng.choice([0.0, 0.0, 0.05, 0.3], B).astype(np.float32)
    st = states(rng, B)
    st_ref = st.copy()
    a, _ = call(logits, t, k, p, m, rng_state=st)
    b, _ = call(logits, t, k, p, m, rng_state=st_ref, ref=True)
    np.testing.assert_array_equal(st, st_ref)
    assert np.mean(a == b) >= 0.95
    for i in range(B):  # every draw lies in its row's kept set
        probs = filtered_probs(logits[i], t[i], k[i], p[i], m[i])
        assert probs[a[i]] > 0 and probs[b[i]] > 0


SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.5, top_k=20, top_p=0.9, min_p=0.02),
    dict(temperature=2.0, top_k=1),
    dict(temperature=1.0, top_p=0.05),
    dict(temperature=1.5, top_k=30, top_p=0.6),
]


@pytest.mark.parametrize("ref", [False, True])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_distribution(settings, ref):
    rng = np.random.default_rng(abs(hash(tuple(settings.items()))) % 2**32)
    V, N = 60, 40_000
    row = (rng.standard_normal(V) * 1.5).astype(np.float32)
    logits = np.ascontiguousarray(np.broadcast_to(row, (N, V)))
    ids, _ = call(logits, rng_state=states(rng, N), ref=ref, logprobs=False, **settings)
    exact = filtered_probs(row, settings["temperature"], settings.get("top_k", 0),
                           settings.get("top_p", 1.0), settings.get("min_p", 0.0))
    freq = np.bincount(ids, minlength=V) / N
    assert np.all(freq[exact == 0] == 0), "drew an excluded token"
    tol = 5 * np.sqrt(exact * (1 - exact) / N) + 1e-4
    assert np.all(np.abs(freq - exact) <= tol), np.max(np.abs(freq - exact) - tol)


@pytest.mark.parametrize("ref", [False, True])
def test_large_nucleus_distribution(ref):
    """top_p over thousands of candidates (exercises the growing partial selection)."""
    rng = np.random.default_rng(7)
    V, N = 2000, 10_000
    row = (rng.standard_normal(V) * 0.3).astype(np.float32)
    logits = np.ascontiguousarray(np.broadcast_to(row, (N, V)))
    ids, _ = call(logits, 1.0, top_p=0.7, min_p=0.3, rng_state=states(rng, N), ref=ref,
                  logprobs=False)
    exact = filtered_probs(row, 1.0, 0, 0.7, 0.3)
    assert (exact > 0).sum() > 300
    freq = np.bincount(ids, minlength=V) / N
    assert np.all(freq[exact == 0] == 0)
    # Coarse check: mass in bins of 100 tokens.
    fb, eb = freq.reshape(-1, 100).sum(1), exact.reshape(-1, 100).sum(1)
    assert np.all(np.abs(fb - eb) <= 5 * np.sqrt(eb * (1 - eb) / N) + 1e-4)


def test_large_vocab_small_k():
    rng = np.random.default_rng(8)
    B, V = 8, 150_000
    logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    for ref in (False, True):
        ids, _ = call(logits, 1.0, top_k=3, rng_state=states(rng, B), ref=ref)
        top3 = np.argsort(-logits, axis=1)[:, :3]
        assert all(ids[i] in top3[i] for i in range(B))


def test_bad_inputs():
    B, V = 3, 10
    good = dict(out_ids=np.zeros(B, np.int32), out_logprobs=np.zeros(B, np.float32),
                logits=np.ones((B, V), np.float32), temperature=np.ones(B, np.float32),
                top_k=np.zeros(B, np.int32), top_p=np.ones(B, np.float32),
                min_p=np.zeros(B, np.float32), rng_state=np.ones((B, 2), np.uint64))
    _C.ops.sample(**good)

    def bad(**kw):
        args = dict(good)
        args.update(kw)
        with pytest.raises(ValueError, match="sample"):
            _C.ops.sample(**args)

    bad(out_ids=np.zeros(B + 1, np.int32))
    bad(out_ids=np.zeros(B, np.int64))
    bad(out_logprobs=np.zeros(2, np.float32))
    bad(logits=np.ones(V, np.float32))
    bad(temperature=np.array([1, -1, 1], np.float32))
    bad(temperature=np.array([1, np.nan, 1], np.float32))
    bad(top_p=np.array([1, 0, 1], np.float32))
    bad(top_p=np.array([1, 1.5, 1], np.float32))
    bad(min_p=np.array([1, 2, 0], np.float32))
    bad(rng_state=np.ones((B, 1), np.uint64))
    bad(rng_state=np.ones((B, 2), np.int64))
    bad(top_k=np.zeros(B, np.float32))


@pytest.mark.parametrize("ref", [False, True])
def test_random_rows_take_exactly_one_draw(ref):
    """A random row advances its generator by one output even when it falls back to greedy
    (no finite logit): the engine advances it on the host before the step's tokens are back."""
    from vllmx.layers.sampler import advance_rng_states

    rng = np.random.default_rng()
    B, V = 6, 300
    logits = rng.standard_normal((B, V)).astype(np.float32)
    logits[1] = -np.inf
    logits[2] = np.nan
    logits[3, :] = -np.inf
    logits[3, 17] = np.inf  # no finite maximum either
    temperature = np.array([0.8, 0.8, 1.0, 0.5, 0.0, 1.2], np.float32)
    st = states(rng, B)
    want = st.copy()
    random = temperature > 0
    want[random] = advance_rng_states(st[random])
    ids, _ = call(logits, temperature, top_k=[0, 0, 5, 0, 0, 10], rng_state=st, ref=ref)
    np.testing.assert_array_equal(st, want)
    assert ids[3] == 17 and ids[4] == np.argmax(logits[4])
