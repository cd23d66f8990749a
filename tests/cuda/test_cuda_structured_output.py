"""Structured outputs on the GPU (SmolLM2 GGUF): the grammar masks applied to device logits
with asynchronous scheduling on (a constrained step waits for the step in flight): every JSON
answer validates, free requests keep their tokens beside constrained ones, and async on / off
give the same tokens."""

from __future__ import annotations

import pytest

from vllmx import SamplingParams

pytestmark = pytest.mark.gpu
# The GPU machine has no internet: both wheels travel in .whl/ (bench/gpu_check.sh).
pytest.importorskip("llguidance")
pytest.importorskip("jsonschema_rs")
from tests.structured_output.test_llm_structured_output import (
    TEXT_CONSTRAINTS,
    check_json,
    json_requests,
)

FREE = [SamplingParams(temperature=0, max_tokens=32),
        SamplingParams(temperature=0.9, seed=9, max_tokens=32)]
FREE_PROMPTS = [[{"role": "user", "content": "Tell me a story."}],
                [{"role": "user", "content": "Write a haiku."}]]


def _llm(path, **kw):
    from vllmx import LLM

    return LLM(path, device="cuda", max_model_len=1024, kv_cache_memory_bytes=256 << 20,
               seed=0, **kw)


def _run(llm):
    reqs = json_requests()
    outs = llm.chat(FREE_PROMPTS + [m for m, _, _ in reqs], FREE + [p for _, p, _ in reqs],
                    use_tqdm=False)
    check_json(outs[2:], [n for _, _, n in reqs])
    return [o.outputs[0].token_ids for o in outs]


def test_constrained_and_free_requests_on_the_gpu(smollm2_gguf):
    llm = _llm(smollm2_gguf)
    assert llm.llm_engine.config.scheduler_config.async_scheduling
    tokens = _run(llm)
    for i, (m, sp) in enumerate(zip(FREE_PROMPTS, FREE)):
        assert llm.chat([m], sp, use_tqdm=False)[0].outputs[0].token_ids == tokens[i]
    prompts, params, checks = [], [], []
    for so, check in TEXT_CONSTRAINTS:
        prompts.append("Here is the answer: ")
        params.append(SamplingParams(temperature=0.9, seed=4, max_tokens=250,
                                     structured_outputs=so))
        checks.append(check)
    for out, check in zip(llm.generate(prompts, params, use_tqdm=False), checks):
        assert out.outputs[0].finish_reason == "stop" and check(out.outputs[0].text)
    del llm
    assert _run(_llm(smollm2_gguf, async_scheduling=False)) == tokens
