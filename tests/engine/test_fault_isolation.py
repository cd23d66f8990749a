"""A fault inside one request fails that request alone: the others give the same tokens as
when they run alone, its KV blocks come back and nothing it touched stays in the prefix
cache. A fault in the batched step kills the engine loop, which says so to everyone waiting.
Faults are injected by patching the code they would come from (test hooks, no flags)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.models.tiny_checkpoints import make_checkpoint
from vllmx.layers.sampler import RequestSamplingState
from vllmx.worker import model_runner

pytest.importorskip("torch")

POISON_SEED = 1313  # requests with this seed fail in the injected faults below
PROMPTS = [{"prompt_token_ids": [5 + i, 17, 3 * i + 1, 40, 2, 9 + i] * 3} for i in range(4)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return make_checkpoint("llama", "float32", str(tmp_path_factory.mktemp("faults")))


def make_llm(path: str):
    from vllmx import LLM

    return LLM(path, skip_tokenizer_init=True, num_gpu_blocks_override=60, block_size=4,
               max_model_len=128,
               max_num_batched_tokens=64, max_num_seqs=8)


@pytest.fixture(scope="module")
def llm(checkpoint):
    return make_llm(checkpoint)


def greedy(n=8):
    from vllmx import SamplingParams

    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def poisoned():
    from vllmx import SamplingParams

    return SamplingParams(temperature=1.0, seed=POISON_SEED, max_tokens=8, ignore_eos=True)


class FaultySamplingState(RequestSamplingState):
    def __init__(self, sp, vocab_size):
        if sp.seed == POISON_SEED:
            raise RuntimeError("injected sampler-state fault")
        super().__init__(sp, vocab_size)


def alone(llm) -> list[list[int]]:
    return [llm.generate([p], greedy())[0].outputs[0].token_ids for p in PROMPTS]


def kv_idle(llm) -> bool:
    sched = llm.llm_engine.scheduler
    return sched.kv_cache_manager.usage == 0 and not sched.has_unfinished_requests()


def test_sampler_state_fault_fails_that_request_alone(llm, monkeypatch):
    reference = alone(llm)
    llm.reset_prefix_cache()
    monkeypatch.setattr(model_runner, "RequestSamplingState", FaultySamplingState)
    # The poisoned request shares its prompt with PROMPTS[1]: nothing it scheduled may be
    # cached as a prefix, since its KV was never written.
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[1], PROMPTS[3]]
    params = [greedy(), poisoned(), greedy(), greedy(), greedy()]
    outs = llm.generate(prompts, params)
    bad = outs[1]
    assert bad.finished and bad.outputs[0].finish_reason == "error"
    assert "injected sampler-state fault" in bad.error
    got = [o.outputs[0].token_ids for i, o in enumerate(outs) if i != 1]
    assert got == [reference[0], reference[2], reference[1], reference[3]]
    assert all(o.error is None and o.outputs[0].finish_reason == "length"
               for i, o in enumerate(outs) if i != 1)
    assert kv_idle(llm)
    monkeypatch.undo()
    assert alone(llm) == reference  # and the engine goes on, prefix cache included


def test_output_path_fault_fails_that_request_alone(llm, monkeypatch):
    reference = alone(llm)
    engine = llm.llm_engine
    real = engine.output_processor.process

    def process(req, *args, **kwargs):
        if req.request_id == "bad" and req.num_output_tokens == 3:
            raise RuntimeError("injected output fault")
        return real(req, *args, **kwargs)

    monkeypatch.setattr(engine.output_processor, "process", process)
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"ok{i}", p, greedy())
    engine.add_request("bad", PROMPTS[2], greedy())
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    assert final["bad"].outputs[0].finish_reason == "error"
    assert "injected output fault" in final["bad"].error
    assert [final[f"ok{i}"].outputs[0].token_ids for i in range(4)] == reference
    assert kv_idle(llm)


def test_n_samples_one_fails(llm, monkeypatch):
    """A child of an n > 1 request fails: the parent's final output says so; the engine and
    the request beside it go on."""
    from vllmx import SamplingParams

    reference = alone(llm)
    monkeypatch.setattr(model_runner, "RequestSamplingState", FaultySamplingState)
    sp = SamplingParams(n=3, temperature=1.0, seed=POISON_SEED - 1, max_tokens=4)
    outs = llm.generate([PROMPTS[0], PROMPTS[3]], [sp, greedy()])
    reasons = sorted(c.finish_reason for c in outs[0].outputs)
    assert reasons == ["error", "length", "length"]  # child 1 got seed POISON_SEED
    assert outs[1].outputs[0].token_ids == reference[3]
    assert kv_idle(llm)


def test_engine_fault_kills_the_loop_and_tells_everyone(checkpoint):
    from vllmx.engine.async_llm import AsyncLLM, EngineDeadError

    engine = make_llm(checkpoint).llm_engine
    client = AsyncLLM(engine)
    called = threading.Event()
    client.add_dead_callback(called.set)

    def execute_model(so):
        raise RuntimeError("injected engine fault")

    engine.model_runner.execute_model = execute_model
    try:
        async def run():
            return [out async for out in client.generate(PROMPTS[0], greedy())]

        with pytest.raises(EngineDeadError, match="injected engine fault"):
            asyncio.run(run())
        assert called.wait(5) and client.errored
        with pytest.raises(EngineDeadError):
            asyncio.run(run())
    finally:
        client.shutdown()
