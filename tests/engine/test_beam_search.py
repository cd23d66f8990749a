"""Beam search (vllmx/beam_search.py, LLM.beam_search): the rule against an exhaustive search on
a toy model, and on a tiny random Llama: width 1 is greedy decoding, each beam's cumulative
log-prob is what an independent forward (prompt_logprobs over the beam) gives, beams come best
first by vLLM's score."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tests.models.tiny_checkpoints import make_checkpoint
from vllmx.beam_search import BeamSearch, get_beam_search_score
from vllmx.outputs import Logprob
from vllmx.sampling_params import BeamSearchParams

V, EOS = 4, 3  # the toy model's vocabulary; token 3 ends a sequence


def toy_table(seed: int) -> np.ndarray:
    """log P(next | last token) for a first-order toy model over V tokens."""
    logits = np.random.default_rng(seed).standard_normal((V, V)) * 2
    return logits - np.log(np.exp(logits).sum(1, keepdims=True))


def run_toy(table, prompt, params) -> list:
    search = BeamSearch(prompt, params, {EOS}, max_model_len=100)
    while pending := search.pending():
        steps = []
        for ids in pending:
            row = table[ids[-1]]
            top = np.argsort(-row)[:2 * params.beam_width]
            steps.append({int(t): Logprob(float(row[t])) for t in top})
        search.advance(steps)
    return search.result()


def exhaustive(table, prompt, max_tokens, length_penalty):
    """Every continuation of up to max_tokens tokens (an EOS ends one), scored as vLLM does."""
    found = []
    for n in range(1, max_tokens + 1):
        for tail in itertools.product(range(V), repeat=n):
            if EOS in tail[:-1] or (n < max_tokens and tail[-1] != EOS):
                continue  # an EOS ends a sequence; only EOS ends one early
            toks = prompt + list(tail)
            lp = sum(table[a, b] for a, b in zip(toks[len(prompt) - 1:], tail))
            eos = EOS if tail[-1] == EOS else None
            found.append((get_beam_search_score(toks, lp, eos, length_penalty), toks))
    return sorted(found, reverse=True)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_is_exhaustive(seed, length_penalty):
    """A beam wider than every candidate set keeps everything: its best beams are the
    exhaustive search's best sequences, with their scores."""
    table, prompt = toy_table(seed), [0, 1]
    params = BeamSearchParams(beam_width=40, max_tokens=3, length_penalty=length_penalty)
    got = run_toy(table, prompt, params)
    want = exhaustive(table, prompt, 3, length_penalty)
    assert len(got) == min(40, len(want))
    for beam, (score, toks) in zip(got, want):
        eos = beam.tokens[-1] if beam.finish_reason == "stop" else None
        assert math.isclose(get_beam_search_score(beam.tokens, beam.cum_logprob, eos,
                                                  length_penalty), score, rel_tol=1e-9)
    assert {tuple(b.tokens) for b in got} == {tuple(t) for _, t in want[:len(got)]}
    for beam in got:
        assert beam.finish_reason == ("stop" if beam.tokens[-1] == EOS else "length")


def test_narrow_beam_keeps_its_width_best_each_step():
    """Width 2: after each step the live beams are the 2 best extensions of the last ones."""
    table, prompt = toy_table(7), [2]
    params = BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
    search = BeamSearch(prompt, params, {EOS}, max_model_len=100)
    live = [(0.0, prompt)]
    while pending := search.pending():
        assert sorted(map(tuple, pending)) == sorted(tuple(t) for _, t in live)
        steps = [{t: Logprob(float(table[ids[-1], t])) for t in range(V)} for ids in pending]
        search.advance(steps)
        cands = [(lp + table[t[-1], v], t + [v]) for lp, t in live for v in range(V)]
        live = sorted(cands, key=lambda c: c[0] / len(c[1]), reverse=True)[:2]
    got = search.result()
    assert [b.tokens for b in got] == [t for _, t in live]


def test_bad_params():
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens"):
        BeamSearchParams(beam_width=2, max_tokens=0)


# ---------------------------------------------------------------- on a model

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from vllmx import LLM

    return LLM(make_checkpoint("llama", "float32", str(tmp_path_factory.mktemp("beam"))),
               skip_tokenizer_init=True)


def test_width_one_is_greedy(llm):
    from vllmx import SamplingParams

    prompt = {"prompt_token_ids": [5, 17, 42, 9]}
    out = llm.beam_search([prompt], BeamSearchParams(beam_width=1, max_tokens=8,
                                                     ignore_eos=True))[0]
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8,
                                                   ignore_eos=True))[0].outputs[0]
    assert out.sequences[0].tokens[4:] == greedy.token_ids


def test_beams_against_an_independent_forward(llm):
    """Each beam's cum_logprob is the sum of its tokens' log-probs under a separate forward
    over the whole beam (prompt_logprobs); beams are distinct and best first."""
    from vllmx import SamplingParams

    prompts = [{"prompt_token_ids": [5, 17, 42, 9]}, {"prompt_token_ids": [3, 3, 8]}]
    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
    outs = llm.beam_search(prompts, params)
    for prompt, out in zip(prompts, outs):
        n = len(prompt["prompt_token_ids"])
        beams = out.sequences
        assert len(beams) == 3 and len({tuple(b.tokens) for b in beams}) == 3
        scores = [b.cum_logprob / len(b.tokens) for b in beams]
        assert scores == sorted(scores, reverse=True)
        for b in beams:
            assert b.tokens[:n] == prompt["prompt_token_ids"] and len(b.tokens) == n + 6
            scored = llm.generate([{"prompt_token_ids": b.tokens}],
                                  SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
            lps = [scored.prompt_logprobs[i][t].logprob for i, t in
                   enumerate(b.tokens) if i >= n]
            assert math.isclose(sum(lps), b.cum_logprob, rel_tol=1e-4, abs_tol=1e-4)


def test_async_beam_search_matches_llm(llm):
    """AsyncLLM.beam_search (the server's) gives LLM.beam_search's beams."""
    import asyncio

    from vllmx.engine.async_llm import AsyncLLM

    prompt = {"prompt_token_ids": [7, 1, 30, 2, 11]}
    params = BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True)
    want = llm.beam_search([prompt], params)[0].sequences
    engine = AsyncLLM(llm.llm_engine)
    try:
        async def run():
            return [o async for o in engine.beam_search(prompt, "bs", params)]

        outs = asyncio.run(run())
    finally:
        engine.shutdown()
    assert len(outs) == 1 and outs[0].finished
    got = outs[0].outputs
    assert [c.token_ids for c in got] == [b.tokens[5:] for b in want]
    assert [c.finish_reason for c in got] == ["length", "length"]
    for c, b in zip(got, want):
        assert math.isclose(c.cumulative_logprob, b.cum_logprob, rel_tol=1e-6)
