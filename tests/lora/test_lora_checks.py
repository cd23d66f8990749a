"""What vllmx refuses by name (DoRA, modules_to_save, embedding / lm_head targets, a rank
above max_lora_rank, LoRA not enabled, a GGUF base), the adapter id in the block hash, and the scheduler's
max_loras rule."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tests.lora.adapters import make_adapter
from tests.models.tiny_checkpoints import make_checkpoint

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def base_and_adapter(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lora-checks"))
    base = make_checkpoint("llama", "float32", out)
    return base, make_adapter(base, out, "all"), out


@pytest.fixture(scope="module")
def llm(base_and_adapter):
    from vllmx import LLM

    return LLM(base_and_adapter[0], skip_tokenizer_init=True, enable_lora=True, max_loras=1,
               max_lora_rank=8)


def _variant(path: str, out: str, name: str, **config) -> str:
    dst = os.path.join(out, name)
    shutil.copytree(path, dst, dirs_exist_ok=True)
    with open(os.path.join(dst, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg.update(config)
    with open(os.path.join(dst, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    return dst


@pytest.mark.parametrize("config, match", [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"target_modules": ["q_proj", "lm_head"]}, "target module 'lm_head'"),
    ({"bias": "all"}, "bias='all'"),
])
def test_refused_configs(llm, base_and_adapter, config, match):
    from vllmx import SamplingParams
    from vllmx.lora.request import LoRARequest

    _, path, out = base_and_adapter
    bad = _variant(path, out, "bad-" + next(iter(config)), **config)
    with pytest.raises(ValueError, match=match):
        llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=2),
                     lora_request=LoRARequest("bad", 9, bad))
    assert not llm.llm_engine.has_unfinished_requests()


def test_rank_above_max_and_embedding_tensors(base_and_adapter):
    from vllmx import LLM, SamplingParams
    from vllmx.lora.request import LoRARequest

    base, path, out = base_and_adapter  # the "all" adapter has rank 8
    small = LLM(base, skip_tokenizer_init=True, enable_lora=True, max_lora_rank=4)
    with pytest.raises(ValueError, match="rank 8 is greater than max_lora_rank 4"):
        small.generate({"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=1),
                       lora_request=LoRARequest("all", 1, path))
    emb = make_adapter(base, out, "emb", target_modules=["embed_tokens", "q_proj"], r=4)
    with open(os.path.join(emb, "adapter_config.json")) as f:  # the check on the tensors too
        cfg = json.load(f)
    cfg["target_modules"] = ["q_proj"]
    with open(os.path.join(emb, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match="embed_tokens"):
        small.generate({"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=1),
                       lora_request=LoRARequest("emb", 2, emb))


def test_lora_needs_enable_lora(base_and_adapter):
    from vllmx import LLM, SamplingParams
    from vllmx.lora.request import LoRARequest

    base, path, _ = base_and_adapter
    plain = LLM(base, skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        plain.generate({"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=1),
                       lora_request=LoRARequest("all", 1, path))
    with pytest.raises(ValueError, match="lora_int_id must be an int > 0"):
        LoRARequest("x", 0, path)


def test_block_hash_keyed_by_adapter():
    from vllmx.core.block_hash import update_block_hashes
    from vllmx.engine.request import Request
    from vllmx.lora.request import LoRARequest
    from vllmx.sampling_params import SamplingParams

    tokens = list(range(40))
    hashes = [update_block_hashes(Request(str(i), tokens, SamplingParams(), lora_request=lora),
                                  16)
              for i, lora in enumerate([None, LoRARequest("a", 1, "/a"),
                                        LoRARequest("b", 2, "/b"), LoRARequest("a", 1, "/a")])]
    assert len(hashes[0]) == 2
    assert hashes[0] != hashes[1] and hashes[1] != hashes[2] and hashes[1] == hashes[3]
    assert not set(hashes[0]) & set(hashes[1])  # every block differs, not only the chain


def test_max_loras_per_step(llm, base_and_adapter):
    """max_loras=1: requests of a second adapter wait for a step without the first; every
    request still gets the tokens it gets alone."""
    from vllmx import SamplingParams
    from vllmx.lora.request import LoRARequest

    base, path, out = base_and_adapter
    second = make_adapter(base, out, "qv", seed=3)
    loras = [LoRARequest("all", 1, path), LoRARequest("qv", 2, second)]
    engine = llm.llm_engine
    seen = []
    step = engine.model_runner.execute_model

    def spy(so, *a, **kw):
        seen.append({engine.scheduler.requests[r].lora_int_id for r in so.num_scheduled_tokens
                     if r in engine.scheduler.requests} - {0})
        return step(so, *a, **kw)

    engine.model_runner.execute_model = spy
    try:
        prompts = np.random.default_rng(0).integers(3, 500, (4, 12)).tolist()
        sp = SamplingParams(temperature=0, max_tokens=6)
        mixed = llm.generate([{"prompt_token_ids": p} for p in prompts], sp,
                             lora_request=[loras[i % 2] for i in range(4)])
    finally:
        engine.model_runner.execute_model = step
    assert all(len(s) <= 1 for s in seen) and {1} in seen and {2} in seen
    for i, (p, out) in enumerate(zip(prompts, mixed)):
        alone = llm.generate({"prompt_token_ids": p}, sp, lora_request=loras[i % 2])
        assert out.outputs[0].token_ids == alone[0].outputs[0].token_ids


def test_remove_while_running(llm, base_and_adapter):
    """An adapter removed while a request runs with it: the request finishes under it, with
    the tokens it gets otherwise (the runner loads the adapter again from the request)."""
    from vllmx import SamplingParams
    from vllmx.lora.request import LoRARequest

    _, path, _ = base_and_adapter
    lora = LoRARequest("all", 1, path)
    sp = SamplingParams(temperature=0, max_tokens=8)
    prompt = {"prompt_token_ids": list(range(10, 30))}
    want = llm.generate(prompt, sp, lora_request=lora)[0].outputs[0].token_ids
    engine = llm.llm_engine
    rid = engine.add_request(None, prompt, sp, lora_request=lora)
    engine.step()
    assert engine.remove_lora(1) and 1 not in engine.list_loras()
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert done[rid].outputs[0].token_ids == want


def test_an_adapter_that_cannot_be_reloaded_fails_its_requests_only(llm, base_and_adapter):
    """A queued request's adapter evicted from the loaded ones (max_cpu_loras 1) and its files
    gone before the request runs: the request fails naming it (finish_reason "error"), a
    base-model request in the same steps gets its tokens, and the engine goes on serving."""
    from vllmx import SamplingParams
    from vllmx.lora.request import LoRARequest

    _, path, out = base_and_adapter
    gone_dir = shutil.copytree(path, os.path.join(out, "soon-gone"))
    gone, kept = LoRARequest("soon-gone", 41, gone_dir), LoRARequest("all", 42, path)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(10, 30))}
    want_kept = llm.generate(prompt, sp, lora_request=kept)[0].outputs[0].token_ids
    want_base = llm.generate(prompt, sp)[0].outputs[0].token_ids
    engine = llm.llm_engine
    rid = engine.add_request(None, prompt, sp, lora_request=gone)  # (loaded here)
    engine.add_lora(kept)  # evicts it
    shutil.rmtree(gone_dir)
    base_rid = engine.add_request(None, prompt, sp)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert done[rid].outputs[0].finish_reason == "error"
    assert done[base_rid].outputs[0].token_ids == want_base
    assert llm.generate(prompt, sp, lora_request=kept)[0].outputs[0].token_ids == want_kept


def test_other_architectures_refused(tmp_path):
    from vllmx import LLM

    path = make_checkpoint("gpt2", "float32", str(tmp_path))
    with pytest.raises(ValueError, match="LoRA is not supported for GPT2"):
        LLM(path, skip_tokenizer_init=True, enable_lora=True)


def test_pooling_model_refused(minilm_dir):
    from vllmx import LLM

    with pytest.raises(ValueError, match="not supported for pooling models"):
        LLM(minilm_dir, enable_lora=True)
