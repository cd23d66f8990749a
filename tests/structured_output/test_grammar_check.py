"""The CPU's constrained greedy rows checked after sampling instead of masked before it
(StructuredOutputModelRunnerMixin._grammar_check), end to end on SmolLM2-135M: the same tokens
as with every row masked (the GPU's way, masks_on_thread), most rows without a mask where the
model follows its constraint, and rows whose token the grammar refuses sampled again over the
mask; random and logprobs rows beside them still masked before sampling."""

from __future__ import annotations

import pytest

from tests.structured_output.schemas import PROMPTS, SCHEMAS
from vllmx import LLM, SamplingParams
from vllmx.sampling_params import StructuredOutputsParams as SO
from vllmx.structured_output.backend_guidance import GuidanceGrammar

ENGINE = {"max_model_len": 1024, "kv_cache_memory_bytes": 64 << 20, "seed": 0}


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


REQUESTS = [  # (messages, params)
    (chat("Write a list of lowercase words about rivers."),
     SamplingParams(temperature=0, max_tokens=40, structured_outputs=SO(regex="[a-z ]{120}"))),
    # A format the model does not write unasked: its first choices are refused.
    (chat("What is your name?"),
     SamplingParams(temperature=0, max_tokens=12, structured_outputs=SO(regex="[A-Z]{3}-[0-9]{4}"))),
    (chat(PROMPTS["person"]),
     SamplingParams(temperature=0, max_tokens=250, structured_outputs=SO(json=SCHEMAS["person"]))),
    (chat("Is the sky blue? Answer yes or no."),
     SamplingParams(temperature=0, max_tokens=4, structured_outputs=SO(choice=["Yes", "No"]))),
    # Masked before sampling, beside the checked rows: a seeded row and one with logprobs.
    (chat(PROMPTS["product"]),
     SamplingParams(temperature=0.8, seed=3, max_tokens=250,
                    structured_outputs=SO(json=SCHEMAS["product"]))),
    (chat("Write a list of lowercase words about birds."),
     SamplingParams(temperature=0, max_tokens=20, logprobs=2,
                    structured_outputs=SO(regex="[a-z ]{80}"))),
]


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    return LLM(smollm2_gguf, **ENGINE)


def run(llm, monkeypatch, masks_on_thread: bool):
    """The outputs, the checks' answers (allows: True / False / None) and the rows masked."""
    runner = llm.llm_engine.model_runner
    manager = runner.structured_output_manager or llm.llm_engine.structured_output_manager
    answers, masked = [], [0]
    allows, bitmask = GuidanceGrammar.allows, type(manager).grammar_bitmask

    def counted_allows(self, token):
        answers.append(allows(self, token))
        return answers[-1]

    def counted_bitmask(self, grammars, drafts=None, parallel=True):
        masked[0] += len(grammars)
        return bitmask(self, grammars, drafts, parallel)

    with monkeypatch.context() as m:
        m.setattr(GuidanceGrammar, "allows", counted_allows)
        m.setattr(type(manager), "grammar_bitmask", counted_bitmask)
        m.setattr(runner, "masks_on_thread", masks_on_thread)
        outs = llm.chat([r[0] for r in REQUESTS], [r[1] for r in REQUESTS], use_tqdm=False)
    return outs, answers, masked[0]


def test_checked_rows_give_the_masked_tokens(llm, monkeypatch):
    want, answers, masked = run(llm, monkeypatch, masks_on_thread=True)
    assert not answers and masked > 100  # every constrained row masked
    got, answers, checked_masked = run(llm, monkeypatch, masks_on_thread=False)
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids, w.outputs[0].text
        assert g.outputs[0].finish_reason == w.outputs[0].finish_reason
    assert got[5].outputs[0].logprobs == want[5].outputs[0].logprobs
    n_true, n_false, n_none = (answers.count(x) for x in (True, False, None))
    # Most checks pass; some tokens are refused (sampled again over the mask), and some states
    # force bytes (only the mask tells); the seeded and logprobs rows stay masked.
    assert n_true >= 2 * (n_false + n_none) and n_false >= 2 and n_none >= 1, answers
    assert checked_masked < masked - n_true // 2
    text = got[1].outputs[0].text
    assert len(text) == 8 and text[3] == "-" and text[:3].isupper() and text[4:].isdigit()
