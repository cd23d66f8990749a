"""Fast-forwarding the tokens a grammar forces (issue 16), end to end on SmolLM2-135M: the
model runner appends them unsampled and the next step computes them as a chunk. Greedy and
seeded outputs are the same as without it, in fewer steps (a random request's generator takes
the draw each forced token would have); constrained requests batched with free ones and with
each other give each request's tokens alone; max_tokens cuts the forced run; requests with
logprobs are not fast-forwarded and get a logprob for every token; a failure while
fast-forwarding fails that request only. (Asynchronous scheduling,
which does not fast-forward a request the next step already runs, gives the same answers:
test_llm_structured_output.py's engine modes.)"""

from __future__ import annotations

import json

import jsonschema_rs
import pytest

from tests.structured_output.schemas import PROMPTS, SCHEMAS
from vllmx import LLM, SamplingParams
from vllmx.sampling_params import StructuredOutputsParams as SO
from vllmx.structured_output.backend_guidance import GuidanceGrammar

ENGINE = {"max_model_len": 1024, "kv_cache_memory_bytes": 64 << 20, "seed": 0}
# A regex of long literal runs: after "The answer is " only the choice is sampled.
ANSWER = SO(regex=r"The answer is (yes|no)\. Thank you for asking, have a wonderful day!")


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    return LLM(smollm2_gguf, **ENGINE)


def run(llm, prompts, params, fast_forward: bool, monkeypatch):
    """The outputs and the number of engine steps it took."""
    if not fast_forward:
        monkeypatch.setattr(GuidanceGrammar, "fast_forward", lambda self, limit, stop_ids=(): [])
    engine = llm.llm_engine
    steps = [0]
    real = engine.model_runner.execute_model

    def counted(*a, **kw):
        steps[0] += 1
        return real(*a, **kw)

    monkeypatch.setattr(engine.model_runner, "execute_model", counted)
    try:
        return llm.generate(prompts, params, use_tqdm=False), steps[0]
    finally:
        monkeypatch.undo()


def chat_prompt(llm, name):
    return llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": PROMPTS[name]}], add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.9, 5)], ids=["greedy", "seeded"])
def test_same_tokens_in_fewer_steps(llm, monkeypatch, temperature, seed):
    names = ["person", "product"]
    prompts = ["Question: is the sky blue?\n"] + [chat_prompt(llm, n) for n in names]
    params = [SamplingParams(temperature=temperature, seed=seed, max_tokens=60,
                             structured_outputs=ANSWER)] + [
        SamplingParams(temperature=temperature, seed=seed, max_tokens=250,
                       structured_outputs=SO(json=SCHEMAS[n], disable_any_whitespace=True))
        for n in names]
    for sp, prompt in zip(params, prompts):
        (ff,), ff_steps = run(llm, [prompt], sp, True, monkeypatch)
        (plain,), plain_steps = run(llm, [prompt], sp, False, monkeypatch)
        assert ff.outputs[0].token_ids == plain.outputs[0].token_ids
        assert ff.outputs[0].text == plain.outputs[0].text
        assert ff.outputs[0].finish_reason == plain.outputs[0].finish_reason == "stop"
        # (prefill + one step a sampled token; forced tokens ride along)
        assert ff_steps < plain_steps - 5, (ff_steps, plain_steps, ff.outputs[0].text)
    assert ff.outputs[0].text.startswith("{") and jsonschema_rs.validator_for(
        SCHEMAS["product"]).is_valid(json.loads(ff.outputs[0].text))


def test_batched_with_free_and_seeded_requests_same_as_alone(llm):
    prompts = ["The capital of France is", "Question: is water wet?\n",
               chat_prompt(llm, "person"), "Question: do cats fly?\n"]
    params = [SamplingParams(temperature=0.8, seed=3, max_tokens=24),
              SamplingParams(temperature=0, max_tokens=60, structured_outputs=ANSWER),
              SamplingParams(temperature=0.9, seed=7, max_tokens=250, structured_outputs=SO(
                  json=SCHEMAS["person"], disable_any_whitespace=True)),
              SamplingParams(temperature=1.0, seed=11, max_tokens=60, structured_outputs=ANSWER)]
    alone = [llm.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids
             for p, sp in zip(prompts, params)]
    batched = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in batched] == alone
    assert jsonschema_rs.validator_for(SCHEMAS["person"]).is_valid(
        json.loads(batched[2].outputs[0].text))
    assert batched[3].outputs[0].text.startswith("The answer is ")


def test_max_tokens_cuts_a_forced_run(llm, monkeypatch):
    full = llm.generate(["Question: is the sky blue?\n"], SamplingParams(
        temperature=0, max_tokens=60, structured_outputs=ANSWER), use_tqdm=False)[0].outputs[0]
    for n in (1, 2, 3, 7):
        out = llm.generate(["Question: is the sky blue?\n"], SamplingParams(
            temperature=0, max_tokens=n, structured_outputs=ANSWER),
            use_tqdm=False)[0].outputs[0]
        assert out.finish_reason == "length"
        assert out.token_ids == full.token_ids[:n]


def test_requests_with_logprobs_get_one_for_every_token(llm):
    out = llm.generate(["Question: is the sky blue?\n"], SamplingParams(
        temperature=0, max_tokens=60, logprobs=1, structured_outputs=ANSWER),
        use_tqdm=False)[0].outputs[0]
    assert out.text.startswith("The answer is ")
    assert len(out.logprobs) == len(out.token_ids)
    assert all(tok in lp for tok, lp in zip(out.token_ids, out.logprobs))


def test_a_failing_fast_forward_fails_that_request_only(llm, monkeypatch):
    def broken(self, limit, stop_ids=()):
        raise RuntimeError("fast-forward failure for the test")

    monkeypatch.setattr(GuidanceGrammar, "fast_forward", broken)
    outs = llm.generate(["Question: is the sky blue?\n", "The capital of France is"], [
        SamplingParams(temperature=0, max_tokens=60, structured_outputs=ANSWER),
        SamplingParams(temperature=0, max_tokens=8)], use_tqdm=False)
    assert outs[0].outputs[0].finish_reason == "error"
    assert "fast-forward failure for the test" in outs[0].error
    assert outs[1].outputs[0].finish_reason == "length" and len(outs[1].outputs[0].token_ids) == 8
    monkeypatch.undo()
    again = llm.generate(["Question: is the sky blue?\n"], SamplingParams(
        temperature=0, max_tokens=60, structured_outputs=ANSWER), use_tqdm=False)[0].outputs[0]
    assert again.finish_reason == "stop" and again.text.startswith("The answer is ")
