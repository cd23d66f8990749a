"""The Sampler over a batch: metadata from per-request state, penalties on greedy rows,
min_tokens, seeded rows independent of the batch, logprobs of the raw distribution."""

from __future__ import annotations

import numpy as np
import pytest

from vllmx.layers.sampler import RequestSamplingState, Sampler, SamplingMetadata, seed_rng_state
from vllmx.sampling_params import SamplingParams


def run(logits, params, tokens, num_prompt, rngs=None):
    V = logits.shape[1]
    states = [RequestSamplingState(sp, V) for sp in params]
    rngs = rngs if rngs is not None else [seed_rng_state(i) for i in range(len(params))]
    md = SamplingMetadata.build(params, states, tokens, num_prompt, rngs, V)
    out = Sampler()(logits.copy(), md)
    return out, md


def log_softmax64(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_greedy_rows_apply_penalties_and_bias():
    rng = np.random.default_rng(0)
    V = 40
    logits = rng.standard_normal((4, V)).astype(np.float32)
    top = logits.argmax(axis=1)
    tokens = [[1, 2, int(top[0])], [int(top[1]), 3], [5, 6], [7]]
    params = [SamplingParams(temperature=0, repetition_penalty=50.0),  # top token in the output
              SamplingParams(temperature=0, presence_penalty=2, frequency_penalty=2),
              SamplingParams(temperature=0, logit_bias={int(top[2]): -100}),
              SamplingParams(temperature=0)]
    out, _ = run(logits, params, tokens, [2, 1, 2, 1])
    ids = out.sampled_token_ids
    assert ids[0] != top[0] and ids[2] != top[2] and ids[3] == top[3]
    # row 1's token is from the prompt only: repetition unset, presence/frequency do not apply
    assert ids[1] == top[1]
    # sampled_logprobs are of the raw model distribution, whatever the processors did
    ls = log_softmax64(logits)
    np.testing.assert_allclose(out.sampled_logprobs, ls[np.arange(4), ids], atol=2e-5)


def test_min_tokens_bans_stop_and_eos_until_reached():
    V = 10
    logits = np.zeros((3, V), np.float32)
    logits[:, 2] = 10  # EOS
    logits[:, 4] = 9  # a stop token id
    eos = {2}

    def sp(**kw):
        p = SamplingParams(temperature=0, stop_token_ids=[4], **kw)
        p.all_stop_token_ids = eos
        return p

    params = [sp(min_tokens=3), sp(min_tokens=3), sp(min_tokens=3, ignore_eos=True)]
    tokens = [[1, 1, 1], [1, 1, 1, 1], [1, 1]]  # 2, 3 and 1 output tokens (prompt = 1)
    out, _ = run(logits, params, tokens, [1, 1, 1])
    assert out.sampled_token_ids.tolist() == [0, 2, 2]  # row 2: EOS allowed (ignored), 4 banned


def test_allowed_and_bad_words():
    rng = np.random.default_rng(1)
    V = 30
    logits = rng.standard_normal((2, V)).astype(np.float32)
    a = SamplingParams(temperature=1.0, allowed_token_ids=[3, 17, 29])
    b = SamplingParams(temperature=0)
    top = int(logits[1].argmax())
    b._bad_words_token_ids = [[5, 6, top]]
    for _ in range(20):
        out, _ = run(logits, [a, SamplingParams(temperature=0)], [[1], [9, 5, 6]], [1, 1],
                     [seed_rng_state(int(rng.integers(1 << 30))), seed_rng_state(0)])
        assert out.sampled_token_ids[0] in (3, 17, 29)
    assert run(logits, [a, b], [[1], [9, 5, 6]], [1, 1])[0].sampled_token_ids[1] != top
    assert run(logits, [a, b], [[1], [9, 5, 7]], [1, 1])[0].sampled_token_ids[1] == top


def test_seeded_row_same_alone_and_in_a_batch():
    rng = np.random.default_rng(2)
    V = 500
    row = (rng.standard_normal(V) * 2).astype(np.float32)
    sp = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, seed=7, repetition_penalty=1.3,
                        presence_penalty=0.5, logit_bias={1: 3.0})
    toks = [3, 4, 5, 6, 6, 7]

    def draws(batch: bool):
        state = seed_rng_state(7)
        out_tokens = []
        for _ in range(10):
            t = toks + out_tokens
            if batch:
                others = (rng.standard_normal((4, V)) * 2).astype(np.float32)
                logits = np.concatenate([others[:2], row[None], others[2:]])
                params = [SamplingParams(temperature=1.0, allowed_token_ids=[1, 2]),
                          SamplingParams(temperature=0, frequency_penalty=1.0), sp,
                          SamplingParams(temperature=0.5, min_p=0.1),
                          SamplingParams(temperature=1.2, bad_words=["x"])]
                params[-1]._bad_words_token_ids = [[4]]
                tokens = [[1, 2, 3], [4, 4, 5], t, [9], [8, 8]]
                rngs = [seed_rng_state(int(x)) for x in rng.integers(1 << 30, size=2)]
                rngs = rngs + [state] + [seed_rng_state(int(x)) for x in rng.integers(9, size=2)]
                out, md = run(logits, params, tokens, [1, 1, 4, 1, 1], rngs)
                state = md.rng_state[2].copy()
                out_tokens.append(int(out.sampled_token_ids[2]))
            else:
                out, md = run(row[None].copy(), [sp], [t], [4], [state])
                state = md.rng_state[0].copy()
                out_tokens.append(int(out.sampled_token_ids[0]))
        return out_tokens

    alone = draws(False)
    assert draws(True) == alone
    assert len(set(alone)) > 1


@pytest.mark.parametrize("k", [0, 3, -1])
def test_logprobs_sampled_first_then_top_k(k):
    rng = np.random.default_rng(3)
    V = 64
    logits = (rng.standard_normal((3, V)) * 2).astype(np.float32)
    params = [SamplingParams(temperature=1.0, logprobs=k, repetition_penalty=2.0),
              SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=k)]
    out, _ = run(logits, params, [[1, 2], [3], [4]], [1, 1, 1])
    ls = log_softmax64(logits)
    assert out.logprobs[1] is None
    n = V if k == -1 else k
    for i in (0, 2):
        lp = out.logprobs[i]
        tok = int(out.sampled_token_ids[i])
        assert lp.token_ids[0] == tok and len(lp.token_ids) == len(lp.logprobs) == n + 1
        np.testing.assert_allclose(lp.logprobs, ls[i, lp.token_ids], atol=2e-5)
        assert lp.token_ids[1:] == np.argsort(-ls[i], kind="stable")[:n].tolist()
        assert lp.rank == 1 + int((logits[i] > logits[i, tok]).sum())
    assert out.logprobs[2].rank == 1  # greedy


def test_penalty_counts_are_incremental():
    sp = SamplingParams(frequency_penalty=1.0)
    st = RequestSamplingState(sp, 100)
    tokens = [5, 6, 5]
    st.update_counts(tokens, 3)
    for t in [7, 5, 5] + list(range(80)):
        tokens.append(t)
        st.update_counts(tokens, 3)
    counts = dict(zip(st.penalty_ids[:st.num_distinct].tolist(),
                      st.output_counts[:st.num_distinct].tolist()))
    out = np.bincount(tokens[3:], minlength=100)
    assert counts == {t: int(out[t]) for t in set(tokens)}
