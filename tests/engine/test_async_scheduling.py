"""Asynchronous scheduling (vLLM's async_scheduling): step N + 1 is scheduled and launched before
step N's tokens reach the host, its input ids taken from where step N sampled them. Whatever
the mix, every request gets the tokens, finish and stop reasons and log-probs it gets with
synchronous scheduling: greedy, seeded random, penalties and bad words (which make the next
step wait for the tokens), min_tokens, stop tokens, max_tokens and max_model_len caps, logprobs
and prompt_logprobs, chunked prefill, prefix hits and preemption, aborts mid-flight. On the CPU
the "device" is the host (the engine resolves async_scheduling to off there); forcing it on runs
the same launch / finish split and token scatter, which the GPU test (tests/cuda) repeats."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return make_checkpoint("qwen3", "float32", str(tmp_path_factory.mktemp("async")))


def mixed_requests(rng, n: int = 18, kinds: tuple = (0, 1, 2, 3, 4, 5)):
    """Prompts (half share a prefix) and a SamplingParams mix covering what sampling reads
    (kinds 2 and 3 read the tokens on the host: their steps wait for the one in flight)."""
    from vllmx import SamplingParams

    system = rng.integers(3, VOCAB, 40).tolist()
    prompts, params = [], []
    for i in range(n):
        tail = rng.integers(3, VOCAB, int(rng.integers(2, 40))).tolist()
        prompts.append({"prompt_token_ids": system + tail if i % 2 else tail})
        m = int(rng.integers(1, 40))
        kind = kinds[i % len(kinds)]
        if kind == 0:
            sp = SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
        elif kind == 1:
            sp = SamplingParams(temperature=0.9, top_k=50, seed=i, max_tokens=m, ignore_eos=True,
                                logprobs=3)
        elif kind == 2:
            sp = SamplingParams(temperature=0, repetition_penalty=1.3, frequency_penalty=0.2,
                                max_tokens=m, ignore_eos=True)
        elif kind == 3:  # min_tokens bans the stop ids while it lasts: read on the host
            sp = SamplingParams(temperature=0.7, seed=i, min_tokens=min(m, 5), max_tokens=m,
                                stop_token_ids=[int(t) for t in rng.integers(3, VOCAB, 40)])
        elif kind == 4:
            sp = SamplingParams(temperature=0, max_tokens=m, prompt_logprobs=2,
                                stop_token_ids=[int(t) for t in rng.integers(3, VOCAB, 20)])
        else:
            sp = SamplingParams(temperature=1.0, top_p=0.9, seed=i, max_tokens=m,
                                ignore_eos=True, logit_bias={7: 5.0})
        params.append(sp)
    return prompts, params


def summary(outs):
    rows = []
    for o in outs:
        c = o.outputs[0]
        lps = None if c.logprobs is None else [
            sorted((t, round(lp.logprob, 4)) for t, lp in d.items()) for d in c.logprobs]
        plps = None if o.prompt_logprobs is None else [
            None if d is None else sorted((t, round(lp.logprob, 4)) for t, lp in d.items())
            for d in o.prompt_logprobs]
        rows.append((list(c.token_ids), c.finish_reason, c.stop_reason, lps, plps))
    return rows


def check_async_matches_sync(model_dir: str, device: str, rng, kinds=(0, 1, 2, 3, 4, 5), **kw):
    """The mixed batch under kw with async_scheduling on and off: the same outputs; returns
    how many steps took input ids from the step in flight (scatter_tokens calls)."""
    from vllmx import LLM, ops

    prompts, params = mixed_requests(rng, kinds=kinds)
    calls = []
    scatter = ops.scatter_tokens

    def counting(*a):
        calls.append(len(a[1]))
        return scatter(*a)

    got = {}
    for mode in (False, True):
        llm = LLM(model_dir, skip_tokenizer_init=True, device=device, async_scheduling=mode,
                  **kw)
        assert llm.llm_engine.config.scheduler_config.async_scheduling is mode
        ops.scatter_tokens = counting
        try:
            got[mode] = summary(llm.generate(prompts, params, use_tqdm=False))
        finally:
            ops.scatter_tokens = scatter
        assert llm.llm_engine.scheduler.kv_cache_manager.num_free_blocks == \
            llm.llm_engine.config.cache_config.num_blocks
        if mode is False:
            assert not calls, "synchronous steps never scatter tokens"
        del llm  # one engine at a time (on the GPU each sizes its cache by what is free)
        gc.collect()
    for i, (a, b) in enumerate(zip(got[False], got[True])):
        assert b == a, f"request {i} ({params[i]})"
    return len(calls)


def test_async_equals_sync_through_chunks_prefix_hits_and_preemption(model_dir):
    rng = np.random.default_rng()
    n = check_async_matches_sync(model_dir, "cpu", rng, max_num_seqs=6,
                                 max_num_batched_tokens=48, num_gpu_blocks_override=14,
                                 block_size=16, max_model_len=160)
    assert n > 0, "no step took its input ids from the step in flight"


@pytest.mark.parametrize("kinds", [(0, 1, 2, 3, 4, 5), (0, 1, 4, 5)])
def test_async_equals_sync_large_batch(model_dir, kinds):
    """All requests in one batch; without requests that read tokens on the host every decode
    step after the first takes its input ids from the step in flight."""
    rng = np.random.default_rng()
    n = check_async_matches_sync(model_dir, "cpu", rng, kinds, max_num_seqs=32)
    if 2 not in kinds:
        assert n > 10


def test_length_caps_stop_without_an_extra_step(model_dir):
    """A request whose in-flight token is its last by max_tokens or max_model_len is not
    scheduled again: it ends with exactly its tokens, and nothing runs past max_model_len."""
    from vllmx import LLM, SamplingParams

    rng = np.random.default_rng()
    llm = LLM(model_dir, skip_tokenizer_init=True, device="cpu", async_scheduling=True,
              max_model_len=48)
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, int(k)).tolist()}
               for k in rng.integers(2, 40, 8)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    for p, o in zip(prompts, outs):
        n = min(30, 48 - len(p["prompt_token_ids"]))
        assert len(o.outputs[0].token_ids) == n and o.outputs[0].finish_reason == "length"


def test_abort_while_a_step_is_in_flight(model_dir):
    """Aborting requests between steps (one launched, not finished) frees their blocks; the
    others go on with the tokens they get alone, and a later generate starts clean."""
    from vllmx import LLM, SamplingParams

    rng = np.random.default_rng()
    llm = LLM(model_dir, skip_tokenizer_init=True, device="cpu", async_scheduling=True)
    engine = llm.llm_engine
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, 12).tolist()} for _ in range(4)]
    sp = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    alone = [llm.generate([p], sp)[0].outputs[0].token_ids for p in prompts]
    ids = [engine.add_request(None, p, sp) for p in prompts]
    for _ in range(4):
        engine.step()
    assert engine._in_flight is not None
    engine.abort_request(ids[1:3])
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = list(out.outputs[0].token_ids)
    assert set(finished) == {ids[0], ids[3]}
    assert finished[ids[0]] == list(alone[0]) and finished[ids[3]] == list(alone[3])
    assert llm.generate([prompts[1]], sp)[0].outputs[0].token_ids == alone[1]
    assert engine.scheduler.kv_cache_manager.num_free_blocks == \
        engine.config.cache_config.num_blocks
