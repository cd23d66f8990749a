"""Structured outputs end to end on SmolLM2-135M (LLM.generate / LLM.chat): every answer to a
JSON-schema request parses and validates (nested objects, enums, arrays, $ref, required
fields; greedy and sampled), regex / choice / grammar answers match; constrained and free
requests batched together leave the free ones' tokens as they are alone; chunked prefill,
preemption, speculative decoding (constrained requests are not drafted) and asynchronous
scheduling give the same constrained answers; bad constraints are ValueErrors before anything
runs, and settings that leave the grammar nothing to sample fail that request only."""

from __future__ import annotations

import json
import re

import jsonschema_rs
import pytest

from tests.structured_output.schemas import PROMPTS, SCHEMAS
from vllmx import LLM, SamplingParams
from vllmx.sampling_params import StructuredOutputsParams as SO

MAX_TOKENS = 250
ENGINE = {"max_model_len": 1024, "kv_cache_memory_bytes": 64 << 20, "seed": 0}


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    return LLM(smollm2_gguf, **ENGINE)


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def json_requests():
    """(messages, params, schema name): each schema greedy and with three seeds."""
    out = []
    for name, schema in SCHEMAS.items():
        for temperature, seed in ((0.0, None), (0.8, 1), (0.8, 2), (1.0, 3)):
            out.append((chat(PROMPTS[name]), SamplingParams(
                temperature=temperature, seed=seed, max_tokens=MAX_TOKENS,
                structured_outputs=SO(json=schema)), name))
    return out


def check_json(outputs, names):
    for out, name in zip(outputs, names):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (name, c.text)
        assert jsonschema_rs.validator_for(SCHEMAS[name]).is_valid(json.loads(c.text)), c.text


def test_json_schemas_validate(llm):
    reqs = json_requests()
    outs = llm.chat([m for m, _, _ in reqs], [p for _, p, _ in reqs], use_tqdm=False)
    check_json(outs, [n for _, _, n in reqs])


TEXT_CONSTRAINTS = [
    (SO(regex=r"\(\d{3}\) \d{3}-\d{4}"), lambda t: re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", t)),
    (SO(choice=["positive", "negative", "neutral"]),
     lambda t: t in ("positive", "negative", "neutral")),
    (SO(grammar='start: "SELECT " COL " FROM " TABLE ";"\nCOL: "name" | "age" | "*"\n'
                'TABLE: /[a-z]{1,8}/'),
     lambda t: re.fullmatch(r"SELECT (name|age|\*) FROM [a-z]{1,8};", t)),
    (SO(grammar='root ::= answer " because " reason\nanswer ::= "yes" | "no"\n'
                'reason ::= [a-z ]{1,30} "."'),  # GBNF
     lambda t: re.fullmatch(r"(yes|no) because [a-z ]{1,30}\.", t)),
    (SO(json_object=True), lambda t: isinstance(json.loads(t), dict)),
]


def test_regex_choice_grammar_match(llm):
    params, checks = [], []
    for so, check in TEXT_CONSTRAINTS:
        # json_object bounds nothing: sampled, SmolLM2 may go on adding keys past max_tokens
        # (it does with the AVX2 panels' rounding), so that constraint runs greedy only; the
        # schema tests above sample bounded objects.
        temps = ((0.0, None),) if so.json_object else ((0.0, None), (0.9, 4), (1.2, 5))
        for temperature, seed in temps:
            params.append(SamplingParams(temperature=temperature, seed=seed,
                                         max_tokens=MAX_TOKENS, structured_outputs=so))
            checks.append(check)
    outs = llm.generate(["Here is the answer: "] * len(params), params, use_tqdm=False)
    for out, check in zip(outs, checks):
        assert out.outputs[0].finish_reason == "stop" and check(out.outputs[0].text), \
            out.outputs[0].text


def test_free_requests_beside_constrained_ones_keep_their_tokens(llm):
    free_prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    free = [SamplingParams(temperature=0, max_tokens=24),
            SamplingParams(temperature=0.9, seed=9, max_tokens=24),
            SamplingParams(temperature=0.7, top_k=20, seed=3, max_tokens=24)]
    alone = [llm.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids
             for p, sp in zip(free_prompts, free)]
    reqs = json_requests()[::3]
    prompts = free_prompts + [llm.get_tokenizer().apply_chat_template(
        m, add_generation_prompt=True, tokenize=False) for m, _, _ in reqs]
    outs = llm.generate(prompts, free + [p for _, p, _ in reqs], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs[:3]] == alone
    check_json(outs[3:], [n for _, _, n in reqs])


def test_constrained_greedy_same_alone_and_batched(llm):
    reqs = [r for r in json_requests() if r[1].temperature == 0]
    batched = llm.chat([m for m, _, _ in reqs], [p for _, p, _ in reqs], use_tqdm=False)
    for (m, p, _), out in zip(reqs, batched):
        alone = llm.chat([m], [p], use_tqdm=False)[0]
        assert alone.outputs[0].token_ids == out.outputs[0].token_ids


def test_n_and_ignore_eos(llm):
    schema = SCHEMAS["segment"]
    outs = llm.chat([chat(PROMPTS["segment"])], SamplingParams(
        n=3, temperature=0.8, seed=5, max_tokens=MAX_TOKENS,
        structured_outputs=SO(json=schema)), use_tqdm=False)
    assert len(outs[0].outputs) == 3
    check_json([type("O", (), {"outputs": [c]}) for c in outs[0].outputs], ["segment"] * 3)
    # Past the end of the grammar only EOS may follow: with ignore_eos, EOS until max_tokens.
    eos = llm.get_tokenizer().eos_token_id
    out = llm.generate(["Answer: "], SamplingParams(
        temperature=0, max_tokens=20, ignore_eos=True,
        structured_outputs=SO(choice=["yes", "no"])), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length" and out.text in ("yes", "no")
    ids = out.token_ids
    first_eos = ids.index(eos)
    assert first_eos > 0 and set(ids[first_eos:]) == {eos} and len(ids) == 20


@pytest.mark.parametrize("so,words", [
    (SO(json={"type": "object", "properties": {"a": {"$ref": "#/definitions/b"}}}),
     ["Invalid JSON schema", "/definitions/b"]),
    (SO(json={"type": "object", "required": 5}), ["Invalid JSON schema"]),
    (SO(regex="a{2,1}"), ["Invalid regex"]),
    (SO(grammar="start: a\na: b"), ["Invalid grammar", "b"]),
])
def test_bad_constraints_raise_value_error(llm, so, words):
    good = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(ValueError) as e:
        llm.generate(["a", "b"], [good, SamplingParams(max_tokens=4, structured_outputs=so)],
                     use_tqdm=False)
    assert all(w in str(e.value) for w in words), str(e.value)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.generate(["a"], good, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_settings_that_exclude_the_grammar_fail_that_request_only(llm):
    tok = llm.get_tokenizer()
    other = tok.encode(" banana", add_special_tokens=False)[0]
    outs = llm.generate(["Answer: ", "Answer: "], [
        SamplingParams(temperature=0, max_tokens=8, allowed_token_ids=[other],
                       structured_outputs=SO(choice=["yes", "no"])),
        SamplingParams(temperature=0, max_tokens=8, structured_outputs=SO(choice=["yes", "no"]))],
        use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error"
    assert "does not match the grammar" in outs[0].error
    assert outs[1].outputs[0].finish_reason == "stop" and outs[1].outputs[0].text in ("yes", "no")


MODE_FREE = SamplingParams(temperature=0, max_tokens=40)


@pytest.fixture(scope="module")
def mode_outputs(llm):
    """Greedy and seeded schema requests beside a free one, on the default engine."""
    reqs = [r for r in json_requests() if r[1].temperature == 0 or r[1].seed == 1]
    return reqs, llm.chat([m for m, _, _ in reqs] + [chat("Tell me a story.")],
                          [p for _, p, _ in reqs] + [MODE_FREE], use_tqdm=False)


@pytest.mark.parametrize("engine", [
    {"num_gpu_blocks_override": 24, "max_model_len": 384, "max_num_batched_tokens": 64,
     "max_num_seqs": 8},
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                            "prompt_lookup_max": 3, "prompt_lookup_min": 1}},
    {"async_scheduling": True},
    {"async_scheduling": True, "masks_on_thread": True},
], ids=["chunked-prefill-preemption", "ngram-speculation", "async-scheduling",
        "async-scheduling-masks-on-thread"])
def test_engine_modes_give_the_same_answers(llm, smollm2_gguf, engine, mode_outputs):
    """masks_on_thread: the GPU's way (each step's masks on the runner's thread, its sampling
    queued at the next launch), here on the CPU."""
    reqs, want = mode_outputs
    engine = dict(engine)
    on_thread = engine.pop("masks_on_thread", False)
    other = LLM(smollm2_gguf, **{**ENGINE, **engine})
    other.llm_engine.model_runner.masks_on_thread = on_thread
    got = other.chat([m for m, _, _ in reqs] + [chat("Tell me a story.")],
                     [p for _, p, _ in reqs] + [MODE_FREE], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    check_json(got[:-1], [n for _, _, n in reqs])
    if "num_gpu_blocks_override" in engine:
        assert other.llm_engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("on_thread", [False, True], ids=["in-line", "on-thread"])
def test_failing_masks_fail_their_requests_and_the_engine_goes_on(smollm2_gguf, monkeypatch,
                                                                   on_thread):
    """A failure while a step's masks are computed (in line, or on the runner's thread, the
    GPU's way) fails that step's constrained requests with the error (finish_reason "error")
    and nothing else: a free request beside them gets its tokens, the engine neither hangs
    nor dies, and the next requests, constrained and free, are served."""
    other = LLM(smollm2_gguf, **ENGINE, async_scheduling=True)
    runner = other.llm_engine.model_runner
    runner.masks_on_thread = on_thread
    manager = runner.structured_output_manager

    def broken(grammars, drafts=None, parallel=True):
        raise RuntimeError("mask failure for the test")

    sp = SamplingParams(temperature=0, max_tokens=8, structured_outputs=SO(choice=["yes", "no"]))
    free = SamplingParams(temperature=0, max_tokens=4)
    with monkeypatch.context() as m:
        m.setattr(manager, "grammar_bitmask", broken)
        failed = other.chat([chat("Yes or no?"), chat("Hi.")], [sp, free], use_tqdm=False)
    assert failed[0].outputs[0].finish_reason == "error"
    assert len(failed[1].outputs[0].token_ids) == 4
    assert other.llm_engine.get_num_unfinished_requests() == 0
    constrained, free_out = other.chat([chat("Yes or no?"), chat("Hi.")], [sp, free],
                                       use_tqdm=False)
    assert constrained.outputs[0].text in ("yes", "no")
    assert len(free_out.outputs[0].token_ids) == 4
