// BlockPool: the per-block bookkeeping of the paged KV cache (vLLM V1's BlockPool and
// FreeKVCacheBlockQueue). The policy (which request gets blocks, when blocks are cached) stays
// in Python (core/kv_cache_manager.py); this class keeps the books:
//   - every block has a ref_cnt and, once it holds a full block of computed tokens, a 128-bit
//     block hash (hash of parent hash + tokens + extra keys, computed in Python);
//   - blocks with ref_cnt 0 sit in a free queue, an intrusive doubly-linked list in LRU order:
//     allocation pops the head, freeing appends a cached block to the tail (an uncached one,
//     holding nothing to keep, goes to the head), and a cached free block that gets a prefix
//     hit is unlinked from the middle in O(1);
//   - a hash -> block map finds cached full blocks. A cached block that is popped for reuse is
//     evicted then (its hash removed), lazily.
// Errors throw std::invalid_argument naming the op; state is unchanged when an op throws.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace vllmx {

struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash& o) const { return lo == o.lo && hi == o.hi; }
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull));
  }
};

class BlockPool {
 public:
  BlockPool(int64_t num_blocks, bool enable_caching);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t num_free_blocks() const { return num_free_; }
  int64_t num_cached_blocks() const { return static_cast<int64_t>(cached_.size()); }
  bool enable_caching() const { return enable_caching_; }
  // Fraction of blocks in use (ref_cnt > 0).
  double usage() const;

  // Pops n blocks from the head of the free queue (evicting their cached hashes); each comes
  // back with ref_cnt 1.
  std::vector<int32_t> get_new_blocks(int64_t n);
  // ref_cnt += 1 for each block (a free one leaves the free queue: a prefix hit).
  void touch(const std::vector<int32_t>& ids);
  // ref_cnt -= 1 for each block, in the given order; cached blocks reaching 0 are appended to the
  // free queue's tail in that order (callers pass a request's blocks in reverse, so that the
  // tail ends of sequences are evicted first). Uncached ones go to the head, in that order, to
  // be reused before any cached block is evicted and before never-used blocks: the CPU KV cache
  // is committed lazily, so its resident size stays that of the blocks in use at once, not of
  // every block the pool ever cycled through (vLLM appends them to the tail too).
  void free_blocks(const std::vector<int32_t>& ids);
  // Registers ids[i] (in use, full, computed) under hashes[i]. A block already holding that hash
  // is skipped; a hash already mapped to another block is skipped (the duplicate stays
  // uncached). Returns how many blocks were newly registered.
  int64_t cache_full_blocks(const std::vector<int32_t>& ids, const std::vector<BlockHash>& hashes);
  // The cached block with this hash, or -1.
  int32_t get_cached_block(const BlockHash& h) const;
  // The blocks of the longest prefix of `hashes` (at most max_blocks) that are all cached.
  std::vector<int32_t> find_cached_prefix(const std::vector<BlockHash>& hashes,
                                          int64_t max_blocks) const;
  // Forgets every cached hash. Only when no block is in use; returns false (and does nothing)
  // otherwise.
  bool reset_prefix_cache();

  int32_t ref_cnt(int32_t id) const;
  // Whether the block holds a cached hash; *out receives it.
  bool block_hash(int32_t id, BlockHash* out) const;
  // The free queue from head (next to be reused) to tail.
  std::vector<int32_t> free_queue() const;

 private:
  struct Block {
    int32_t ref_cnt = 0;
    int32_t prev = -1, next = -1;  // free-queue links (valid while ref_cnt == 0)
    bool cached = false;
    BlockHash hash;
  };

  void check_id(const char* op, int32_t id) const;
  void unlink(int32_t id);
  void push_back(int32_t id);
  void push_front(int32_t id);
  void evict(int32_t id);

  std::vector<Block> blocks_;
  int32_t head_ = -1, tail_ = -1;
  int64_t num_free_ = 0;
  bool enable_caching_;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;
};

}  // namespace vllmx
