#include "engine/block_pool.h"

#include <stdexcept>
#include <string>

namespace vllmx {

namespace {

[[noreturn]] void fail(const char* op, const std::string& msg) {
  throw std::invalid_argument(std::string("BlockPool.") + op + ": " + msg);
}

}  // namespace

BlockPool::BlockPool(int64_t num_blocks, bool enable_caching)
    : enable_caching_(enable_caching) {
  if (num_blocks <= 0 || num_blocks > INT32_MAX) {
    fail("__init__", "num_blocks must be in [1, 2^31), got " + std::to_string(num_blocks));
  }
  blocks_.resize(static_cast<size_t>(num_blocks));
  for (int32_t i = 0; i < static_cast<int32_t>(num_blocks); ++i) push_back(i);
}

double BlockPool::usage() const {
  return 1.0 - static_cast<double>(num_free_) / static_cast<double>(blocks_.size());
}

void BlockPool::check_id(const char* op, int32_t id) const {
  if (id < 0 || id >= num_blocks()) {
    fail(op, "block id " + std::to_string(id) + " is out of range [0, " +
                 std::to_string(num_blocks()) + ")");
  }
}

void BlockPool::unlink(int32_t id) {
  Block& b = blocks_[id];
  (b.prev >= 0 ? blocks_[b.prev].next : head_) = b.next;
  (b.next >= 0 ? blocks_[b.next].prev : tail_) = b.prev;
  b.prev = b.next = -1;
  --num_free_;
}

void BlockPool::push_back(int32_t id) {
  Block& b = blocks_[id];
  b.prev = tail_;
  b.next = -1;
  (tail_ >= 0 ? blocks_[tail_].next : head_) = id;
  tail_ = id;
  ++num_free_;
}

void BlockPool::push_front(int32_t id) {
  Block& b = blocks_[id];
  b.prev = -1;
  b.next = head_;
  (head_ >= 0 ? blocks_[head_].prev : tail_) = id;
  head_ = id;
  ++num_free_;
}

void BlockPool::evict(int32_t id) {
  Block& b = blocks_[id];
  if (!b.cached) return;
  auto it = cached_.find(b.hash);
  if (it != cached_.end() && it->second == id) cached_.erase(it);
  b.cached = false;
  b.hash = BlockHash{};
}

std::vector<int32_t> BlockPool::get_new_blocks(int64_t n) {
  if (n < 0) fail("get_new_blocks", "negative count " + std::to_string(n));
  if (n > num_free_) {
    fail("get_new_blocks", "asked for " + std::to_string(n) + " blocks, only " +
                               std::to_string(num_free_) + " free");
  }
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t id = head_;
    unlink(id);
    evict(id);
    blocks_[id].ref_cnt = 1;
    out.push_back(id);
  }
  return out;
}

void BlockPool::touch(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) check_id("touch", id);
  for (int32_t id : ids) {
    Block& b = blocks_[id];
    if (b.ref_cnt == 0) unlink(id);
    ++b.ref_cnt;
  }
}

void BlockPool::free_blocks(const std::vector<int32_t>& ids) {
  // Validate first (counting repeats) so that a bad call changes nothing.
  std::unordered_map<int32_t, int32_t> times;
  for (int32_t id : ids) {
    check_id("free_blocks", id);
    if (++times[id] > blocks_[id].ref_cnt) {
      fail("free_blocks", "block " + std::to_string(id) + " is freed more times than it is "
                          "referenced (ref_cnt " + std::to_string(blocks_[id].ref_cnt) +
                          "): double free");
    }
  }
  std::vector<int32_t> uncached;
  for (int32_t id : ids) {
    if (--blocks_[id].ref_cnt > 0) continue;
    if (blocks_[id].cached)
      push_back(id);
    else
      uncached.push_back(id);
  }
  for (auto it = uncached.rbegin(); it != uncached.rend(); ++it) push_front(*it);
}

int64_t BlockPool::cache_full_blocks(const std::vector<int32_t>& ids,
                                     const std::vector<BlockHash>& hashes) {
  if (ids.size() != hashes.size()) {
    fail("cache_full_blocks", std::to_string(ids.size()) + " blocks but " +
                                  std::to_string(hashes.size()) + " hashes");
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    check_id("cache_full_blocks", ids[i]);
    const Block& b = blocks_[ids[i]];
    if (b.ref_cnt == 0) {
      fail("cache_full_blocks", "block " + std::to_string(ids[i]) + " is free (ref_cnt 0)");
    }
    if (b.cached && !(b.hash == hashes[i])) {
      fail("cache_full_blocks", "block " + std::to_string(ids[i]) +
                                    " is already cached under a different hash");
    }
  }
  if (!enable_caching_) return 0;
  int64_t added = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    Block& b = blocks_[ids[i]];
    if (b.cached) continue;
    if (!cached_.emplace(hashes[i], ids[i]).second) continue;  // a duplicate of a cached block
    b.cached = true;
    b.hash = hashes[i];
    ++added;
  }
  return added;
}

int32_t BlockPool::get_cached_block(const BlockHash& h) const {
  auto it = cached_.find(h);
  return it == cached_.end() ? -1 : it->second;
}

std::vector<int32_t> BlockPool::find_cached_prefix(const std::vector<BlockHash>& hashes,
                                                   int64_t max_blocks) const {
  std::vector<int32_t> out;
  if (!enable_caching_) return out;
  for (const BlockHash& h : hashes) {
    if (static_cast<int64_t>(out.size()) >= max_blocks) break;
    int32_t id = get_cached_block(h);
    if (id < 0) break;
    out.push_back(id);
  }
  return out;
}

bool BlockPool::reset_prefix_cache() {
  if (num_free_ != num_blocks()) return false;
  cached_.clear();
  for (Block& b : blocks_) {
    b.cached = false;
    b.hash = BlockHash{};
  }
  return true;
}

int32_t BlockPool::ref_cnt(int32_t id) const {
  check_id("ref_cnt", id);
  return blocks_[id].ref_cnt;
}

bool BlockPool::block_hash(int32_t id, BlockHash* out) const {
  check_id("block_hash", id);
  if (!blocks_[id].cached) return false;
  *out = blocks_[id].hash;
  return true;
}

std::vector<int32_t> BlockPool::free_queue() const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(num_free_));
  for (int32_t id = head_; id >= 0; id = blocks_[id].next) out.push_back(id);
  return out;
}

}  // namespace vllmx
