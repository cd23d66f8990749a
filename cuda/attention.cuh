// Shared by the paged-attention kernels (attention.cu: prefill, generic and the op;
// attention_decode.cu: decode): the kernels' argument block, tile constants and the K/V tile
// loader. Internal to the CUDA sources.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda_util.cuh"
#include "mma.cuh"

namespace vllmx::cuda::attn {

using namespace detail;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kDecWarps = 4;        // decode CTA: each warp takes 16 keys of a tile
constexpr int kDecThreads = kDecWarps * 32;
constexpr int kDecKeys = kDecWarps * 16;  // decode: keys per K/V tile
constexpr int kDecStages = 3;       // decode: K/V tiles in flight (2 CTAs of 109 KB per SM)
constexpr int kDecCtasPerSm = 2;   // decode CTAs resident on an SM (plan_attention's partitions)
constexpr int kDecMaxG = 16;        // decode: query heads (of one kv head) per CTA, one mma tile
constexpr int kMinPartition = 64;   // decode: fewest keys worth a partition of their own
constexpr int kMaxSplits = 128;
constexpr int kSm90PrefillRows = 64;  // prefill CTA on Hopper's wgmma (attention_prefill_sm90.cu)

struct AttnArgs {
  const void* q;
  void* out;
  const void* kc;
  const void* vc;
  const int32_t* bt;
  const int32_t* qsl;
  const int32_t* seq_lens;
  int64_t q_stride, out_stride, bt_stride;  // elements
  int B, T, nq, nkv, G, D, block_size;
  float scale, cap;  // cap > 0: soft cap
  int window;        // > 0: sliding window
  const float* sinks;  // f32 [nq] (gpt-oss's attention sinks: natural-log logits), or null
  bool q_bf16, out_bf16;
  // Split-KV decode scratch: part_o [B, nq, max_splits, D], part_lse [B, nq, max_splits], and
  // per (sequence, head group) the count of partitions done (zero between launches).
  int max_splits;
  float* part_o;
  float* part_lse;
  int* done;
  // Prefill work list: tiles[i] = (sequence, first flattened row), *num_tiles entries.
  int2* tiles;
  int* num_tiles;
};

// gpt-oss's sinks: what query head `head`'s sink adds to a row's softmax denominator, given the
// row's running maximum m and sum l in base-2 units (2^(scaled score - m)); 0 without sinks. A
// sink far above the scores overflows to inf: the row's output is then 0, its limit.
__device__ __forceinline__ float sink_term(const AttnArgs& a, int head, float m) {
  return a.sinks == nullptr ? 0.f : exp2f(fmaf(a.sinks[head], kLog2e, -m));
}

__device__ __forceinline__ int visible_lo(int pos, int window) {
  return window > 0 ? max(0, pos - window + 1) : 0;
}

// Keys [k0, k0 + ROWS) of kv head g of the sequence whose block-table row is bt_row -> rows
// of the Ks / Vs tiles, by NT threads, one cp.async group; dst(r, c) is the element offset of
// 16-byte chunk c of tile row r (a padded or a swizzled layout). Keys at or past kend are
// zero-filled (never garbage: 0 * NaN would poison P @ V). Key `hole` is left alone (neither
// loaded nor zeroed): decode loads it separately.
// Each thread always moves chunk threadIdx.x % (D / 8) of every (NT / (D / 8))-th row, so a row
// costs it one block-table read and a shift (block sizes that are powers of two, the engine's
// 16; others divide), and the rows carry no branches, so all their block-table reads are in
// flight together: a memory-bound decode runs out of issue slots before bandwidth otherwise.
template <int D, int ROWS, int NT, typename KV, class Dst>
__device__ __forceinline__ void gather_kv_rows(const AttnArgs& a, const int32_t* bt_row, int g,
                                               int k0, int kend, KV* Ks, KV* Vs, Dst dst,
                                               int hole = -1) {
  constexpr int CPR = D / 8, RPP = NT / CPR;  // rows per pass of the NT threads
  static_assert(NT % CPR == 0 && ROWS % RPP == 0, "K/V tile loads");
  const int c = threadIdx.x % CPR, r0 = threadIdx.x / CPR, bs = a.block_size;
  const KV* kc = static_cast<const KV*>(a.kc) + static_cast<int64_t>(g) * D + c * 8;
  const KV* vc = static_cast<const KV*>(a.vc) + static_cast<int64_t>(g) * D + c * 8;
  const int row_elems = a.nkv * D;
  // kHole: whether key `hole` falls in this tile (decode's first tiles only), so that every
  // other tile's rows test nothing.
  auto rows = [&](auto page_of, auto has_hole) {
    constexpr bool kHole = decltype(has_hole)::value;
#pragma unroll
    for (int it = 0; it < ROWS / RPP; ++it) {
      const int r = r0 + it * RPP, pos = min(k0 + r, kend - 1);  // past kend: a valid address
      const int page = page_of(pos);
      // The slot index fits 32 bits (a cache of 2^31 token slots would be terabytes).
      const int64_t off =
          static_cast<int64_t>(bt_row[page] * bs + (pos - page * bs)) * row_elems;
      if (!kHole || k0 + r != hole) {
        const int o = dst(r, c);
        cp_async16(Ks + o, kc + off, k0 + r < kend);
        cp_async16(Vs + o, vc + off, k0 + r < kend);
      }
    }
  };
  const bool hole_here = hole >= k0 && hole < k0 + ROWS;
  if ((bs & (bs - 1)) == 0) {
    const int shift = __ffs(bs) - 1;
    auto page_of = [&](int pos) { return pos >> shift; };
    hole_here ? rows(page_of, std::true_type{}) : rows(page_of, std::false_type{});
  } else {
    auto page_of = [&](int pos) { return pos / bs; };
    hole_here ? rows(page_of, std::true_type{}) : rows(page_of, std::false_type{});
  }
  cp_async_commit();
}

// gather_kv_rows into tiles of row stride D + 8 (conflict-free ldmatrix).
template <int D, int ROWS, int NT, typename KV>
__device__ __forceinline__ void load_kv_tile(const AttnArgs& a, const int32_t* bt_row, int g,
                                             int k0, int kend, KV* Ks, KV* Vs, int hole = -1) {
  gather_kv_rows<D, ROWS, NT>(a, bt_row, g, k0, kend, Ks, Vs,
                              [](int r, int c) { return r * (D + 8) + c * 8; }, hole);
}

// attention_decode.cu: the decode kernel over grid (nkv * head groups, B, max_splits) for head
// size D (64 / 128) and a bf16 (else f16) cache; the zeroed merge counters it needs.
void launch_decode(const AttnArgs& a, dim3 grid, int D, bool bf16_cache, cudaStream_t s);
int* done_counters(size_t n);
// attention_prefill_sm90.cu (built with sm_90a only: VLLMX_WITH_SM90_ATTENTION): the prefill
// kernel on wgmma over grid (grid_x, nkv), tiles of kSm90PrefillRows rows from a.tiles, for head
// size D (64 / 128) and a bf16 (else f16) cache.
void launch_prefill_sm90(const AttnArgs& a, int grid_x, int D, bool bf16_cache, cudaStream_t s);

}  // namespace vllmx::cuda::attn
