"""LoRA through the server (vLLM's flags and endpoints): --lora-modules served by name and
listed in /v1/models with their parent, the adapter chosen by the request's `model`, and
/v1/load_lora_adapter / /v1/unload_lora_adapter (only with allow_runtime_lora_updating)."""

from __future__ import annotations

import json
import os
import shutil

import httpx
import numpy as np
import openai
import pytest

from tests.lora.adapters import make_adapter
from tests.models.tiny_checkpoints import make_checkpoint
from tests.server.conftest import serving

pytest.importorskip("peft")

BASE = "tiny-llama"
PROMPT = np.random.default_rng(7).integers(3, 500, 24).tolist()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lora-server"))
    base = make_checkpoint("llama", "float32", out)
    return base, make_adapter(base, out, "all", seed=1), make_adapter(base, out, "qv", seed=2)


def engine(base: str, **kw):
    from vllmx.engine.arg_utils import EngineArgs
    from vllmx.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(EngineArgs(
        model=base, skip_tokenizer_init=True, max_model_len=256,
        kv_cache_memory_bytes=16 << 20, max_lora_rank=16, **kw))


def offline_tokens(base: str, lora) -> list[int]:
    from vllmx import LLM, SamplingParams

    llm = LLM(base, skip_tokenizer_init=True, enable_lora=True, max_lora_rank=16)
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0, max_tokens=8),
                       lora_request=lora)
    return list(out[0].outputs[0].token_ids)


def served_tokens(client: openai.OpenAI, model: str) -> list[int]:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                  logprobs=0)
    return [int(t.removeprefix("token_id:")) for t in r.choices[0].logprobs.tokens]


def test_lora_modules_models_and_load_unload(paths):
    from vllmx.lora.request import LoRARequest
    from vllmx.server.serving_models import LoRAModulePath

    base, all_path, qv_path = paths
    with serving(engine(base, enable_lora=True, max_loras=2), [BASE],
                 lora_modules=[LoRAModulePath("all", all_path)],
                 allow_runtime_lora_updating=True, return_tokens_as_token_ids=True) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="EMPTY", max_retries=0)
        cards = {m.id: m for m in client.models.list().data}
        assert set(cards) == {BASE, "all"}
        assert cards["all"].parent == BASE and cards["all"].root == all_path
        assert cards[BASE].parent is None

        got_all = served_tokens(client, "all")
        assert got_all == offline_tokens(base, LoRARequest("all", 1, all_path))
        assert served_tokens(client, BASE) == offline_tokens(base, None) != got_all
        with pytest.raises(openai.NotFoundError, match="`qv` does not exist"):
            served_tokens(client, "qv")

        r = httpx.post(f"{s.url}/v1/load_lora_adapter",
                       json={"lora_name": "qv", "lora_path": qv_path})
        assert r.status_code == 200 and "added successfully" in r.text
        assert "qv" in {m.id for m in client.models.list().data}
        assert served_tokens(client, "qv") == offline_tokens(base, LoRARequest("qv", 5, qv_path))
        again = httpx.post(f"{s.url}/v1/load_lora_adapter",
                           json={"lora_name": "qv", "lora_path": qv_path})
        assert again.status_code == 400 and "already been loaded" in again.text
        bad = httpx.post(f"{s.url}/v1/load_lora_adapter",
                         json={"lora_name": "nope", "lora_path": base})
        assert bad.status_code == 400 and "adapter_config.json" in bad.text
        assert "nope" not in {m.id for m in client.models.list().data}

        r = httpx.post(f"{s.url}/v1/unload_lora_adapter", json={"lora_name": "qv"})
        assert r.status_code == 200 and "removed successfully" in r.text
        assert {m.id for m in client.models.list().data} == {BASE, "all"}
        with pytest.raises(openai.NotFoundError):
            served_tokens(client, "qv")
        r = httpx.post(f"{s.url}/v1/unload_lora_adapter", json={"lora_name": "qv"})
        assert r.status_code == 404 and "cannot be found" in r.text


def test_beam_search_under_the_requests_adapter(paths):
    """use_beam_search with an adapter's `model`: LLM.beam_search's beams under that adapter."""
    from vllmx import LLM, BeamSearchParams
    from vllmx.lora.request import LoRARequest
    from vllmx.server.serving_models import LoRAModulePath

    base, all_path, _ = paths
    llm = LLM(base, skip_tokenizer_init=True, enable_lora=True, max_lora_rank=16)
    want = llm.beam_search([{"prompt_token_ids": PROMPT}],
                           BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True),
                           lora_request=LoRARequest("all", 1, all_path))[0].sequences
    with serving(engine(base, enable_lora=True), [BASE],
                 lora_modules=[LoRAModulePath("all", all_path)],
                 return_tokens_as_token_ids=True) as s:
        r = httpx.post(f"{s.url}/v1/completions", json={
            "model": "all", "prompt": PROMPT, "max_tokens": 6, "n": 2, "use_beam_search": True,
            "ignore_eos": True, "return_token_ids": True})
        assert r.status_code == 200, r.text
        got = [c["token_ids"] for c in r.json()["choices"]]
    assert got == [b.tokens[len(PROMPT):] for b in want]


def test_runtime_updating_is_gated(paths):
    base, _, qv_path = paths
    with serving(engine(base, enable_lora=True), [BASE]) as s:
        r = httpx.post(f"{s.url}/v1/load_lora_adapter",
                       json={"lora_name": "qv", "lora_path": qv_path})
        assert r.status_code == 404


def test_lora_flags_need_enable_lora(paths):
    from vllmx.server.app import build_app

    base, _, _ = paths
    client = engine(base)
    try:
        with pytest.raises(ValueError, match="need --enable-lora"):
            build_app(client, [BASE], allow_runtime_lora_updating=True)
    finally:
        client.shutdown()


def test_serve_lora_flags():
    import argparse

    from vllmx.cli.serve import add_serve_parser, engine_args_from
    from vllmx.config import LoRAConfig
    from vllmx.server.serving_models import LoRAModulePath, parse_lora_modules

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "m", "--enable-lora", "--lora-modules", "a=/x",
                              '{"name": "b", "path": "/y", "base_model_name": "m"}',
                              "--max-loras", "2", "--max-lora-rank", "32",
                              "--lora-dtype", "bfloat16"])
    ea = engine_args_from(args)
    assert (ea.enable_lora, ea.max_loras, ea.max_lora_rank, ea.lora_dtype) == (
        True, 2, 32, "bfloat16")
    with pytest.raises(ValueError, match="lora_dtype must be one of"):
        LoRAConfig(lora_dtype="int8")
    assert parse_lora_modules(args.lora_modules) == [LoRAModulePath("a", "/x"),
                                                     LoRAModulePath("b", "/y", "m")]
    with pytest.raises(ValueError, match="expected name=path"):
        parse_lora_modules(["just-a-path"])


def test_serve_lora_modules_need_enable_lora():
    from tests.server.test_cli_serve import _run

    out = _run("some-model", "--lora-modules", "a=/x")
    assert out.wait(timeout=60) != 0
    assert "need --enable-lora" in out.stdout.read()


def _with_word_tokenizer(base: str) -> str:
    """A copy of the tiny checkpoint with a word-level tokenizer (w0 ... w511) and a chat
    template, so that chat requests can reach it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out = base + "-tok"
    shutil.copytree(base, out, dirs_exist_ok=True)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(512)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "w1", "eos_token": "w2", "chat_template":
                   "{% for m in messages %}{{ m['content'] }} {% endfor %}"}, f)
    return out


def test_chat_under_adapter_streamed(paths):
    from vllmx.engine.arg_utils import EngineArgs
    from vllmx.engine.async_llm import AsyncLLM
    from vllmx.server.serving_models import LoRAModulePath

    base, all_path, _ = paths
    tok_base = _with_word_tokenizer(base)
    client_engine = AsyncLLM.from_engine_args(EngineArgs(
        model=tok_base, max_model_len=256, kv_cache_memory_bytes=16 << 20, enable_lora=True,
        max_lora_rank=16))
    with serving(client_engine, [BASE], lora_modules=[LoRAModulePath("all", all_path)]) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="EMPTY", max_retries=0)
        msgs = [{"role": "user", "content": " ".join(f"w{t}" for t in PROMPT)}]

        def chat(model: str, stream: bool) -> str:
            r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8,
                                               temperature=0, stream=stream)
            if not stream:
                return r.choices[0].message.content
            return "".join(c.choices[0].delta.content or "" for c in r if c.choices)

        lora_text = chat("all", False)
        assert chat("all", True) == lora_text
        assert chat(BASE, False) != lora_text
        with pytest.raises(openai.NotFoundError, match="`qv` does not exist"):
            chat("qv", False)
