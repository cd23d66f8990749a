// paged_attention: varlen causal attention over vLLM's flash-layout paged KV cache
// [num_blocks, block_size, num_kv_heads, head_size] (f16 / bf16 / f32), GQA, optional sliding
// window and logits soft cap.
//
// Host side: validation and the plan (work items of a few consecutive query tokens of one
// sequence x the G = nq / nkv query heads of one kv head, so each converted K/V tile serves up
// to ~48 query rows). The per-row arithmetic and why it is batch invariant: attention.h. Paths:
// AVX-512 (attention_avx512.cpp), a portable tiled path in plain f32 (attention_tiled.inc, built
// for the baseline here and for AVX2 in attention_avx2.cpp), and the reference
// twin, a scalar two-pass softmax in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "core/cpu_features.h"
#include "core/half.h"
#include "core/op_table.h"

namespace vllmx {

namespace {

using attn::Args;
using attn::kTile;
using attn::Scratch;
using attn::WorkItem;

constexpr const char* kOp = "paged_attention";
constexpr int64_t kMaxHeadSize = 1024;

// ---------------------------------------------------------------------------------------------
// Reference: scalar, double precision, two-pass softmax; one (query row, kv head) at a time.
void attend_reference(const Args& a, int64_t t, int64_t g, std::vector<double>& sc) {
  const int64_t b = (std::upper_bound(a.qsl, a.qsl + a.B + 1, static_cast<int32_t>(t)) - a.qsl) - 1;
  const int64_t pos = a.seq_lens[b] - (a.qsl[b + 1] - a.qsl[b]) + (t - a.qsl[b]);
  const int64_t lo = attn::window_lo(a, pos);
  const int64_t n = pos - lo + 1;
  sc.resize(static_cast<size_t>(n));
  for (int64_t h = g * a.G; h < (g + 1) * a.G; ++h) {
    const float* qr = a.q + t * a.q_stride + h * a.D;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t off = attn::kv_offset(a, b, lo + j, g);
      double s = 0;
      for (int64_t d = 0; d < a.D; ++d)
        s += static_cast<double>(qr[d]) * load_f32(a.kc, off + d, a.dtype);
      s *= a.scale;
      if (a.cap > 0) s = a.cap * std::tanh(s / a.cap);
      sc[j] = s;
      m = std::max(m, s);
    }
    const double sink = a.sinks != nullptr ? a.sinks[h] : -std::numeric_limits<double>::infinity();
    m = std::max(m, sink);
    double l = std::exp(sink - m);  // 0 without a sink
    for (int64_t j = 0; j < n; ++j) {
      sc[j] = std::exp(sc[j] - m);
      l += sc[j];
    }
    float* o = a.out + t * a.out_stride + h * a.D;
    for (int64_t d = 0; d < a.D; ++d) {
      double acc = 0;
      for (int64_t j = 0; j < n; ++j)
        acc += sc[j] * load_f32(a.vc, attn::kv_offset(a, b, lo + j, g) + d, a.dtype);
      o[d] = static_cast<float>(acc / l);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Portable tiled path (CPUs without AVX2): attention_tiled.inc.
#include "attention/attention_tiled.inc"

// Whether sequence c is a one-token query over exactly sequence b's cache (its length and
// the blocks holding it).
bool same_cache_query(const Args& a, int64_t b, int64_t c) {
  if (a.qsl[c + 1] - a.qsl[c] != 1 || a.seq_lens[c] != a.seq_lens[b]) return false;
  const int64_t blocks = (a.seq_lens[b] + a.block_size - 1) / a.block_size;
  return std::equal(a.bt + b * a.bt_stride, a.bt + b * a.bt_stride + blocks,
                    a.bt + c * a.bt_stride);
}

// ---------------------------------------------------------------------------------------------
// Plan: work items of mt consecutive query tokens x one kv head, longest first (dynamic
// scheduling then balances the causal triangle). mt only changes which rows share a K/V tile.
std::vector<WorkItem> plan(const Args& a, int threads) {
  int64_t mt = std::clamp<int64_t>(48 / a.G, 1, attn::kMaxItemTokens);
  const int64_t T = a.qsl[a.B];
  while (mt > 1 && (T + mt - 1) / mt * a.nkv < 4 * threads) mt /= 2;
  std::vector<WorkItem> items;
  for (int64_t b = 0; b < a.B;) {
    const int64_t q_len = a.qsl[b + 1] - a.qsl[b];
    const int64_t first_pos = a.seq_lens[b] - q_len;
    // One-token queries of sequences sharing b's cache (an encoder's rows, each posed as the
    // last token of the whole sequence) form one item, so that its K/V tiles serve them all.
    int64_t run = 1;
    if (q_len == 1)
      while (run < mt && b + run < a.B && same_cache_query(a, b, b + run)) ++run;
    if (run > 1) {
      for (int64_t g = 0; g < a.nkv; ++g) items.push_back({b, g, a.qsl[b], run, first_pos, 0});
      b += run;
      continue;
    }
    for (int64_t i = 0; i < q_len; i += mt)
      for (int64_t g = 0; g < a.nkv; ++g)
        items.push_back({b, g, a.qsl[b] + i, std::min(mt, q_len - i), first_pos + i, 1});
    ++b;
  }
  auto cost = [&](const WorkItem& w) {
    return (attn::row_pos(w, w.nt - 1) + 1 - attn::window_lo(a, w.pos0)) * (w.nt * a.G + 8);
  };
  std::stable_sort(items.begin(), items.end(),
                   [&](const WorkItem& x, const WorkItem& y) { return cost(x) > cost(y); });
  return items;
}

std::string i2s(int64_t v) { return std::to_string(v); }

}  // namespace

void paged_attention(const Tensor& out, const Tensor& q, const Tensor& key_cache,
                     const Tensor& value_cache, const Tensor& block_table,
                     const Tensor& query_start_loc, const Tensor& seq_lens, float scale,
                     int64_t sliding_window, float logits_soft_cap, int64_t max_query_len,
                     const Tensor& sinks, bool reference) {
  (void)max_query_len;  // the CPU plans from query_start_loc itself
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs; here what the
  // CPU adds (f32 activations, its head size bound) and the host-side index contents.
  check_dtype(q, DType::F32, kOp, "q");
  const DType dt = key_cache.dtype;
  const int64_t num_blocks = key_cache.shape[0], block_size = key_cache.shape[1];
  const int64_t nkv = key_cache.shape[2], D = key_cache.shape[3];
  if (D > kMaxHeadSize)
    fail(kOp, "bad cache shape " + key_cache.str() + " (head_size must be 1.." +
                  i2s(kMaxHeadSize) + ")");
  const int64_t T = q.shape[0];
  const int64_t nq = q.shape[1] / D;
  const int64_t B = seq_lens.shape[0];
  if (T == 0 && B == 0) return;
  const int32_t* qsl = query_start_loc.ptr<int32_t>();
  const int32_t* sl = seq_lens.ptr<int32_t>();
  const int32_t* bt = block_table.ptr<int32_t>();
  const int64_t max_blocks = block_table.shape[1];
  if (qsl[0] != 0) fail(kOp, "query_start_loc[0] must be 0, got " + i2s(qsl[0]));
  if (qsl[B] != T)
    fail(kOp, "query_start_loc[-1] = " + i2s(qsl[B]) + " must equal the number of query rows " +
                  i2s(T) + " (q " + q.str() + ")");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = static_cast<int64_t>(qsl[b + 1]) - qsl[b];
    if (q_len < 0)
      fail(kOp, "query_start_loc must be non-decreasing (at index " + i2s(b) + ")");
    const int64_t len = sl[b];
    if (len < q_len)
      fail(kOp, "seq_lens[" + i2s(b) + "] = " + i2s(len) + " is smaller than its " +
                    i2s(q_len) + " queries");
    if (q_len == 0) continue;
    const int64_t nblk = (len + block_size - 1) / block_size;
    if (nblk > max_blocks)
      fail(kOp, "block_table " + block_table.str() + " is too narrow for seq_lens[" + i2s(b) +
                    "] = " + i2s(len) + " with block_size " + i2s(block_size));
    // Only the blocks that some query of this sequence can see are read.
    const int64_t first_pos = len - q_len;
    const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, first_pos - sliding_window + 1)
                                          : 0;
    for (int64_t k = lo / block_size; k < nblk; ++k) {
      const int64_t id = bt[b * block_table.stride[0] + k];
      if (id < 0 || id >= num_blocks)
        fail(kOp, "block_table[" + i2s(b) + ", " + i2s(k) + "] = " + i2s(id) +
                      " is out of range for a cache of " + i2s(num_blocks) + " blocks " +
                      key_cache.str());
    }
  }
  if (T == 0) return;

  Args a;
  a.q = q.ptr<float>();
  a.out = out.ptr<float>();
  a.kc = static_cast<const char*>(key_cache.data);
  a.vc = static_cast<const char*>(value_cache.data);
  a.dtype = static_cast<int>(dt);
  a.block_size = block_size;
  a.nkv = nkv;
  a.D = D;
  a.nq = nq;
  a.G = nq / nkv;
  a.bt = bt;
  a.bt_stride = block_table.stride[0];
  a.qsl = qsl;
  a.seq_lens = sl;
  a.B = B;
  a.scale = scale;
  a.window = sliding_window;
  a.cap = logits_soft_cap > 0 ? logits_soft_cap : 0.0f;
  a.q_stride = q.stride[0];
  a.out_stride = out.stride[0];
  a.sinks = sinks.defined() ? sinks.ptr<float>() : nullptr;

  if (reference) {
    const int64_t items = T * nkv;
#pragma omp parallel
    {
      std::vector<double> sc;
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < items; ++i) attend_reference(a, i / nkv, i % nkv, sc);
    }
    return;
  }
  bool avx512 = false, avx2 = false;
#if VLLMX_X86
  avx512 = simd_level() >= 2;
  avx2 = simd_level() == 1;
#endif
  const std::vector<WorkItem> items = plan(a, get_num_threads());
  const int64_t n = static_cast<int64_t>(items.size());
#pragma omp parallel
  {
    static thread_local Scratch s;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
#if VLLMX_X86
      if (avx512) {
        attn::attend_item_avx512(a, items[i], s);
        continue;
      }
      if (avx2) {
        attn::attend_item_avx2(a, items[i], s);
        continue;
      }
#endif
      attend_item_tiled(a, items[i], s);
    }
  }
  (void)avx512;
  (void)avx2;
}

VLLMX_KERNEL(paged_attention, kCPU, paged_attention);

}  // namespace vllmx
