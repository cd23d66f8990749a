// Shared by the paged-attention kernels (attention.cu: prefill, generic and the op;
// attention_decode.cu: decode): the kernels' argument block, tile constants and the K/V tile
// loader. Internal to the CUDA sources.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_util.cuh"
#include "mma.cuh"

namespace vllmx::cuda::attn {

using namespace detail;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kDecWarps = 4;        // decode CTA: each warp takes 16 keys of a tile
constexpr int kDecThreads = kDecWarps * 32;
constexpr int kDecKeys = kDecWarps * 16;  // decode: keys per K/V tile
constexpr int kDecStages = 3;       // decode: K/V tiles in flight (2 CTAs of 109 KB per SM)
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

__device__ __forceinline__ int visible_lo(int pos, int window) {
  return window > 0 ? max(0, pos - window + 1) : 0;
}

// Keys [k0, k0 + ROWS) of kv head g of the sequence whose block-table row is bt_row -> stage
// rows of Ks / Vs (row stride D + 8), by NT threads, one cp.async group. Keys at or past kend
// are zero-filled (never garbage: 0 * NaN would poison P @ V).
// Key `hole` is left alone (neither loaded nor zeroed): decode loads it separately.
template <int D, int ROWS, int NT, typename KV>
__device__ __forceinline__ void load_kv_tile(const AttnArgs& a, const int32_t* bt_row, int g,
                                             int k0, int kend, KV* Ks, KV* Vs, int hole = -1) {
  constexpr int LD = D + 8, CPR = D / 8;
  const KV* kc = static_cast<const KV*>(a.kc);
  const KV* vc = static_cast<const KV*>(a.vc);
  for (int i = threadIdx.x; i < ROWS * CPR; i += NT) {
    const int r = i / CPR, c = i % CPR, pos = k0 + r;
    if (pos == hole) continue;
    const bool ok = pos < kend;
    int64_t off = 0;
    if (ok) {
      const int64_t blk = bt_row[pos / a.block_size];
      off = ((blk * a.block_size + pos % a.block_size) * a.nkv + g) * D + c * 8;
    }
    cp_async16(Ks + r * LD + c * 8, kc + off, ok);
    cp_async16(Vs + r * LD + c * 8, vc + off, ok);
  }
  cp_async_commit();
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
