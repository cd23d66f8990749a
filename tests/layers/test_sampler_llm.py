"""The sampler end to end on a tiny random Llama: logit_bias, allowed_token_ids, bad words,
penalties change what LLM.generate returns, and logprobs / prompt_logprobs come back in
ModelRunnerOutput (across chunked prefill) with the right lengths and values."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

pytest.importorskip("torch")

PROMPT = {"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11]}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    return make_checkpoint("llama", "float32", str(tmp_path_factory.mktemp("sampler")))


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from vllmx import LLM

    return LLM(tiny_llama, skip_tokenizer_init=True, num_gpu_blocks_override=64, block_size=16,
               max_logprobs=-1,
               max_num_batched_tokens=64, max_num_seqs=8)


def gen(llm, prompt=PROMPT, **kw):
    from vllmx import SamplingParams

    kw = {"temperature": 0, "max_tokens": 12, "ignore_eos": True, **kw}
    return llm.generate([prompt], SamplingParams(**kw))[0].outputs[0].token_ids


def test_logit_bias_changes_the_greedy_token(llm):
    base = gen(llm)
    biased = gen(llm, logit_bias={base[0]: -100})
    assert biased[0] != base[0] and base[0] not in biased
    forced = gen(llm, logit_bias={123: 100})
    assert forced == [123] * 12


def test_allowed_token_ids_restrict_sampling(llm):
    allowed = [17, 33, 250, 400]
    out = gen(llm, temperature=1.0, seed=3, max_tokens=24, allowed_token_ids=allowed)
    assert set(out) <= set(allowed) and len(set(out)) > 1


def test_bad_words_as_token_ids(llm):
    from vllmx import SamplingParams

    base = gen(llm)
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    sp._bad_words_token_ids = [[base[0]]]  # as update_from_tokenizer would set
    out = llm.generate([PROMPT], sp)[0].outputs[0].token_ids
    assert base[0] not in out


def test_penalties_change_outputs(llm):
    base = gen(llm, max_tokens=24)
    assert len(set(base)) < len(base)  # the tiny model repeats itself
    rep = gen(llm, max_tokens=24, repetition_penalty=3.0)
    assert rep != base
    assert len(set(rep)) > len(set(base))
    pres = gen(llm, max_tokens=24, presence_penalty=2.0, frequency_penalty=2.0)
    assert pres != base


def test_seeded_penalised_request_is_batch_independent(llm):
    from vllmx import SamplingParams

    rng = np.random.default_rng(5)
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, n).tolist()} for n in (30, 90, 4)]
    sp = SamplingParams(temperature=0.8, top_k=40, seed=11, max_tokens=16, ignore_eos=True,
                        repetition_penalty=1.2, frequency_penalty=0.5, logit_bias={7: 2.0})
    others = [SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True,
                             allowed_token_ids=list(range(100))),
              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                             presence_penalty=1.0)]
    batched = llm.generate(prompts, [others[0], sp, others[1]])
    alone = llm.generate([prompts[1]], sp)
    assert batched[1].outputs[0].token_ids == alone[0].outputs[0].token_ids


def run_capturing(llm, prompts, params):
    """Runs requests to completion; returns the ModelRunnerOutputs of every step."""
    engine = llm.llm_engine
    runner = engine.model_runner
    outs = []
    inner = runner.execute_model

    def capture(so):
        out = inner(so)
        outs.append(out)
        return out

    runner.execute_model = capture
    try:
        ids = [engine.add_request(None, p, params) for p in prompts]
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        runner.execute_model = inner
    return ids, outs


def log_softmax64(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_logprobs_and_prompt_logprobs_in_runner_output(llm, tiny_llama):
    from vllmx import LLM, SamplingParams

    rng = np.random.default_rng(6)
    long_prompt = rng.integers(3, VOCAB, 150).tolist()  # prefilled in 64-token chunks
    prompts = [{"prompt_token_ids": long_prompt}, {"prompt_token_ids": [4]},
               {"prompt_token_ids": long_prompt[:20]}]
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=3,
                        prompt_logprobs=2)
    ids, outs = run_capturing(llm, prompts, sp)
    prompt_lps = {}
    for o in outs:
        for r, lp in o.prompt_logprobs.items():
            assert r not in prompt_lps  # emitted once
            prompt_lps[r] = lp
    for rid, p in zip(ids, prompts):
        toks = p["prompt_token_ids"]
        lps = prompt_lps[rid]
        assert len(lps) == len(toks) and lps[0] is None
        for i in range(1, len(toks)):
            e = lps[i]
            assert e.token_ids[0] == toks[i] and len(e.token_ids) == len(e.logprobs) == 3
            assert e.logprobs[1] >= e.logprobs[2] and e.rank >= 1
            assert e.logprobs[0] <= e.logprobs[1] + 1e-6
        sampled = [t for o in outs if rid in o.sampled_token_ids
                   for t in zip(o.sampled_token_ids[rid], o.logprobs[rid],
                                o.sampled_logprobs[rid])]
        assert len(sampled) == 5
        for tok, lp, slp in sampled:  # greedy: the sampled token is the top one
            assert lp.token_ids[0] == tok == lp.token_ids[1] and lp.rank == 1
            assert len(lp.token_ids) == 4 and lp.logprobs[0] == pytest.approx(slp, abs=1e-6)

    # The same prompt logprobs without chunking (one prefill) and against numpy.
    whole = LLM(tiny_llama, skip_tokenizer_init=True, num_gpu_blocks_override=32,
                max_num_batched_tokens=512)
    ids2, outs2 = run_capturing(whole, prompts[:1], sp)
    ref = next(o.prompt_logprobs[ids2[0]] for o in outs2 if o.prompt_logprobs)
    chunked = prompt_lps[ids[0]]
    for i in range(1, len(long_prompt)):
        assert chunked[i].token_ids == ref[i].token_ids
        np.testing.assert_allclose(chunked[i].logprobs, ref[i].logprobs, atol=1e-4)
    # A prefix of the prompt gets the same prompt logprobs (causal attention).
    for a, b in zip(prompt_lps[ids[2]][1:], chunked[1:20]):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_full_vocab_logprobs(llm):
    from vllmx import SamplingParams

    sp = SamplingParams(temperature=1.0, seed=1, max_tokens=2, ignore_eos=True, logprobs=-1,
                        prompt_logprobs=-1)
    ids, outs = run_capturing(llm, [PROMPT], sp)
    rid = ids[0]
    entries = [e for o in outs if rid in o.logprobs for e in o.logprobs[rid]]
    entries += next(o.prompt_logprobs[rid] for o in outs if o.prompt_logprobs)[1:]
    assert len(entries) == 2 + len(PROMPT["prompt_token_ids"]) - 1
    for e in entries:
        assert len(e.token_ids) == VOCAB + 1 and sorted(e.token_ids[1:]) == list(range(VOCAB))
        lps = np.array(e.logprobs[1:], np.float64)
        assert np.exp(lps).sum() == pytest.approx(1.0, abs=1e-4)
        assert np.all(np.diff(lps) <= 0)
        at = e.token_ids[1:].index(e.token_ids[0])
        assert e.logprobs[0] == e.logprobs[1 + at]
        # (rank counts strictly greater logits; rounding to float32 logprobs may merge some)
        assert 1 + (lps > e.logprobs[0]).sum() <= e.rank <= (lps >= e.logprobs[0]).sum()
