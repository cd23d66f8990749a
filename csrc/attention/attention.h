// Internals of paged_attention shared by its paths (attention.cpp: entry, plan, reference and
// portable paths; attention_avx512.cpp: the AVX-512 path). Not part of the op contract (ops.h).
//
// The arithmetic of one query row is fixed by these rules, whatever work item it lands in:
// keys are visited in tiles of kTile aligned to absolute context positions (tile t covers
// positions [16t, 16t + 16)), in increasing order, each tile being one online-softmax step over
// the row's visible keys of that tile. A work item (a few consecutive query tokens of one
// sequence x the query heads of one kv head) only shares the loading and conversion of K/V
// tiles between its rows; it never changes a row's sequence of float operations. So a row's
// bits depend only on its query vector, its absolute position and its sequence's cache: not on
// the batch, the chunking of the prompt, the thread, or the size of the item (batch invariance).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace vllmx::attn {

constexpr int kTile = 16;
constexpr int64_t kMaxItemTokens = 64;

struct Args {
  const float* q;
  float* out;
  const char* kc;
  const char* vc;
  int dtype;  // 0 f32, 1 f16, 30 bf16
  int64_t block_size, nkv, D, nq, G;
  const int32_t* bt;
  int64_t bt_stride;
  const int32_t* qsl;
  const int32_t* seq_lens;
  int64_t B;
  float scale;
  int64_t window;
  float cap;
  int64_t q_stride, out_stride;
  const float* sinks;  // [nq] or nullptr
};

// 1 / the softmax denominator of a row of head h whose running max and sum are m and l, times
// what rescales its accumulator: 1 / l, or with a sink logit s (gpt-oss) the denominator taking
// exp(s) too, rescaled to the larger of m and s: corr / (l corr + exp(s - m')).
inline float row_inv(const Args& a, int64_t h, float m, float l) {
  if (a.sinks == nullptr) return 1.0f / l;
  const float s = a.sinks[h], mm = std::max(m, s);
  const float corr = std::exp(m - mm);
  return corr / (l * corr + std::exp(s - mm));
}

// Query rows t0 .. t0 + nt - 1 x the G query heads of kv head g. Row r of the item is token
// r / G, head g * G + r % G. step 1: consecutive tokens of sequence b, at absolute positions
// pos0 .. pos0 + nt - 1. step 0: one-token queries of sequences b .. b + nt - 1 that share b's
// cache (block table row and length), each at position pos0 (an encoder's rows posed as the
// last token of the whole sequence: bidirectional attention).
struct WorkItem {
  int64_t b, g, t0, nt, pos0, step;
};

// Absolute position of token i of item w.
inline int64_t row_pos(const WorkItem& w, int64_t i) { return w.pos0 + i * w.step; }

// First context position visible from absolute position pos.
inline int64_t window_lo(const Args& a, int64_t pos) {
  return a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
}

// Element offset of the (kv head g) row of context position pos of sequence b.
inline int64_t kv_offset(const Args& a, int64_t b, int64_t pos, int64_t g) {
  const int64_t block = a.bt[b * a.bt_stride + pos / a.block_size];
  const int64_t slot = block * a.block_size + pos % a.block_size;
  return (slot * a.nkv + g) * a.D;
}

// The tokens i_a .. i_b of item w that see some key of the tile starting at ts (each of them
// sees at least one), and the keys k0 .. k1 of the tile that any of them sees. False if none.
struct TileSpan {
  int64_t i_a, i_b, k0, k1;
};
inline bool tile_span(const Args& a, const WorkItem& w, int64_t ts, TileSpan& sp) {
  // Positions do not decrease with i: the tokens past the tile's start are a suffix.
  sp.i_a = w.step == 0 ? (w.pos0 >= ts ? 0 : w.nt) : std::max<int64_t>(0, ts - w.pos0);
  sp.i_b = w.nt - 1;
  while (sp.i_b >= sp.i_a && window_lo(a, row_pos(w, sp.i_b)) > ts + kTile - 1) --sp.i_b;
  if (sp.i_a > sp.i_b) return false;
  sp.k0 = std::max(ts, window_lo(a, row_pos(w, sp.i_a)));
  sp.k1 = std::min<int64_t>(ts + kTile - 1, row_pos(w, sp.i_b));
  return true;
}

// The keys j0 .. j1-1 (tile-relative) of the tile at ts that token i of item w sees.
inline void visible_keys(const Args& a, const WorkItem& w, int64_t i, int64_t ts, int64_t& j0,
                         int64_t& j1) {
  j0 = std::max(window_lo(a, row_pos(w, i)), ts) - ts;
  j1 = std::min<int64_t>(row_pos(w, i), ts + kTile - 1) - ts + 1;
}

// Per-thread buffers, reused across items and calls; get() returns 64-byte aligned storage.
struct Scratch {
  std::vector<float> buf[10];
  float* get(int i, int64_t n) {
    if (static_cast<int64_t>(buf[i].size()) < n + 16) buf[i].resize(n + 16);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf[i].data());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
  }
};

#if defined(__x86_64__) || defined(_M_X64)
void attend_item_avx512(const Args& a, const WorkItem& w, Scratch& s);
void attend_item_avx2(const Args& a, const WorkItem& w, Scratch& s);  // attention_avx2.cpp
#endif

}  // namespace vllmx::attn
