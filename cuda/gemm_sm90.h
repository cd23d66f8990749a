// Dense bf16/f16 GEMM for Hopper (sm_90a) through CUTLASS 3: TMA loads, warp-specialized wgmma
// (cooperative: two consumer warpgroups share a tile), the stream-K tile scheduler, f32
// accumulation and a fused bias; for few tokens the operands swap (cuda/gemm_sm90.cuh).
// cuda/linear_plan.cu decides when and with which tile (plan_linear); this header is the whole
// interface.
//
// cuda/gemm_sm90.cu is compiled only when the build targets sm_90a, and then defines
// VLLMX_WITH_SM90_GEMM for linear.cu; elsewhere linear.cu never takes this path.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace vllmx::cuda {

// How the persistent tile scheduler hands out a CUTLASS GEMM's output tiles.
// - decomposition / splits: the stream-K scheduler's cutlass DecompositionMode (-1: its
//   heuristic) and split-K factor (0: its own);
// - swizzle: cutlass's max_swizzle_size: consecutive CTAs take tiles in runs of `swizzle` along
//   the raster's minor dimension, so that one wave's x and w tiles fit in L2 together (at
//   swizzle 1 a wave of a prefill product spans all of x's tile rows: 64 MB at 8192 tokens of
//   K = 4096, more than the L2, so x streams from memory once per wave). The scheduler rounds
//   the tile grid up to whole runs and runs the padding tiles empty, so the planner only asks
//   for runs that divide the grid;
// - raster: cutlass RasterOrderOptions, 0 its heuristic (along the shorter dimension), 1 along
//   M (T straight), 2 along N.
struct Sm90Schedule {
  int decomposition = -1;
  int splits = 0;
  int swizzle = 1;
  int raster = 0;
};

// out[T, N] = x[T, K] @ w[N, K]^T (+ bias[N]); x, w, bias, out all bf16 (or all f16), rows
// contiguous in K (x, w) and N (out). TMA needs x, w, out 16-byte aligned and K, N and the three
// row strides multiples of 8 elements (the caller checks). bias may be null; it is read element
// by element, so it needs no alignment.
struct Sm90GemmArgs {
  const void* x;
  const void* w;
  const void* bias;
  void* out;
  int T, N, K;
  int64_t x_stride, w_stride, out_stride;  // elements
  bool bf16;                               // else f16
  int num_sms;                             // the persistent grid's size
  Sm90Schedule schedule;
};

enum class Sm90Tile {
  k128x128,      // cluster 1x2x1 (x tiles multicast to the pair): any T
  k128x256,      // cluster 2x1x1 (w tiles multicast to the pair): many tiles (large T * N)
  kSwap128x16,   // swapped, 128 weight rows x 16 tokens: T <= 16
  kSwap128x32,   // swapped, 128 weight rows x 32 tokens: T <= 32
  kSwap128x64,   // swapped, 128 weight rows x 64 tokens: T <= 64
  kSwap128x128,  // swapped, 128 weight rows x 128 tokens: T <= 128
  kPingpong128x128,  // k128x128's extent and cluster on the ping-pong kernel (a warpgroup a
                     // tile; data-parallel, persistent): T = 512-2047
  k256x128,          // 256 tokens x 128 weight rows, cluster 1x2x1 (x tiles multicast to the
                     // pair), cooperative: T >= 2048 where its tiles fill the SMs
  k128x32,           // 128 tokens x 32 weight rows, cluster 1x2x1 (x tiles multicast to the
                     // pair), cooperative: decode batches of 65-256 tokens, where a 4096-row
                     // product then has about a tile per SM
  k128x64,           // 128 tokens x 64 weight rows, the same
  // The same three extents on a 2x1x1 cluster: two token tiles share (multicast) a weight tile
  // and each loads its own x tile, where the 1x2 clusters above share x's. A 1x2 cluster's
  // partial last token tile costs it 15-40% (bench/results/gpu_linear_partial_tiles_h100.json);
  // these are timed against them (bench/gpu_kernels_vs_torch.py --plans), not yet planned.
  k128x32c21,
  k128x64c21,
  k128x128c21,
  // And the prefill-sized ones' (kPingpong128x128, k256x128): mixed steps of a serving run
  // take any T, rarely whole 128- or 256-token tiles.
  kPingpong128x128c21,
  k256x128c21,
};

// Launches on stream s: no host sync, no allocation once warm (the stream-K workspace comes
// from a grow-only buffer). Throws std::runtime_error naming the shapes when CUTLASS refuses the
// problem or the launch fails.
void sm90_gemm(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s);
// gemm_swap_sm90.cu: the kSwap128x64 / kSwap128x128 tiles; gemm_swap_narrow_sm90.cu: the
// 16- and 32-token ones (decode batches).
void sm90_gemm_swapped(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s);
void sm90_gemm_swapped_narrow(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s);
// gemm_prefill_sm90.cu: kPingpong128x128 and k256x128 (prefill-sized T) and their 2x1-cluster
// twins.
void sm90_gemm_prefill(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s);
// gemm_decode_sm90.cu: k128x32 and k128x64 (decode-sized T, narrow weight tiles) and their
// 2x1-cluster twins, k128x128c21 too.
void sm90_gemm_decode(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s);

// gemm_fp8_sm90.cu: out[T, N] = sum over 128-wide groups g of K of
//   x_scale[g][t] * w_scale[g][n] * (x[t, g] . w[n, g])   (+ bias[N]),
// x [T, K] and w [N, K] fp8 e4m3 (rows contiguous in K, 16-byte aligned, K a multiple of 128,
// strides multiples of 16 bytes), the scales f32 and dense, [K / 128][T] and [K / 128][N]; out
// and bias bf16 (or f16). Tiles: k128x128 (straight), kSwap128x16 and kSwap128x64.
constexpr int kFp8Group = 128;
struct Sm90Fp8GemmArgs {
  const void* x;
  const float* x_scale;
  const void* w;
  const float* w_scale;
  const void* bias;
  void* out;
  int T, N, K;
  int64_t x_stride, w_stride, out_stride;  // elements
  bool bf16;                               // out and bias; else f16
  int num_sms;
  Sm90Schedule schedule;  // decomposition and splits only for the stream-K tiles (swapped)
};
void sm90_fp8_gemm(const Sm90Fp8GemmArgs& a, Sm90Tile tile, cudaStream_t s);

// gemm_grouped_sm90.cu: fused_experts' grouped product, one group an expert e < experts:
// out[f : f + m, :N] = x[f : f + m, :K] @ w[e]^T with f = expert_first[e], m = expert_rows[e]
// (device arrays, written by an earlier kernel on the stream; m may be 0). x, w, out of one
// 16-bit dtype, 16-byte aligned, K, N and the strides multiples of 8 elements (the caller
// checks). Rows of x or out that no expert names are neither read nor written.
struct Sm90GroupedArgs {
  const void* x;
  const void* w;  // [experts, N, K]
  void* out;
  int experts, N, K;
  int64_t x_stride, w_stride, out_stride;  // elements between rows
  int64_t w_expert_stride;                 // elements between experts
  const int* expert_first;
  const int* expert_rows;
  bool bf16;    // else f16
  int num_sms;  // the persistent grid's size
};
// Its tiles: 128 rows x 128 weight rows where an expert has many rows (prefill); weights on the
// 128-row side and an expert's rows on a 16- or 64-wide one where it has few (decode).
enum class Sm90GroupedTile { k128x128, kSwap128x16, kSwap128x64 };
void sm90_grouped_gemm(const Sm90GroupedArgs& g, Sm90GroupedTile tile, cudaStream_t s);

// gemm_grouped_fp8_sm90.cu: the same grouped product over fp8 experts (vLLM's block-fp8 MoE):
// g.x and g.w e4m3 codes (K a multiple of 128, rows and experts multiples of 16 bytes apart),
// out bf16 (g.bf16) or f16, each 128-wide group of K scaled by w's scale for its row and
// group, w_scale + e * w_scale_expert_stride ([K / 128][N] an expert), times x's for its row:
// expert e's rows' scales [K / 128][m] from x_scale + expert_first[e] * K / 128.
struct Sm90GroupedFp8Args {
  Sm90GroupedArgs g;
  const float* x_scale;
  const float* w_scale;
  int64_t w_scale_expert_stride;  // floats
};
void sm90_grouped_fp8_gemm(const Sm90GroupedFp8Args& f, Sm90GroupedTile tile, cudaStream_t s);

}  // namespace vllmx::cuda
