"""The engine issue's acceptance run: 24 mixed requests (half share a long system prompt,
max_tokens vary) batched with max_num_seqs=6, max_num_batched_tokens=64 and a KV cache too
small for all of them give exactly each request's tokens when run alone — with chunked
prefill, prefix-cache hits and preemption all happening. Once for a dense model (Qwen3), once
for a mixture-of-experts one (Qwen3-MoE: the tokens' experts grouped across the batch) and once
for DeepSeek V3's shape (MLA's latent cache, grouped routing, shared experts)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

pytest.importorskip("torch")


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe", "deepseek_v3"])
def model_dir(tmp_path_factory, request) -> str:
    return make_checkpoint(request.param, "float32", str(tmp_path_factory.mktemp("inv")))


def make_requests(rng):
    system = rng.integers(3, VOCAB, 70).tolist()  # 4 full blocks + a partial one
    reqs = []
    for i in range(24):
        tail = rng.integers(3, VOCAB, int(rng.integers(2, 30))).tolist()
        prompt = system + tail if i % 2 == 0 else tail + system[:10]
        reqs.append(({"prompt_token_ids": prompt}, int(rng.integers(4, 40))))
    return reqs


def test_24_mixed_requests_batched_equal_alone(model_dir):
    from vllmx import LLM, SamplingParams

    rng = np.random.default_rng()
    reqs = make_requests(rng)
    llm = LLM(model_dir, skip_tokenizer_init=True, max_num_seqs=6, max_num_batched_tokens=64,
              num_gpu_blocks_override=14, block_size=16, max_model_len=224)
    greedy = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in reqs]
    seeded = [SamplingParams(temperature=0.9, top_k=40, seed=100 + i, max_tokens=n,
                             ignore_eos=True) for i, (_, n) in enumerate(reqs)]
    prompts = [p for p, _ in reqs]

    engine = llm.llm_engine
    batched = llm.generate(prompts, greedy)
    assert engine.scheduler.num_preemptions > 0, "the cache was meant to be too small"
    shared = [o for i, o in enumerate(batched) if i % 2 == 0]
    assert all(o.num_cached_tokens > 0 for o in shared[1:])
    batched_seeded = llm.generate(prompts, seeded)

    llm.reset_prefix_cache()
    for i, p in enumerate(prompts):
        alone = llm.generate([p], [greedy[i]])[0]
        assert alone.outputs[0].token_ids == batched[i].outputs[0].token_ids, f"request {i}"
        assert len(alone.outputs[0].token_ids) == reqs[i][1]
        alone_seeded = llm.generate([p], [seeded[i]])[0]
        assert alone_seeded.outputs[0].token_ids == batched_seeded[i].outputs[0].token_ids
    # Everything was freed (cached blocks stay reusable, none held).
    assert engine.scheduler.kv_cache_manager.num_free_blocks == 14
