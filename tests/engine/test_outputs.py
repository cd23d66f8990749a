"""Outputs on the real SmolLM2 model: incremental detokenization, stop strings split across
tokens, output kinds, n > 1, and the asyncio engine (streams, aborts)."""

from __future__ import annotations

import asyncio

import pytest

from vllmx.sampling_params import RequestOutputKind

PROMPTS = ["The capital of France is", "Once upon a time", "日本の首都は", "def add(a, b):"]


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    from vllmx import LLM

    return LLM(smollm2_gguf, max_model_len=512)


def greedy(**kw):
    from vllmx import SamplingParams

    return SamplingParams(**{"temperature": 0, "max_tokens": 24, "ignore_eos": True, **kw})


def test_text_matches_decoding_of_tokens(llm):
    tok = llm.get_tokenizer()
    for out in llm.generate(PROMPTS, greedy()):
        ids = out.prompt_token_ids + out.outputs[0].token_ids
        full = tok.decode(ids, skip_special_tokens=True)
        prompt_text = tok.decode(out.prompt_token_ids, skip_special_tokens=True)
        assert full.startswith(prompt_text)
        # A character cut off by max_tokens never shows as a replacement character.
        assert out.outputs[0].text == full[len(prompt_text):].rstrip("\ufffd")


def test_stop_string_split_across_tokens(llm):
    tok = llm.get_tokenizer()
    base = llm.generate(PROMPTS[1], greedy(max_tokens=32))[0].outputs[0]
    # A stop string that starts in one token and ends in the next.
    pieces = [tok.decode([t]) for t in base.token_ids]
    k = next(i for i in range(3, len(pieces)) if len(pieces[i - 1]) >= 2 and len(pieces[i]) >= 2)
    boundary = len("".join(pieces[:k]))
    stop = base.text[boundary - 2: boundary + 2]
    idx = base.text.find(stop)
    out = llm.generate(PROMPTS[1], greedy(max_tokens=32, stop=[stop]))[0].outputs[0]
    assert out.text == base.text[:idx]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    out = llm.generate(PROMPTS[1], greedy(max_tokens=32, stop=[stop],
                                          include_stop_str_in_output=True))[0].outputs[0]
    assert out.text == base.text[: idx + len(stop)]


def test_delta_and_cumulative_outputs_add_up(llm):
    engine = llm.llm_engine
    final = llm.generate(PROMPTS, greedy())
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE):
        ids = [engine.add_request(None, p, greedy(output_kind=kind)) for p in PROMPTS]
        texts = {i: "" for i in ids}
        tokens = {i: [] for i in ids}
        while engine.has_unfinished_requests():
            for o in engine.step():
                assert "\ufffd" not in o.outputs[0].text
                if kind == RequestOutputKind.DELTA:
                    texts[o.request_id] += o.outputs[0].text
                    tokens[o.request_id] += o.outputs[0].token_ids
                else:
                    texts[o.request_id] = o.outputs[0].text
                    tokens[o.request_id] = o.outputs[0].token_ids
        for rid, f in zip(ids, final):
            assert texts[rid] == f.outputs[0].text
            assert tokens[rid] == f.outputs[0].token_ids


def test_n_samples_match_seeded_single_requests(llm):
    from vllmx import SamplingParams

    sp = SamplingParams(n=3, temperature=1.0, top_p=0.95, seed=11, max_tokens=12, ignore_eos=True)
    out = llm.generate(PROMPTS[0], sp)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for i, c in enumerate(out.outputs):
        single = SamplingParams(temperature=1.0, top_p=0.95, seed=11 + i, max_tokens=12,
                                ignore_eos=True)
        assert llm.generate(PROMPTS[0], single)[0].outputs[0].token_ids == c.token_ids


def test_async_streams_equal_offline_and_abort_frees_blocks(llm):
    from vllmx.engine.async_llm import AsyncLLM

    engine = llm.llm_engine
    expected = [o.outputs[0].text for o in llm.generate(PROMPTS * 4, greedy())]
    free_before = engine.scheduler.kv_cache_manager.num_free_blocks
    async_llm = AsyncLLM(engine)

    async def stream(prompt):
        text = ""
        async for o in async_llm.generate(prompt, greedy(output_kind=RequestOutputKind.DELTA)):
            text += o.outputs[0].text
        return text

    async def abandon():
        agen = async_llm.generate(PROMPTS[0], greedy(max_tokens=200))
        async for _ in agen:
            break
        await agen.aclose()  # the caller goes away: the request is aborted

    async def main():
        texts = await asyncio.gather(*(stream(p) for p in PROMPTS * 4))
        await abandon()
        for _ in range(200):  # the engine thread applies the abort at its next turn
            if not engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        return texts

    try:
        texts = asyncio.run(main())
    finally:
        async_llm.shutdown()
    assert texts == expected
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.kv_cache_manager.num_free_blocks == free_before


def test_async_bad_input_raises_in_caller(llm):
    from vllmx.engine.async_llm import AsyncLLM

    async_llm = AsyncLLM(llm.llm_engine)

    async def main():
        with pytest.raises(ValueError, match="max_model_len"):
            async for _ in async_llm.generate({"prompt_token_ids": [5] * 600}, greedy()):
                pass
        assert not async_llm.errored  # bad input fails the request, not the engine

    try:
        asyncio.run(main())
    finally:
        async_llm.shutdown()


def test_logprobs_and_prompt_logprobs_shapes(llm):
    from vllmx import SamplingParams

    tok = llm.get_tokenizer()
    sp = SamplingParams(temperature=0, max_tokens=6, logprobs=3, prompt_logprobs=2,
                        ignore_eos=True)
    out = llm.generate(PROMPTS[0], sp)[0]
    comp = out.outputs[0]
    assert len(comp.logprobs) == len(comp.token_ids) == 6
    for tok_id, pos in zip(comp.token_ids, comp.logprobs):
        assert tok_id in pos and 3 <= len(pos) <= 4
        assert pos[tok_id].rank == 1  # greedy: the chosen token is the most likely
        assert pos[tok_id].decoded_token == tok.decode([tok_id])
        ranks = sorted(lp.rank for t, lp in pos.items())
        assert ranks[:3] == [1, 1, 2] or ranks[:3] == [1, 2, 3]
    assert abs(comp.cumulative_logprob - sum(p[t].logprob for t, p in
                                             zip(comp.token_ids, comp.logprobs))) < 1e-4
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    assert out.prompt_logprobs[0] is None
    for tok_id, pos in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
        assert tok_id in pos and 2 <= len(pos) <= 3
        assert all(lp.logprob <= 0 for lp in pos.values())
