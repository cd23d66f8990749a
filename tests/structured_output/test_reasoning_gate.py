"""Structured outputs after the reasoning (vLLM's structured_outputs_config reasoning_parser):
the matcher waits for the parser's end marker in the generated tokens and constrains what
follows; a prompt that has closed the reasoning already is constrained from the start;
enable_in_reasoning constrains everything; `vllmx serve --reasoning-parser` sets it."""

from __future__ import annotations

import json

import pytest

from tests.structured_output.test_backend_guidance import allowed
from vllmx.config import StructuredOutputsConfig
from vllmx.sampling_params import SamplingParams
from vllmx.sampling_params import StructuredOutputsParams as SO
from vllmx.structured_output import StructuredOutputManager
from vllmx.tokenizer.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    return Tokenizer.from_gguf_file(smollm2_gguf)


def manager(tokenizer, **cfg):
    return StructuredOutputManager(tokenizer, tokenizer.vocab_size, {tokenizer.eos_token_id},
                                   StructuredOutputsConfig.from_dict(cfg))


def test_constraint_starts_after_the_end_marker(tokenizer):
    m = manager(tokenizer, reasoning_parser="deepseek_r1")
    so = SO(json=SCHEMA)
    plain = m.grammar_init(so)  # no prompt: reasoning not closed, so gated
    assert not plain.active
    free = set(range(tokenizer.vocab_size))
    reasoning = tokenizer.encode("Paris is in France, so", add_special_tokens=False)
    end = tokenizer.encode("</think>", add_special_tokens=False)
    answer = tokenizer.encode('{"city": "Paris"}', add_special_tokens=False)
    assert len(end) > 1  # SmolLM2 splits the marker: it is matched across steps
    for t in reasoning + end[:-1]:  # one token a step, as the runner feeds them
        assert plain.accept_tokens([t]) and not plain.active
    assert plain.accept_tokens([end[-1]]) and plain.active
    ungated = manager(tokenizer).grammar_init(so)
    assert allowed(m, plain) == allowed(m, ungated) < free
    for t in answer:
        assert t in allowed(m, plain)
        assert plain.accept_tokens([t])
    assert tokenizer.eos_token_id in allowed(m, plain)

    # The marker and the answer's first tokens in one step: those after the marker count.
    g = m.grammar_init(so)
    assert g.accept_tokens(reasoning + end + answer[:2]) and g.active
    ungated.accept_tokens(answer[:2])
    assert allowed(m, g) == allowed(m, ungated)


def test_prompt_that_closed_the_reasoning_and_enable_in_reasoning(tokenizer):
    so = SO(json=SCHEMA)
    m = manager(tokenizer, reasoning_parser="qwen3")
    off = tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n",
                           add_special_tokens=False)
    assert m.grammar_init(so, off).active  # thinking off in the template: constrained now
    on = tokenizer.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    assert not m.grammar_init(so, on).active
    assert manager(tokenizer, reasoning_parser="qwen3",
                   enable_in_reasoning=True).grammar_init(so, on).active


def test_engine_leaves_the_reasoning_free_and_constrains_the_answer(smollm2_gguf, tokenizer):
    from vllmx import LLM

    llm = LLM(model=smollm2_gguf, max_model_len=256, kv_cache_memory_bytes=16 << 20, seed=0,
              structured_outputs_config={"reasoning_parser": "deepseek_r1"})
    params = {"temperature": 0, "max_tokens": 24}
    so = SO(json=SCHEMA)
    thinking = "Question: where is the Eiffel tower?\nLet me think step by step."
    free = llm.generate([thinking], SamplingParams(**params))[0].outputs[0]
    gated = llm.generate([thinking], SamplingParams(**params, structured_outputs=so))[0]
    assert "</think>" not in free.text
    assert gated.outputs[0].token_ids == free.token_ids  # reasoning: no mask
    closed = thinking + " It is in Paris.\n</think>\n"
    ids = tokenizer.encode(closed)
    end = tokenizer.encode("</think>", add_special_tokens=False)
    assert any(ids[i:i + len(end)] == end for i in range(len(ids)))
    out = llm.generate([closed], SamplingParams(temperature=0, max_tokens=40,
                                                structured_outputs=so))[0].outputs[0]
    assert set(json.loads(out.text)) == {"city"}, out.text


def test_serve_reasoning_parser_reaches_the_engine_config():
    import argparse

    from vllmx.cli.serve import add_serve_parser, engine_args_from

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    for flags, want in ((["--reasoning-parser", "qwen3"], ("qwen3", False)),
                        (["--reasoning-parser", "qwen3", "--structured-outputs-config",
                          '{"enable_in_reasoning": true}'], ("qwen3", True)),
                        ([], ("", False))):
        cfg = engine_args_from(parser.parse_args(["serve", *flags])) \
            .create_engine_config().structured_outputs_config
        assert (cfg.reasoning_parser, cfg.enable_in_reasoning) == want


def test_drafts_stop_at_the_token_that_closes_the_reasoning(tokenizer):
    """Before the end marker, drafts are free up to the token that would complete it (that
    token is sampled unconstrained; the grammar constrains what follows); after it, the
    grammar cuts them."""
    m = manager(tokenizer, reasoning_parser="deepseek_r1")
    g = m.grammar_init(SO(json=SCHEMA))
    reasoning = tokenizer.encode("Paris is in France, so", add_special_tokens=False)
    end = tokenizer.encode("</think>", add_special_tokens=False)
    assert g.draft_prefix(reasoning) == len(reasoning)
    assert g.draft_prefix(reasoning[:2] + end + reasoning) == 2 + len(end) - 1
    assert g.accept_tokens(reasoning[:3] + end[:-1])
    assert g.draft_prefix(end[-1:] + reasoning) == 0  # (the marker's last token closes it)
    assert g.accept_tokens(end[-1:]) and g.active
    answer = tokenizer.encode('{"city": "Paris"}', add_special_tokens=False)
    assert g.draft_prefix(answer) == len(answer)
    assert g.draft_prefix(reasoning) == 0
