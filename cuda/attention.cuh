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
constexpr int kMlaHeadSize = 576;  // MLA's cache rows: kv_lora_rank 512 + qk_rope_head_dim 64
constexpr int kSm90PrefillRows = 64;  // prefill CTA on Hopper's wgmma (attention_prefill_sm90.cu)
// Long prompts on Hopper (attention_prefill_ws_sm90.cu): its CTA's query rows, keys a K/V tile,
// and the longest query from which a batch takes it (measured there).
constexpr int kWsPrefillRows = 128;
constexpr int kWsPrefillKeys = 128;
constexpr int kWsPrefillMinQueryLen = 1024;
// The rows of each TMA box that brings that kernel a K/V tile from a cache of this block size:
// a block's run of rows, the largest power of two dividing the size, up to a tile; 0 under 8
// rows (a 1024-byte swizzle atom), where no box fits (the plan then keeps the other kernel).
inline int ws_box_rows(int block_size) {
  const int r = block_size & -block_size;
  return r < 8 ? 0 : r < kWsPrefillKeys ? r : kWsPrefillKeys;
}

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
  // Prefill work list: tiles[i] = (sequence, first flattened row), num_tiles[0] entries;
  // num_tiles[1], zeroed with it, counts the work items the persistent long-prompt kernel's
  // CTAs have claimed past their first (attention_prefill_ws_sm90.cu).
  int2* tiles;
  int* num_tiles;
};

// gpt-oss's sinks: what query head `head`'s sink adds to a row's softmax denominator, given the
// row's running maximum m and sum l in base-2 units (2^(scaled score - m)); 0 without sinks. A
// sink far above the scores overflows to inf: the row's output is then 0, its limit.
__device__ __forceinline__ float sink_term(const AttnArgs& a, int head, float m) {
  return a.sinks == nullptr ? 0.f : exp2f(fmaf(a.sinks[head], kLog2e, -m));
}

// The end of a prefill kernel's 16-row slice of a CTA's flattened rows (f0 = its first): this
// thread's rows lane / 4 and lane / 4 + 8, their row sums completed across the quad, normalized
// (the sink's share added) and stored as 16-bit pairs, rows at or past R skipped. o(dt, h): the
// row's (h: + 8) O sums for columns 8 dt + 2 (lane % 4) and the next (an mma tile's layout);
// m: the rows' running maxima in base-2 units, before scale.
template <int D, class Pair>
__device__ __forceinline__ void store_rows(const AttnArgs& a, const Pair& o, float (&l)[2],
                                           const float (&m)[2], float scale, int f0, int R,
                                           int G, int g, int q0, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int f = f0 + lane / 4 + h * 8;
    if (f >= R) continue;
    const int tok = f / G, head = g * G + f % G;
    const float inv = 1.f / (l[h] + sink_term(a, head, m[h] * scale));
    uint16_t* dst = static_cast<uint16_t*>(a.out) + (q0 + tok) * a.out_stride +
                    static_cast<int64_t>(head) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const int col = dt * 8 + (lane % 4) * 2;
      const float2 v = o(dt, h);
      *reinterpret_cast<uint32_t*>(dst + col) = pack2_bits(v.x * inv, v.y * inv, a.out_bf16);
    }
  }
}

__device__ __forceinline__ int visible_lo(int pos, int window) {
  return window > 0 ? max(0, pos - window + 1) : 0;
}

// Partition size and count for a decode context of n visible keys: at most max_splits
// partitions, whole K/V tiles, >= kMinPartition keys.
__device__ __forceinline__ void split_plan(int n, int max_splits, int& part, int& nsplit) {
  int per = (n + max_splits - 1) / max_splits;
  per = (per + kDecKeys - 1) / kDecKeys * kDecKeys;
  part = max(per, kMinPartition);
  nsplit = (n + part - 1) / part;
}

// The nh query rows of a head group (D wide, consecutive from qrow) -> the kDecMaxG rows of Qs
// (row stride LD) in the cache dtype KV, by NT threads (the mma takes one type); rows past nh
// are zero. The decode and MLA kernels' q tile.
template <int D, int LD, int NT, typename KV>
__device__ __forceinline__ void stage_q_rows(const AttnArgs& a, const uint16_t* qrow, int nh,
                                             KV* Qs) {
  constexpr int CPR = D / 8;
  constexpr bool kKvBf = std::is_same_v<KV, __nv_bfloat16>;
  for (int i = threadIdx.x; i < kDecMaxG * CPR; i += NT) {
    const int r = i / CPR, c = i % CPR;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < nh) {
      v = *reinterpret_cast<const uint4*>(qrow + i * 8);
      if (a.q_bf16 != kKvBf) {
        float f8[8];
        unpack8(v, a.q_bf16, f8);
        v = pack8(f8, kKvBf);
      }
    }
    *reinterpret_cast<uint4*>(Qs + r * LD + c * 8) = v;
  }
}

// Split-KV merge, shared by the decode and MLA kernels. Each CTA of a group (one sequence's or
// token's heads h0 .. h0 + nh over nsplit partitions) has written its partition's normalized O
// rows to part_o and their log-sum-exp (base 2) to part_lse; the last of them to finish
// (counted in *done, which it leaves zero for the next launch) merges them all into out's heads
// (rows of D), weighted by their share of the sum. wts: shared memory for kDecMaxG x kMaxSplits
// floats.
template <int D, int kWarps>
__device__ __forceinline__ void merge_partials(const AttnArgs& a, int* done, int64_t slot0,
                                               int nh, int nsplit, int h0, uint16_t* out,
                                               float* wts) {
  constexpr int kHeadsPerWarp = (kDecMaxG + kWarps - 1) / kWarps;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    last = atomicAdd(done, 1) == nsplit - 1;
    if (last) *done = 0;  // every partition has counted: ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Each partition's weight in the merge: a warp a head, its lanes over the partitions. Every
  // load of the merge is issued before the first is used: one after another, each would be an
  // L2 round trip: Qwen3-30B-A3B's batch-1 decode, 17 partitions of 8 heads, 17.4 -> 8.6 µs.
  constexpr int kPerLane = kMaxSplits / 32;
  float lse[kHeadsPerWarp][kPerLane];
#pragma unroll
  for (int j = 0; j < kHeadsPerWarp; ++j)
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int h = warp + j * kWarps, sp = lane + k * 32;
      lse[j][k] = h < nh && sp < nsplit
                      ? __ldcg(a.part_lse + slot0 + h * a.max_splits + sp) : -INFINITY;
    }
#pragma unroll
  for (int j = 0; j < kHeadsPerWarp; ++j) {
    const int h = warp + j * kWarps;
    if (h >= nh) break;  // (uniform across the warp)
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) mx = fmaxf(mx, lse[j][k]);
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      lse[j][k] = exp2f(lse[j][k] - mx);  // -inf (no partition) -> 0
      sum += lse[j][k];
    }
    const float inv = 1.f / (warp_sum(sum) + sink_term(a, h0 + h, mx));
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
      if (lane + k * 32 < nsplit) wts[h * kMaxSplits + lane + k * 32] = lse[j][k] * inv;
  }
  __syncthreads();
  // A thread sums 4 consecutive elements of one head over the partitions, 12 at a time (16
  // would spill).
  constexpr int V4 = D / 4, kBatch = 12;
  for (int i = tid; i < nh * V4; i += kWarps * 32) {
    const int h = i / V4, c4 = i % V4;
    const float4* po =
        reinterpret_cast<const float4*>(a.part_o + (slot0 + h * a.max_splits) * D) + c4;
    const float* wh = wts + h * kMaxSplits;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp0 = 0; sp0 < nsplit; sp0 += kBatch) {
      float4 pv[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        pv[j] = sp0 + j < nsplit ? __ldcg(po + (sp0 + j) * V4) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const float w = sp0 + j < nsplit ? wh[sp0 + j] : 0.f;
        v.x = fmaf(w, pv[j].x, v.x), v.y = fmaf(w, pv[j].y, v.y);
        v.z = fmaf(w, pv[j].z, v.z), v.w = fmaf(w, pv[j].w, v.w);
      }
    }
    // (out rows are 4-byte aligned: the plan asks no more of them)
    uint32_t* o = reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(h0 + h) * D + c4 * 4);
    o[0] = pack2_bits(v.x, v.y, a.out_bf16);
    o[1] = pack2_bits(v.z, v.w, a.out_bf16);
  }
}

// Keys [k0, k0 + ROWS) of kv head g of the sequence whose block-table row is bt_row -> rows
// of the Ks / Vs tiles, by NT threads (a CTA's first NT, or with NT = 32 the lanes of any one
// warp), one cp.async group; dst(r, c) is the element offset of 16-byte chunk c of tile row r
// (a padded or a swizzled layout). Keys at or past kend are zero-filled (never garbage: 0 * NaN
// would poison P @ V). Key `hole` is left alone (neither loaded nor zeroed): decode loads it
// separately.
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
  const unsigned tid = NT == 32 ? threadIdx.x % 32 : threadIdx.x;  // (32: any one warp's lanes)
  const int c = tid % CPR, r0 = tid / CPR, bs = a.block_size;
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

// f(std::integral_constant<int, D>{}, KV{}) for the tensor-core kernels' head sizes (64, 128,
// and 256, which plan_attention takes on Hopper only) and the cache's element type.
template <typename F>
void dispatch_head_kv(int D, bool bf16_cache, F&& f) {
  auto by_kv = [&](auto d) { bf16_cache ? f(d, __nv_bfloat16{}) : f(d, __half{}); };
  if (D == 64)
    by_kv(std::integral_constant<int, 64>{});
  else if (D == 128)
    by_kv(std::integral_constant<int, 128>{});
  else
    by_kv(std::integral_constant<int, 256>{});
}

// attention_decode.cu: the decode kernel over grid (nkv * head groups, B, max_splits) for head
// size D (64 / 128) and a bf16 (else f16) cache; the zeroed merge counters it needs.
void launch_decode(const AttnArgs& a, dim3 grid, int D, bool bf16_cache, cudaStream_t s);
// The balanced decode kernel (same file) for head size 64 / 128 over `ctas` CTAs, whole sets
// of one CTA per head item (balanced_grid: as many sets as fill `slots` resident CTAs, at
// least one); part_o / part_lse hold 2 ctas x kDecMaxG rows.
inline int balanced_grid(int slots, int head_items) {
  return (slots / head_items > 1 ? slots / head_items : 1) * head_items;
}
void launch_decode_balanced(const AttnArgs& a, int ctas, int D, bool bf16_cache,
                            cudaStream_t s);
int* done_counters(size_t n);
// attention_mla.cu: multi-head latent attention's kernel (one kv head of kMlaHeadSize-wide rows,
// the keys and the values alike) over grid (T * ceil(nq / kDecMaxG), max_splits), for a bf16
// (else f16) cache.
void launch_mla(const AttnArgs& a, dim3 grid, bool bf16_cache, cudaStream_t s);
// attention_prefill_sm90.cu (built with sm_90a only: VLLMX_WITH_SM90_ATTENTION): the prefill
// kernel on wgmma over grid (grid_x, nkv), tiles of kSm90PrefillRows rows from a.tiles, for head
// size D (64 / 128) and a bf16 (else f16) cache.
void launch_prefill_sm90(const AttnArgs& a, int grid_x, int D, bool bf16_cache, cudaStream_t s);
// attention_prefill_ws_sm90.cu (the same build): the warp-specialized prefill kernel fed by
// TMA, tiles of kWsPrefillRows rows, head size 128; cache_slots: the cache's token rows
// (num_blocks * block_size), its tensor maps' extent.
void launch_prefill_ws_sm90(const AttnArgs& a, int grid_x, bool bf16_cache, int64_t cache_slots,
                            cudaStream_t s);

}  // namespace vllmx::cuda::attn
