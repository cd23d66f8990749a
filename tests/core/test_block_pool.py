"""The native BlockPool: refcounts, LRU free queue, hash map, eviction, errors; and the block
hash chain."""

from __future__ import annotations

import pytest

from vllmx._C import BlockPool
from vllmx.core.block_hash import NONE_HASH, hash_block_tokens, update_block_hashes
from vllmx.engine.request import Request
from vllmx.sampling_params import SamplingParams


def h(i: int) -> bytes:
    return hash_block_tokens(None, [i])


def test_refcounts_and_free_queue():
    pool = BlockPool(4)
    assert pool.num_free_blocks == 4 and pool.usage == 0.0
    assert pool.get_new_blocks(2) == [0, 1]
    assert [pool.ref_cnt(b) for b in range(4)] == [1, 1, 0, 0]
    assert pool.free_block_ids() == [2, 3] and pool.usage == 0.5
    pool.touch([0])
    assert pool.ref_cnt(0) == 2
    pool.free_blocks([0])
    assert pool.ref_cnt(0) == 1 and pool.num_free_blocks == 2  # still in use
    pool.free_blocks([1, 0])  # a request's blocks, reversed: the tail end goes first
    # Uncached: reused first (before never-used 2 and 3), so that few KV pages are ever touched.
    assert pool.free_block_ids() == [1, 0, 2, 3]
    assert pool.num_free_blocks == 4


def test_uncached_blocks_are_reused_before_fresh_and_cached_ones():
    pool = BlockPool(100)
    seen = set()
    for i in range(50):  # requests of 1..5 blocks, one after another, none cached
        blocks = pool.get_new_blocks(1 + i % 5)
        seen.update(blocks)
        pool.free_blocks(blocks[::-1])
    assert seen == {0, 1, 2, 3, 4}  # never more blocks than were in use at once
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks[:1], [h(0)])
    pool.free_blocks(blocks[::-1])
    head = pool.free_block_ids()
    assert head[:2] == blocks[:0:-1] and head[-1] == blocks[0]  # the cached one: evicted last


def test_lru_eviction_order_is_lazy():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(4)
    assert pool.cache_full_blocks(blocks[:2], [h(0), h(1)]) == 2
    pool.free_blocks(blocks[::-1])
    assert pool.free_block_ids() == [3, 2, 1, 0]
    # Cached blocks stay cached while free; popping uncached ones first evicts nothing.
    assert pool.get_new_blocks(2) == [3, 2]
    assert pool.get_cached_block(h(1)) == 1 and pool.num_cached_blocks == 2
    # Popping block 1 for reuse evicts its hash then; block 0 (the prefix) survives.
    assert pool.get_new_blocks(1) == [1]
    assert pool.get_cached_block(h(1)) is None and pool.block_hash(1) is None
    assert pool.get_cached_block(h(0)) == 0 and pool.block_hash(0) == h(0)


def test_prefix_hit_removes_from_middle_and_returns_to_tail():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks([blocks[1]], [h(1)])
    pool.free_blocks(blocks[::-1])
    assert pool.free_block_ids() == [3, 2, 0, 1]
    hit = pool.get_cached_block(h(1))
    pool.touch([hit])  # a hit on a free cached block: unlinked from the middle
    assert pool.free_block_ids() == [3, 2, 0] and pool.ref_cnt(1) == 1
    pool.touch([hit])  # a second sharer
    assert pool.ref_cnt(1) == 2 and pool.num_free_blocks == 3
    pool.free_blocks([1, 1])
    assert pool.free_block_ids() == [3, 2, 0, 1]  # most recently used: evicted last
    assert pool.get_cached_block(h(1)) == 1


def test_find_cached_prefix_stops_at_first_miss():
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks([blocks[0], blocks[1], blocks[3]], [h(0), h(1), h(3)])
    assert pool.find_cached_prefix([h(0), h(1), h(2), h(3)], 10) == [0, 1]
    assert pool.find_cached_prefix([h(0), h(1)], 1) == [0]
    assert pool.find_cached_prefix([h(9), h(0)], 10) == []


def test_duplicate_hash_is_not_registered_twice():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    assert pool.cache_full_blocks([a], [h(7)]) == 1
    assert pool.cache_full_blocks([b], [h(7)]) == 0  # same content computed twice
    assert pool.get_cached_block(h(7)) == a and pool.block_hash(b) is None
    assert pool.cache_full_blocks([a], [h(7)]) == 0  # already cached: a no-op
    with pytest.raises(ValueError, match="cache_full_blocks.*different hash"):
        pool.cache_full_blocks([a], [h(8)])


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [h(0), h(1)])
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(h(0)) == 0  # untouched
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.num_cached_blocks == 0 and pool.get_cached_block(h(0)) is None
    assert pool.block_hash(0) is None and pool.num_free_blocks == 3


def test_caching_disabled_registers_nothing():
    pool = BlockPool(2, enable_caching=False)
    a, _ = pool.get_new_blocks(2)
    assert pool.cache_full_blocks([a], [h(0)]) == 0
    assert pool.get_cached_block(h(0)) is None
    assert pool.find_cached_prefix([h(0)], 1) == []


def test_errors_name_the_op_and_change_nothing():
    pool = BlockPool(3)
    a = pool.get_new_blocks(1)[0]
    with pytest.raises(ValueError, match="get_new_blocks.*asked for 3.*only 2"):
        pool.get_new_blocks(3)
    with pytest.raises(ValueError, match="touch.*out of range"):
        pool.touch([0, 5])
    assert pool.ref_cnt(0) == 1  # the valid id before the bad one was not touched
    with pytest.raises(ValueError, match="free_blocks.*double free"):
        pool.free_blocks([a, a])
    assert pool.ref_cnt(a) == 1 and pool.num_free_blocks == 2
    pool.free_blocks([a])
    with pytest.raises(ValueError, match="free_blocks.*double free"):
        pool.free_blocks([a])
    with pytest.raises(ValueError, match="free_blocks.*out of range"):
        pool.free_blocks([-1])
    with pytest.raises(ValueError, match="cache_full_blocks.*free"):
        pool.cache_full_blocks([a], [h(0)])
    with pytest.raises(ValueError, match="cache_full_blocks.*1 blocks but 2 hashes"):
        pool.cache_full_blocks([a], [h(0), h(1)])
    with pytest.raises(ValueError, match="get_cached_block.*16 bytes"):
        pool.get_cached_block(b"short")
    with pytest.raises(ValueError, match="ref_cnt.*out of range"):
        pool.ref_cnt(3)
    with pytest.raises(ValueError, match="__init__"):
        BlockPool(0)
    assert pool.num_free_blocks == 3


def test_hash_chain():
    toks = [1, 2, 3, 4]
    base = hash_block_tokens(None, toks)
    assert len(base) == 16 and base == hash_block_tokens(NONE_HASH, toks)
    assert base == hash_block_tokens(None, list(toks))  # deterministic
    assert hash_block_tokens(None, toks, ("salt-a",)) != base
    assert hash_block_tokens(None, toks, ("salt-a",)) != hash_block_tokens(None, toks, ("salt-b",))
    assert hash_block_tokens(h(1), toks) != hash_block_tokens(h(2), toks)  # parents differ
    assert hash_block_tokens(None, [1, 2, 3, 5]) != base
    assert hash_block_tokens(None, [1, 2], ("1",)) != hash_block_tokens(None, [1, 2], (1,))


def test_request_block_hashes_grow_incrementally_over_full_blocks():
    req = Request("r", list(range(10)), SamplingParams(), cache_salt=None)
    salted = Request("s", list(range(10)), SamplingParams(), cache_salt="tenant")
    hs = update_block_hashes(req, 4)
    assert len(hs) == 2 and hs is req.block_hashes  # 10 tokens: two full blocks of 4
    assert hs[0] == hash_block_tokens(None, [0, 1, 2, 3])
    assert hs[1] == hash_block_tokens(hs[0], [4, 5, 6, 7])
    first = list(hs)
    req.append_output_token(10, 0.0)
    req.append_output_token(11, 0.0)
    assert update_block_hashes(req, 4)[:2] == first and len(req.block_hashes) == 3
    sh = update_block_hashes(salted, 4)
    assert sh[0] != first[0] and sh[1] != first[1]  # the salt keys the whole chain
