"""Structured outputs with speculative decoding on SmolLM2-135M (ngram prompt lookup): a
constrained request's drafts are cut where its grammar stops allowing them and each verify row
is masked (or, greedy on the CPU, checked) at the grammar's state after the drafts before it,
so greedy, seeded and logprobs requests get the tokens they get without speculation, with
drafts accepted; the same with the masks on the runner's thread (the GPU's way)."""

from __future__ import annotations

import json

import pytest

from tests.structured_output.schemas import SCHEMAS
from vllmx import LLM, SamplingParams
from vllmx.sampling_params import StructuredOutputsParams as SO

ENGINE = {"max_model_len": 1024, "kv_cache_memory_bytes": 64 << 20, "seed": 0}
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
        "prompt_lookup_min": 1}
PERSON = {"name": "Ada Lovelace", "age": 36, "address": {"city": "London", "zip": "10001"}}
ITEMS = ["red apples", "green pears", "yellow bananas", "purple plums", "orange peaches"]


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def requests():
    """(messages, params): answers that copy from their prompts (prompt lookup finds drafts),
    greedy, seeded and with logprobs, under a schema, a regex and a choice."""
    copy_json = chat("Copy this JSON exactly: " + json.dumps(PERSON))
    items = ", ".join(ITEMS)
    copy_list = chat(f"Repeat this list exactly: {items}, {items}")
    person = SO(json=SCHEMAS["person"])
    words = SO(regex="[a-z, ]{1,160}")
    return [
        (copy_json, SamplingParams(temperature=0, max_tokens=80, structured_outputs=person)),
        (copy_list, SamplingParams(temperature=0, max_tokens=48, structured_outputs=words)),
        (copy_json, SamplingParams(temperature=0.7, seed=3, max_tokens=80,
                                   structured_outputs=person)),
        (copy_list, SamplingParams(temperature=0, max_tokens=40, logprobs=2,
                                   structured_outputs=words)),
        (chat("Is London in England? Answer Yes or No."),
         SamplingParams(temperature=0, max_tokens=4, structured_outputs=SO(choice=["Yes", "No"]))),
        (chat("Tell me a story about London."), SamplingParams(temperature=0, max_tokens=30)),
    ]


@pytest.fixture(scope="module")
def want(smollm2_gguf):
    reqs = requests()
    return LLM(smollm2_gguf, **ENGINE).chat([m for m, _ in reqs], [p for _, p in reqs],
                                            use_tqdm=False)


@pytest.mark.parametrize("on_thread", [False, True], ids=["in-line", "masks-on-thread"])
def test_same_tokens_as_without_speculation(smollm2_gguf, want, on_thread):
    reqs = requests()
    llm = LLM(smollm2_gguf, speculative_config=SPEC, **ENGINE)
    llm.llm_engine.model_runner.masks_on_thread = on_thread
    got = llm.chat([m for m, _ in reqs], [p for _, p in reqs], use_tqdm=False)
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids, w.outputs[0].text
    for a, b in zip(got[3].outputs[0].logprobs, want[3].outputs[0].logprobs, strict=True):
        assert {k: v.logprob for k, v in a.items()} == pytest.approx(
            {k: v.logprob for k, v in b.items()}, abs=1e-5)
    assert json.loads(got[0].outputs[0].text) == PERSON  # (the copy the drafts came from)
    sched = llm.llm_engine.scheduler
    assert sched.spec_decode_num_accepted_tokens > 40, sched.spec_decode_num_accepted_tokens


def test_constrained_requests_are_drafted(smollm2_gguf, monkeypatch):
    """The drafts of the constrained requests themselves are verified and accepted (not only
    the free request's): counted per request at the runner."""
    from vllmx.worker.model_runner import ModelRunner

    reqs = requests()[:2]
    llm = LLM(smollm2_gguf, speculative_config=SPEC, **ENGINE)
    drafted = []
    real = ModelRunner._grammar_drafts

    def spy(self, spec):
        real(self, spec)
        drafted.extend(len(d) for r, d in spec.items() if self.requests[r].grammar is not None)

    monkeypatch.setattr(ModelRunner, "_grammar_drafts", spy)
    llm.chat([m for m, _ in reqs], [p for _, p in reqs], use_tqdm=False)
    assert sum(drafted) > 20 and llm.llm_engine.scheduler.spec_decode_num_accepted_tokens > 20


@pytest.mark.parametrize("on_thread", [False, True], ids=["in-line", "masks-on-thread"])
def test_drafts_past_a_lexemes_max_tokens(smollm2_gguf, on_thread):
    """A grammar whose lexeme has a max_tokens (which llguidance's validate_tokens does not
    enforce over several tokens) beside a JSON request: drafts stop at the limit, no matcher
    is left in an error state, and both get the tokens they get without speculation."""
    words = "the cat sat on the mat and the cat sat on the mat"
    reqs = [(chat(f"Repeat exactly: {words}, {words}"), SamplingParams(
                temperature=0, max_tokens=20,
                structured_outputs=SO(grammar='start: x "."\nx[max_tokens=5]: /[a-z ]+/'))),
            requests()[0]]
    want = LLM(smollm2_gguf, **ENGINE).chat([m for m, _ in reqs], [p for _, p in reqs],
                                            use_tqdm=False)
    llm = LLM(smollm2_gguf, speculative_config=SPEC, **ENGINE)
    llm.llm_engine.model_runner.masks_on_thread = on_thread
    got = llm.chat([m for m, _ in reqs], [p for _, p in reqs], use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in got] == ["stop", "stop"]
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
