"""KVCacheManager: prefix hits at block boundaries, the never-whole-prompt rule, eviction of
cached blocks under pressure, stats, and caching off."""

from __future__ import annotations

from vllmx.core.kv_cache_manager import KVCacheManager
from vllmx.engine.request import Request
from vllmx.sampling_params import SamplingParams

BS = 4


def req(rid: str, tokens, salt: str | None = None, **sp) -> Request:
    return Request(rid, list(tokens), SamplingParams(**sp), cache_salt=salt)


def run_prefill(kv: KVCacheManager, r: Request) -> list[int]:
    """Admits r with its prefix hit, computes its whole prompt, and caches its full blocks."""
    hit, n = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - n, hit) is not None
    r.num_computed_tokens = r.num_tokens
    kv.cache_blocks(r, r.num_computed_tokens)
    return kv.get_block_ids(r.request_id)


def test_prefix_hits_are_whole_blocks():
    kv = KVCacheManager(16, BS)
    a_blocks = run_prefill(kv, req("a", range(10)))  # 2 full blocks cached, 1 partial
    assert len(a_blocks) == 3
    cases = {  # tokens -> expected hit
        tuple(range(8)) + (50, 51): 8,  # shares two full blocks
        tuple(range(7)) + (50, 51, 52): 4,  # diverges inside block 2
        tuple(range(10)) + (60, 61, 62): 8,  # the partial third block is never cached
        (99,) + tuple(range(1, 10)): 0,  # differs in the first token
    }
    for i, (toks, want) in enumerate(cases.items()):
        blocks, n = kv.get_computed_blocks(req(f"b{i}", toks))
        assert n == want and blocks == a_blocks[: want // BS]


def test_use_eagle_recomputes_the_last_hit_block():
    """vLLM's use_eagle: a drafter's KV at a block's last position was made with the token after
    the block, which the hit does not fix, so the hit's last block is left to recompute."""
    kv = KVCacheManager(16, BS, use_eagle=True)
    a_blocks = run_prefill(kv, req("a", range(13)))  # 3 full blocks cached
    blocks, n = kv.get_computed_blocks(req("b", tuple(range(12)) + (50, 51)))
    assert (blocks, n) == (a_blocks[:2], 8)
    assert kv.get_computed_blocks(req("c", tuple(range(4)) + (70, 71))) == ([], 0)


def test_never_the_whole_prompt():
    kv = KVCacheManager(16, BS)
    run_prefill(kv, req("a", range(8)))  # exactly two full blocks, both cached
    blocks, n = kv.get_computed_blocks(req("b", range(8)))
    assert n == 4 and len(blocks) == 1  # the last block is recomputed: logits to sample
    blocks, n = kv.get_computed_blocks(req("c", range(9)))
    assert n == 8  # one more token: both blocks hit


def test_hits_are_shared_and_survive_free():
    kv = KVCacheManager(8, BS)
    a = req("a", range(9))
    a_blocks = run_prefill(kv, a)
    b = req("b", list(range(8)) + [70, 71])
    b_blocks = run_prefill(kv, b)
    assert b_blocks[:2] == a_blocks[:2] and b_blocks[2] != a_blocks[2]
    assert [kv.block_pool.ref_cnt(x) for x in a_blocks[:2]] == [2, 2]
    assert kv.num_free_blocks == 8 - 4
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 8 and kv.usage == 0.0
    _, n = kv.get_computed_blocks(req("c", range(12)))
    assert n == 8  # still cached after both finished


def test_free_returns_tail_blocks_first():
    kv = KVCacheManager(4, BS)
    a = req("a", range(12))
    blocks = run_prefill(kv, a)
    kv.free(a)
    assert kv.block_pool.free_block_ids()[-3:] == blocks[::-1]


def test_eviction_under_pressure_and_atomic_failure():
    kv = KVCacheManager(3, BS)
    a = req("a", range(8))
    run_prefill(kv, a)
    kv.free(a)  # 3 free blocks, 2 of them cached
    # A hit on 2 free cached blocks + 1 new block: 3 <= 3, succeeds.
    b = req("b", list(range(8)) + [9, 9, 9])
    hit, n = kv.get_computed_blocks(b)
    assert n == 8
    assert kv.allocate_slots(b, b.num_tokens - n, hit) == [2]
    kv.free(b)
    # Hit blocks that sit in the free queue cost free blocks: 2 + 2 new > 3 -> None, no change.
    c = req("c", list(range(8)) + [5] * 5)
    hit, n = kv.get_computed_blocks(c)
    assert n == 8 and kv.allocate_slots(c, c.num_tokens - n, hit) is None
    assert kv.num_free_blocks == 3 and kv.get_block_ids("c") == []
    assert kv.block_pool.num_cached_blocks == 2
    # Unrelated tokens need all 3 blocks: the cached ones are evicted to make room.
    d = req("d", [40] * 11)
    hit, n = kv.get_computed_blocks(d)
    assert n == 0 and kv.allocate_slots(d, d.num_tokens, hit) is not None
    assert kv.block_pool.num_cached_blocks == 0
    assert kv.get_computed_blocks(req("e", range(9))) == ([], 0)


def test_cache_salt_separates_tenants():
    kv = KVCacheManager(16, BS)
    run_prefill(kv, req("a", range(9), salt="x"))
    assert kv.get_computed_blocks(req("b", range(9), salt="x"))[1] == 8
    assert kv.get_computed_blocks(req("c", range(9), salt="y"))[1] == 0
    assert kv.get_computed_blocks(req("d", range(9)))[1] == 0


def test_blocks_are_cached_as_they_fill_during_decode():
    kv = KVCacheManager(16, BS)
    a = req("a", range(6))
    run_prefill(kv, a)
    assert kv.block_pool.num_cached_blocks == 1
    for t in (6, 7):  # decode two tokens: block 2 becomes full
        a.append_output_token(100 + t, 0.0)
        assert kv.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
        kv.cache_blocks(a, a.num_computed_tokens)
    assert kv.block_pool.num_cached_blocks == 2
    _, n = kv.get_computed_blocks(req("b", list(range(6)) + [106, 107, 1]))
    assert n == 8


def test_prefix_cache_stats():
    kv = KVCacheManager(16, BS)
    run_prefill(kv, req("a", range(10)))
    run_prefill(kv, req("b", list(range(8)) + [1, 2, 3, 4]))
    p = req("p", range(9))
    p.num_preemptions = 1  # a resumed request is counted apart
    run_prefill(kv, p)
    st = kv.prefix_cache_stats
    assert (st.requests, st.queries, st.hits) == (2, 22, 8)
    assert (st.preempted_requests, st.preempted_queries, st.preempted_hits) == (1, 9, 8)
    interval = kv.make_prefix_cache_stats()
    assert interval.queries == 22 and kv.make_prefix_cache_stats().queries == 0
    assert abs(st.hit_rate - 8 / 22) < 1e-12


def test_prompt_logprobs_skip_reading_the_cache():
    kv = KVCacheManager(16, BS)
    run_prefill(kv, req("a", range(9)))
    assert kv.get_computed_blocks(req("b", range(9), prompt_logprobs=1)) == ([], 0)
    run_prefill(kv, req("c", range(9), prompt_logprobs=1))
    assert kv.prefix_cache_stats.queries == 9  # only a's lookup counts


def test_reset_prefix_cache():
    kv = KVCacheManager(8, BS)
    a = req("a", range(9))
    run_prefill(kv, a)
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    assert kv.reset_prefix_cache() is True
    assert kv.get_computed_blocks(req("b", range(9))) == ([], 0)
    assert kv.make_prefix_cache_stats().reset


def test_caching_off_is_plain_allocation():
    kv = KVCacheManager(8, BS, enable_caching=False)
    a = req("a", range(9))
    assert len(run_prefill(kv, a)) == 3
    assert kv.block_pool.num_cached_blocks == 0 and a.block_hashes == []
    assert kv.get_computed_blocks(req("b", range(9))) == ([], 0)
    assert kv.prefix_cache_stats.queries == 0
