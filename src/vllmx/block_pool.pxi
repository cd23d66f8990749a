# The native BlockPool (csrc/engine/block_pool.h), included at the end of _C.pyx. Block hashes travel
# as 16-byte `bytes` (core/block_hash.py computes them). These calls keep the GIL: each is a few
# microseconds of bookkeeping, and the GIL is what keeps the pool consistent across threads.
from libc.string cimport memcpy
from libcpp.vector cimport vector
from libc.stdint cimport int32_t

cdef extern from "engine/block_pool.h" namespace "vllmx":
    cdef cppclass CBlockHash "vllmx::BlockHash":
        uint64_t lo
        uint64_t hi

    cdef cppclass CBlockPool "vllmx::BlockPool":
        CBlockPool(int64_t, bint) except +
        int64_t num_blocks()
        int64_t num_free_blocks()
        int64_t num_cached_blocks()
        bint enable_caching()
        double usage()
        vector[int32_t] get_new_blocks(int64_t) except +
        void touch(const vector[int32_t]&) except +
        void free_blocks(const vector[int32_t]&) except +
        int64_t cache_full_blocks(const vector[int32_t]&, const vector[CBlockHash]&) except +
        int32_t get_cached_block(const CBlockHash&)
        vector[int32_t] find_cached_prefix(const vector[CBlockHash]&, int64_t) except +
        bint reset_prefix_cache()
        int32_t ref_cnt(int32_t) except +
        bint block_hash(int32_t, CBlockHash*) except +
        vector[int32_t] free_queue()


BLOCK_HASH_BYTES = 16


cdef CBlockHash _to_block_hash(str op, object h) except *:
    cdef CBlockHash out
    cdef const char* p
    if not isinstance(h, bytes) or len(<bytes>h) != 16:
        raise ValueError(f"BlockPool.{op}: a block hash is 16 bytes, got {h!r:.60}")
    p = <bytes>h
    memcpy(&out.lo, p, 8)
    memcpy(&out.hi, p + 8, 8)
    return out


cdef bytes _from_block_hash(const CBlockHash& h):
    cdef char buf[16]
    memcpy(&buf[0], &h.lo, 8)
    memcpy(&buf[8], &h.hi, 8)
    return buf[:16]


cdef vector[CBlockHash] _to_block_hashes(str op, object hashes) except *:
    cdef vector[CBlockHash] out
    for h in hashes:
        out.push_back(_to_block_hash(op, h))
    return out


cdef class BlockPool:
    """Fixed-size KV blocks with refcounts, an LRU free queue (O(1) removal) and the
    block-hash -> block map of automatic prefix caching. See csrc/engine/block_pool.h."""

    cdef CBlockPool* pool

    def __cinit__(self, int64_t num_blocks, bint enable_caching=True):
        self.pool = new CBlockPool(num_blocks, enable_caching)

    def __dealloc__(self):
        del self.pool

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks()

    @property
    def num_cached_blocks(self) -> int:
        return self.pool.num_cached_blocks()

    @property
    def enable_caching(self) -> bool:
        return self.pool.enable_caching()

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (ref_cnt > 0)."""
        return self.pool.usage()

    def get_new_blocks(self, int64_t n) -> list:
        """n blocks popped from the free queue's head (cached ones evicted), ref_cnt 1 each."""
        return self.pool.get_new_blocks(n)

    def touch(self, block_ids) -> None:
        """ref_cnt += 1 for each block; a free one leaves the free queue (a prefix hit)."""
        self.pool.touch(block_ids)

    def free_blocks(self, block_ids) -> None:
        """ref_cnt -= 1 for each, in order; blocks reaching 0 go to the free queue's tail."""
        self.pool.free_blocks(block_ids)

    def cache_full_blocks(self, block_ids, block_hashes) -> int:
        """Registers block_ids[i] under block_hashes[i]; returns how many were new."""
        cdef vector[int32_t] ids = block_ids
        cdef vector[CBlockHash] hs = _to_block_hashes("cache_full_blocks", block_hashes)
        return self.pool.cache_full_blocks(ids, hs)

    def get_cached_block(self, block_hash):
        """The cached block id with this hash, or None."""
        cdef int32_t b = self.pool.get_cached_block(_to_block_hash("get_cached_block", block_hash))
        return None if b < 0 else b

    def find_cached_prefix(self, block_hashes, int64_t max_blocks) -> list:
        """Block ids of the longest all-cached prefix of block_hashes (at most max_blocks)."""
        cdef vector[CBlockHash] hs = _to_block_hashes("find_cached_prefix", block_hashes)
        return self.pool.find_cached_prefix(hs, max_blocks)

    def reset_prefix_cache(self) -> bool:
        """Forgets all cached hashes; False (nothing done) while any block is in use."""
        return self.pool.reset_prefix_cache()

    def ref_cnt(self, int32_t block_id) -> int:
        return self.pool.ref_cnt(block_id)

    def block_hash(self, int32_t block_id):
        """The block's cached hash (16 bytes), or None."""
        cdef CBlockHash h
        if not self.pool.block_hash(block_id, &h):
            return None
        return _from_block_hash(h)

    def free_block_ids(self) -> list:
        """The free queue, head (next reused) to tail."""
        return self.pool.free_queue()
