"""Automatic prefix caching end to end on a tiny random Llama: requests sharing a long prefix
hit the cache after the first, and their greedy tokens equal those they produce alone with
prefix caching off (also through chunked prefill and preemption)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

pytest.importorskip("torch")

BS = 16


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from vllmx import LLM

    path = make_checkpoint("llama", "float32", str(tmp_path_factory.mktemp("apc")))
    # A small budget: prefills are chunked.
    llm = LLM(path, skip_tokenizer_init=True, num_gpu_blocks_override=24, block_size=BS,
              max_model_len=256, max_num_batched_tokens=48, max_num_seqs=8)
    return llm.llm_engine


def set_prefix_caching(engine, enabled: bool, num_blocks: int = 24) -> None:
    """A fresh KV cache manager (a pool of the first num_blocks blocks of the KV cache)."""
    from vllmx.core.kv_cache_manager import KVCacheManager

    s = engine.scheduler
    assert not s.has_unfinished_requests()
    s.kv_cache_manager = KVCacheManager(num_blocks, s.block_size, enabled, s.max_model_len)


def run(engine, prompts, max_tokens=6):
    """Generates greedily; returns each request's tokens and num_cached_tokens."""
    from vllmx import SamplingParams

    reqs = []
    for p in prompts:
        sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        rid = engine.add_request(None, {"prompt_token_ids": p}, sp)
        reqs.append(engine.scheduler.requests[rid])
    while engine.has_unfinished_requests():
        engine.step()
    return [r.output_token_ids for r in reqs], [r.num_cached_tokens for r in reqs]


def test_shared_prefix_hits_and_tokens_match_uncached(engine):
    rng = np.random.default_rng(3)
    prefix = rng.integers(3, VOCAB, 70).tolist()  # 4 full blocks + 6 tokens
    prompts = [prefix + rng.integers(3, VOCAB, n).tolist() for n in (5, 12, 30, 1)]
    prompts.append(prefix[:64])  # exactly the 4 full blocks: the last one is recomputed
    prompts.append(rng.integers(3, VOCAB, 40).tolist())  # unrelated

    set_prefix_caching(engine, False)
    alone = [run(engine, [p])[0][0] for p in prompts]

    set_prefix_caching(engine, True)
    first, cached = run(engine, prompts[:1])
    assert first == alone[:1] and cached == [0]
    toks, cached = run(engine, prompts[1:])
    assert toks == alone[1:]
    assert cached == [64, 64, 64, 48, 0]
    stats = engine.scheduler.kv_cache_manager.prefix_cache_stats
    assert stats.hits == 64 * 3 + 48 and stats.queries == sum(len(p) for p in prompts)
    kv = engine.scheduler.kv_cache_manager
    assert kv.num_free_blocks == 24 and kv.usage == 0.0
    assert engine.scheduler.reset_prefix_cache() is True
    assert run(engine, prompts[:1])[1] == [0]


def test_tokens_match_uncached_under_preemption(engine):
    rng = np.random.default_rng(4)
    prefix = rng.integers(3, VOCAB, 40).tolist()
    prompts = [prefix + rng.integers(3, VOCAB, n).tolist() for n in (30, 2, 45, 20, 9, 33)]
    set_prefix_caching(engine, False)
    alone = [run(engine, [p], max_tokens=12)[0][0] for p in prompts]
    # 10 blocks cannot hold all six at once: preempted requests resume from cached blocks.
    set_prefix_caching(engine, True, num_blocks=10)
    before = engine.scheduler.num_preemptions
    toks, cached = run(engine, prompts, max_tokens=12)
    assert toks == alone
    assert engine.scheduler.num_preemptions > before
    assert sum(c > 0 for c in cached) >= 3
    assert engine.scheduler.kv_cache_manager.prefix_cache_stats.preempted_hits > 0
