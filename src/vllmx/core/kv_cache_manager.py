"""Hands out fixed-size KV blocks to requests through the native BlockPool, with automatic
prefix caching (vLLM V1's KVCacheManager): a waiting request starts from the longest prefix of
its full blocks that is already cached; blocks become cached once their tokens are computed;
freed blocks stay cached in the LRU free queue until reused."""

from __future__ import annotations

from dataclasses import dataclass

from vllmx._C import BlockPool
from vllmx.core.block_hash import update_block_hashes
from vllmx.engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _skips_reading_cache(request: Request) -> bool:
    """SamplingParams.skip_reading_prefix_cache; by default, requests that want prompt logprobs
    (every prompt position must be computed for them)."""
    sp = request.sampling_params
    skip = getattr(sp, "skip_reading_prefix_cache", None)
    if skip is None:
        skip = getattr(sp, "prompt_logprobs", None) is not None
    return bool(skip)


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups, in tokens, as vLLM's prefix_cache_queries / prefix_cache_hits count
    them: one query of request.num_tokens per admission, hits the tokens found cached. Lookups
    of preempted requests that resume are counted apart (preempted_*), as vLLM does."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False  # reset_prefix_cache() succeeded in this interval (interval stats)

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 max_model_len: int | None = None, use_eagle: bool = False):
        self.num_blocks = num_blocks
        # vLLM's use_eagle: a drafter keeps KV in these blocks (eagle, eagle3, mtp), its KV at a
        # block's last position made with the token after it, which a hit's last block does
        # not fix: that block is recomputed (its KV rewritten with this request's next token).
        self.use_eagle = use_eagle
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len  # None: no cap on slots per request
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[int]] = {}
        # How many of each running request's leading blocks are registered in the cache.
        self.num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()  # cumulative
        self._interval_stats = PrefixCacheStats()  # since the last make_prefix_cache_stats()

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of KV blocks in use by requests (cached free blocks count as free)."""
        return self.block_pool.usage

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.req_to_blocks.get(request_id, [])

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The cached blocks of the longest prefix of the request's full blocks, and how many
        tokens they hold. Never the whole request: at least its last token is recomputed, so
        that the step has logits to sample from. Nothing for requests that skip reading the
        cache (see _skips_reading_cache); those are not counted in the stats either."""
        if not self.enable_caching or _skips_reading_cache(request):
            return [], 0
        hashes = update_block_hashes(request, self.block_size)
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks = self.block_pool.find_cached_prefix(hashes[:max_blocks], max_blocks)
        if self.use_eagle and blocks:
            blocks = blocks[:-1]
        return blocks, len(blocks) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[int] | None = None,
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        """Blocks so that the request can hold num_computed + (hit) + num_new tokens, plus
        num_lookahead_tokens slots after them (vLLM's: where a drafter sharing the blocks
        writes its chained drafts' KV). Returns the newly allocated block ids, or None (nothing
        changed) when the pool cannot supply them, counting cached free blocks as available
        (they are evicted on reuse).

        new_computed_blocks: for a waiting request being admitted, the hit from
        get_computed_blocks ([] for a miss); the hit blocks are shared (ref_cnt += 1) and the
        lookup is recorded in the prefix cache stats once the allocation succeeds."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_new_tokens += num_lookahead_tokens
        if (new_computed_blocks is None and request.num_computed_tokens + num_new_tokens
                <= len(blocks) * self.block_size):
            return []  # (a decode inside its last block: the common case, kept cheap)
        hit = new_computed_blocks or []
        num_computed = request.num_computed_tokens + len(hit) * self.block_size
        num_tokens = num_computed + num_new_tokens
        if self.max_model_len:
            num_tokens = min(num_tokens, self.max_model_len)
        need = cdiv(num_tokens, self.block_size) - len(blocks) - len(hit)
        # Hit blocks that sit in the free queue leave it when touched: they cost free blocks too.
        num_evictable_hits = sum(1 for b in hit if self.block_pool.ref_cnt(b) == 0)
        if max(need, 0) + num_evictable_hits > self.block_pool.num_free_blocks:
            return None
        if hit:
            self.block_pool.touch(hit)
        new = self.block_pool.get_new_blocks(need) if need > 0 else []
        if hit or new:
            self.req_to_blocks.setdefault(request.request_id, []).extend(hit + new)
        if (new_computed_blocks is not None and self.enable_caching
                and not _skips_reading_cache(request)):
            preempted = request.num_preemptions > 0
            for stats in (self.prefix_cache_stats, self._interval_stats):
                stats.record(request.num_tokens, len(hit) * self.block_size, preempted)
        if hit:  # the hit blocks are registered already
            self.num_cached_blocks[request.request_id] = len(hit)
        return new

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Registers the request's blocks that are full of computed tokens (after a step)."""
        if not self.enable_caching:
            return
        req_id = request.request_id
        num_full = min(num_computed_tokens // self.block_size,
                       len(self.req_to_blocks.get(req_id, ())))
        done = self.num_cached_blocks.get(req_id, 0)
        if num_full <= done:
            return
        hashes = update_block_hashes(request, self.block_size)
        blocks = self.req_to_blocks[req_id]
        self.block_pool.cache_full_blocks(blocks[done:num_full], hashes[done:num_full])
        self.num_cached_blocks[req_id] = num_full

    def free(self, request: Request) -> None:
        """Releases the request's blocks, tail first, so that the ends of sequences are evicted
        before their shared prefixes. Cached blocks stay cached until reused."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        if blocks:
            self.block_pool.free_blocks(blocks[::-1])

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached block. Only when no request holds blocks; False otherwise."""
        ok = self.block_pool.reset_prefix_cache()
        if ok:
            self._interval_stats.reset = True
        return ok

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """The stats since the last call (for per-interval logging), then starts a new interval.
        The cumulative totals stay in `prefix_cache_stats`."""
        stats, self._interval_stats = self._interval_stats, PrefixCacheStats()
        return stats
