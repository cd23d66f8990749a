// fused_experts on the GPU (vLLM's fused MoE; contract in csrc/ops.def), as vLLM's CUDA path
// runs it: the (token, rank) pairs sorted by expert into row tiles, two grouped GEMMs and the
// weighted sum, all on the stream without the host learning how many rows each expert got, so
// a decode step that holds it can be captured in a CUDA graph.
//
// 1. moe_align_kernel (one block): counts the pairs per expert, pads each expert's rows to a
//    whole number of tiles of `bm` rows and gives every pair its row (slot_of_pair), every row
//    its pair (pair_of_slot, -1 for padding) and every tile its expert (tile_expert, -1 for the
//    tiles past the last expert's). The tiles a batch can need are bounded without looking at
//    the ids: ceil(P / bm) + min(P, E) for P pairs.
// 2. the grouped GEMM (linear.cu, launch_grouped_linear): each tile against its expert's w13,
//    its rows read from x through pair_of_slot (zeros in padding rows), so x is never copied
//    into that order (a kernel fewer on a decode step's chain of small ones). On Hopper, for
//    chunks with enough work (sm90_tile), CUTLASS's grouped wgmma GEMM (gemm_grouped_sm90.cu)
//    instead: one group an expert, its rows counted by moe_align_kernel, straight 128-row tiles
//    for prefill and swapped ones (the expert's weights on wgmma's 128-row side) for decode
//    batches; TMA reads whole tiles, so there moe_gather_kernel first copies x's rows into
//    expert order.
// 3. moe_act_kernel: + w13's bias, SwiGLU / gpt-oss's clamped SwiGLU / relu2, per row.
// 4. the grouped GEMM against w2.
// fp8 experts (w13_scale / w2_scale given; Hopper): steps 2-4 as moe_quant_fp8_kernel (x's rows
//    gathered and quantized per 128 values into their expert's block of scales), the fp8
//    grouped GEMM (gemm_grouped_fp8_sm90.cu), moe_quant_fp8_kernel again (the activations
//    computed from h and quantized), the fp8 grouped GEMM against w2.
// 5. moe_combine_kernel: out[t] = sum_j w[t, j] (y[slot(t, j)] + w2's bias), j = 0..k-1 in
//    order, in f32 without fused multiply-adds, like the CPU kernel.
// A row's GEMM results come from that row alone (the mma tiles' rows are independent), so a
// token's output does not depend on which other tokens share its experts' tiles (on the path
// a batch takes: the wgmma GEMM's sums round differently from mma.sync's). Long batches run in
// chunks of tokens, which bounds the scratch rows; each chunk reads every routed expert's
// weights again, so chunks are as long as kChunkScratchBytes allows.
#include <algorithm>
#include <string>

#include "core/op_table.h"
#include "cuda_util.cuh"
#include "fp8.cuh"
#include "gemm_sm90.h"
#include "linear.cuh"
#include "moe/swigluoai.h"
#include "runtime.h"

namespace vllmx::cuda {

namespace {

using lin::LinearArgs;

constexpr const char* kOp = "fused_experts";
constexpr int kAlignThreads = 1024;
constexpr int kAlignUnroll = 8;  // pairs a thread loads at once
constexpr int kMaxExperts = 4096;  // moe_align_kernel's counts and offsets in shared memory
// A chunk's (token, rank) pairs: about as many as kChunkScratchBytes of scratch rows hold (the
// padding rows on top; past it where kMinChunkPairs rows are wider, e.g. Mixtral's ~1.6 GB),
// from kMinChunkPairs to kMaxChunkPairs (16384 tokens at top-8, a whole prefill step of the
// usual token budgets). In chunks of 16384 pairs a prefill step of 8192 tokens read
// Qwen3-30B-A3B's 1.2 GB of experts a layer four times.
constexpr int64_t kChunkScratchBytes = int64_t{1} << 30;
constexpr int64_t kMinChunkPairs = 16384;
constexpr int64_t kMaxChunkPairs = 131072;
// The wgmma path's row tiles: its groups take each expert's rows alone, so short tiles only
// keep the padding rows few. Those rows are never written by the GEMMs: moe_act_kernel turns
// whatever they hold into activations no group reads and no pair's slot names.
constexpr int kSm90ExpertRows = 8;

// expert_first / expert_rows (or nullptr): each expert's first row and its row count, for the
// grouped wgmma GEMM's problem shapes.
__global__ void __launch_bounds__(kAlignThreads)
    moe_align_kernel(const int32_t* __restrict__ ids, int64_t id_stride, int P, int k, int E,
                     int bm, int tiles, int* __restrict__ slot_of_pair,
                     int* __restrict__ pair_of_slot, int* __restrict__ tile_expert,
                     int* __restrict__ expert_first, int* __restrict__ expert_rows) {
  pdl_begin();
  extern __shared__ int align_smem[];
  int* count = align_smem;     // [E]: pairs per expert, then the fill cursor
  int* offset = count + E;     // [E + 1]: first row of each expert (padded)
  const int tid = threadIdx.x;
  for (int e = tid; e < E; e += kAlignThreads) count[e] = 0;
  for (int r = tid; r < tiles * bm; r += kAlignThreads) pair_of_slot[r] = -1;
  for (int i = tid; i < tiles; i += kAlignThreads) tile_expert[i] = -1;
  __syncthreads();
  // Ids outside 0..E-1 (the routing kernels never write one) take no row and add nothing.
  // A thread's kAlignUnroll ids are loaded before any is used: one at a time, the block's
  // 32 warps waited out a memory round trip a pair (97 us for a prefill chunk's 65,536 pairs
  // on an H100).
  auto for_pairs = [&](auto&& f) {
    for (int p0 = tid; p0 < P; p0 += kAlignThreads * kAlignUnroll) {
      int e[kAlignUnroll];
#pragma unroll
      for (int u = 0; u < kAlignUnroll; ++u) {
        const int p = p0 + u * kAlignThreads;
        e[u] = p < P ? ids[(p / k) * id_stride + p % k] : -1;
      }
#pragma unroll
      for (int u = 0; u < kAlignUnroll; ++u)
        if (p0 + u * kAlignThreads < P) f(p0 + u * kAlignThreads, e[u]);
    }
  };
  for_pairs([&](int, int e) {
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  });
  __syncthreads();
  // Exclusive scan of the padded counts by warp 0: each lane a run of experts, then a
  // shuffle scan of the runs' sums.
  if (tid < 32) {
    const int per = (E + 31) / 32, e0 = min(E, tid * per), e1 = min(E, e0 + per);
    int sum = 0;
    for (int e = e0; e < e1; ++e) sum += (count[e] + bm - 1) / bm * bm;
    int incl = sum;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (tid >= d) incl += v;
    }
    int run = incl - sum;
    for (int e = e0; e < e1; ++e) {
      offset[e] = run;
      run += (count[e] + bm - 1) / bm * bm;
    }
    if (tid == 31) offset[E] = incl;
  }
  __syncthreads();
  for (int e = tid; e < E; e += kAlignThreads) {
    for (int i = offset[e] / bm; i < offset[e + 1] / bm; ++i) tile_expert[i] = e;
    count[e] = 0;  // now the fill cursor
  }
  __syncthreads();
  for_pairs([&](int p, int e) {
    int s = -1;
    if (e >= 0 && e < E) {
      s = offset[e] + atomicAdd(&count[e], 1);
      pair_of_slot[s] = p;
    }
    slot_of_pair[p] = s;
  });
  if (expert_first == nullptr) return;
  __syncthreads();
  for (int e = tid; e < E; e += kAlignThreads) {
    expert_first[e] = offset[e];
    expert_rows[e] = count[e];
  }
}

// xs[r] = x[pair_of_slot[r] / k] for the rows that hold a pair (16-byte chunks, `chunks` a row):
// the grouped wgmma GEMM's A operand in expert order. Padding rows are left as they are; no
// group reads them.
__global__ void moe_gather_kernel(uint4* __restrict__ xs, const char* __restrict__ x,
                                  int64_t x_row_bytes, int chunks,
                                  const int* __restrict__ pair_of_slot, int k) {
  pdl_begin();
  const int r = blockIdx.x, p = pair_of_slot[r];
  if (p < 0) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + (p / k) * x_row_bytes);
  uint4* dst = xs + static_cast<int64_t>(r) * chunks;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) dst[c] = src[c];
}

// act[r, i] from h[r] = w13_e x (+ bias[e]): activation 0 silu(gate) * up, 1 gpt-oss's clamped
// SwiGLU, 2 relu2 (h is up alone). Math in f32, one rounding to T. V values a thread (8: one
// 16-byte load of f16 / bf16 gates and one of ups, where I and the rows allow; else 1), tpr
// threads a row and blockDim.x / tpr rows a block: a block a row of 256 threads reading 2-byte
// values took 181 us a Qwen3.5 layer-step of 8192 tokens (67,584 rows of 1024) on an H100,
// 2.6x its bytes' time.
__device__ __forceinline__ float moe_act_value(float g, float u, int activation) {
  if (activation == 2) return squared_relu(g);
  return activation == 1 ? swigluoai(g, u, kSwigluOaiAlpha, kSwigluOaiLimit)
                         : activate<Act::kSilu>(g) * u;
}

template <typename T, int V>
__global__ void moe_act_kernel(T* __restrict__ act, const T* __restrict__ h, int64_t rows,
                               int I, int G, const float* __restrict__ bias,
                               int64_t bias_stride, const int* __restrict__ tile_expert, int bm,
                               int tpr, int activation) {
  pdl_begin();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  if (r >= rows) return;
  const int e = tile_expert[r / bm];
  if (e < 0) return;
  const T* hr = h + r * G;
  const float* b = bias != nullptr ? bias + e * bias_stride : nullptr;
  T* out = act + r * I;
  for (int i = (threadIdx.x % tpr) * V; i < I; i += tpr * V) {
    if constexpr (V == 1) {
      const float g = to_f32(hr[i]) + (b != nullptr ? b[i] : 0.f);
      const float u =
          activation == 2 ? 0.f : to_f32(hr[I + i]) + (b != nullptr ? b[I + i] : 0.f);
      out[i] = from_f32<T>(moe_act_value(g, u, activation));
    } else {
      Vec16<T> g, u;
      g.load(hr + i);
      if (activation != 2) u.load(hr + I + i);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float gj = g.f[j] + (b != nullptr ? b[i + j] : 0.f);
        const float uj = activation == 2 ? 0.f : u.f[j] + (b != nullptr ? b[I + i + j] : 0.f);
        g.f[j] = moe_act_value(gj, uj, activation);
      }
      g.store(out + i);
    }
  }
}

// fp8 experts: the rows a product reads, quantized per 128 values (fp8.cuh, vLLM's
// per_token_group_quant_fp8 rule) into codes q [rows, K] and their expert's block of scales
// (gemm_grouped_fp8_sm90.cu's layout): row r of expert e, i = r - expert_first[e] below
// expert_rows[e], has scale g at scales[expert_first[e] * groups + g * expert_rows[e] + i].
// w13's product reads x's rows through pair_of_slot (gathered and quantized in one pass); w2's
// the activations (kAct), computed here from h's row r (src, `src_stride` = G wide) as
// moe_act_kernel computes them, in f32 and quantized without a 16-bit copy between. One warp a
// (row, group); padding rows are left as they are, no group reads them.
constexpr int kQuantWarps = 8;

struct Fp8RowsArgs {
  uint8_t* q;
  float* scales;
  int64_t rows;
  int groups;  // K / 128
  const int* tile_expert;
  int bm;
  const int* expert_first;
  const int* expert_rows;
  const int* pair_of_slot;  // gather: x's row of slot r is pair_of_slot[r] / k
  int k;
  const float* bias;  // kAct: w13's, [E, G]
  int64_t bias_stride;
  int I, activation;
};

template <typename T, bool kAct>
__global__ void __launch_bounds__(kQuantWarps * 32)
    moe_quant_fp8_kernel(Fp8RowsArgs a, const T* __restrict__ src, int64_t src_stride) {
  pdl_begin();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kQuantWarps + threadIdx.x / 32;
  const int64_t r = item / a.groups;
  const int g = static_cast<int>(item % a.groups), lane = threadIdx.x % 32;
  if (r >= a.rows) return;
  const int e = a.tile_expert[r / a.bm];
  if (e < 0) return;
  const int64_t first = a.expert_first[e], m = a.expert_rows[e], i = r - first;
  if (i >= m) return;
  const int c = g * kFp8GroupValues + lane * 4;
  float v[4];
  if constexpr (kAct) {
    const T* hr = src + r * src_stride;
    const float* b = a.bias != nullptr ? a.bias + e * a.bias_stride : nullptr;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float gj = to_f32(hr[c + j]) + (b != nullptr ? b[c + j] : 0.f);
      const float uj = a.activation == 2
                           ? 0.f
                           : to_f32(hr[a.I + c + j]) + (b != nullptr ? b[a.I + c + j] : 0.f);
      v[j] = moe_act_value(gj, uj, a.activation);
    }
  } else {
    const T* xp = src + static_cast<int64_t>(a.pair_of_slot[r] / a.k) * src_stride + c;
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = to_f32(xp[j]);
  }
  float sc;
  const uint32_t packed = warp_quant_fp8_group(v, &sc);
  *reinterpret_cast<uint32_t*>(a.q + r * a.groups * kFp8GroupValues + c) = packed;
  if (lane == 0) a.scales[first * a.groups + g * m + i] = sc;
}

// out[t, :] = sum_j w[t, j] * (y[slot(t, j)] + bias[e(t, j)]), j in order, no FMA contraction
// (the CPU kernel's order and rounding). A block a (token, chunk of blockDim.x V columns), a
// thread V columns (8: 16-byte loads of f16 / bf16 rows where H allows; else 1). (One block a
// token, its threads walking the row, gave a decode step's handful of tokens as many SMs: 12 us
// at batch 8, Qwen3.5's 2048 columns, top-8, an H100; a thread a column of 2-byte loads took
// 163 us a layer-step of 8192 tokens, 1.8x its bytes' time.)
template <typename T, int V>
__global__ void moe_combine_kernel(T* __restrict__ out, int64_t out_stride,
                                   const T* __restrict__ y, int H,
                                   const float* __restrict__ weights, int64_t w_stride,
                                   const int32_t* __restrict__ ids, int64_t id_stride,
                                   const int* __restrict__ slot_of_pair, int k,
                                   const float* __restrict__ bias, int64_t bias_stride) {
  pdl_begin();
  const int t = blockIdx.x;
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * V;
  if (c >= H) return;
  float acc[V];
  for (int j = 0; j < k; ++j) {
    const int s = slot_of_pair[t * k + j];
    float v[V];
    if (s < 0) {
#pragma unroll
      for (int q = 0; q < V; ++q) v[q] = 0.f;
    } else {
      const T* yr = y + static_cast<int64_t>(s) * H + c;
      if constexpr (V == 1) {
        v[0] = to_f32(yr[0]);
      } else {
        Vec16<T> yv;
        yv.load(yr);
#pragma unroll
        for (int q = 0; q < V; ++q) v[q] = yv.f[q];
      }
      if (bias != nullptr) {
        const float* br = bias + ids[t * id_stride + j] * bias_stride + c;
#pragma unroll
        for (int q = 0; q < V; ++q) v[q] = __fadd_rn(v[q], br[q]);
      }
    }
    const float w = weights[t * w_stride + j];
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const float wv = __fmul_rn(w, v[q]);
      acc[q] = j == 0 ? wv : __fadd_rn(acc[q], wv);
    }
  }
  T* o = out + t * out_stride + c;
  if constexpr (V == 1) {
    o[0] = from_f32<T>(acc[0]);
  } else {
    Vec16<T> ov;
#pragma unroll
    for (int q = 0; q < V; ++q) ov.f[q] = acc[q];
    ov.store(o);
  }
}

// Scratch, grow-only: a captured graph keeps pointing at what it was captured with.
template <int kRole>
void* scratch(size_t bytes) {
  static GrowOnlyBuffer buf;
  return buf.get(std::max<size_t>(bytes, 16));
}

// One grouped product: `rows` rows against each tile's expert of w [E, N, K]; row r reads x's
// row x_row_of[r] / x_row_div (x_row_of nullptr: row r), x_stride elements apart.
void grouped(void* out, const void* x, int64_t x_stride, const int* x_row_of, int x_row_div,
             const Tensor& w, int rows, int bm, const int* tile_expert, DType xt,
             cudaStream_t s) {
  LinearArgs a;
  a.x = x;
  a.w = w.data;
  a.bias = nullptr;
  a.out = out;
  a.T = rows;
  a.N = static_cast<int>(w.shape[1]);
  a.K = static_cast<int>(w.shape[2]);
  a.x_stride = x_stride;
  a.x_row_of = x_row_of;
  a.x_row_div = x_row_div;
  a.out_stride = a.N;
  a.w_stride = w.stride[1];
  a.pair_store = a.N % 2 == 0;
  a.tile_expert = tile_expert;
  a.tile_rows = bm;
  a.w_expert_stride = w.stride[0] * type_traits(xt).type_size;
  lin::launch_grouped_linear(a, xt, s);
}

#ifdef VLLMX_WITH_SM90_GEMM
// TMA's terms for an expert stack: 16-byte aligned, rows and experts a multiple of 16 bytes apart.
bool tma_stack(const Tensor& w) {
  const int64_t es = type_traits(w.dtype).type_size;
  return aligned(w.data, 16) && w.stride[1] * es % 16 == 0 && w.stride[0] * es % 16 == 0;
}

// The grouped wgmma GEMM's tile for a chunk of P pairs over E experts whose products are at
// least N wide, or false: the mma.sync kernels. Straight 128 x 128 tiles where rows an expert are
// many; else the swapped ones, which give an active expert's weights N / 128 units of work and
// no split-K, so they take only chunks with at least two units an SM (Qwen3-30B-A3B on the H200
// from 3 tokens; not a batch of 1-2, whose 8-16 experts the mma.sync kernel's 64-row tiles
// spread over more SMs; never Mixtral's decode, 8 experts x 32 units).
bool sm90_tile(int64_t P, int64_t E, int64_t N, Sm90GroupedTile* tile) {
  if (lin::grouped_rows_many(P, E)) {
    *tile = Sm90GroupedTile::k128x128;
    return true;
  }
  const int64_t active = std::min(P, E);
  if (active * (N / 128) < 2 * detail::num_sms()) return false;
  *tile = P <= 16 * active ? Sm90GroupedTile::kSwap128x16 : Sm90GroupedTile::kSwap128x64;
  return true;
}

// A grouped product's problem: expert e's rows of x (x_stride elements apart, counted on the
// device) against w's expert e, into out's rows (N wide) of the same slots; xt: out's dtype.
Sm90GroupedArgs grouped_args(void* out, const void* x, int64_t x_stride, const Tensor& w,
                             const int* expert_first, const int* expert_rows, DType xt) {
  Sm90GroupedArgs g;
  g.x = x;
  g.w = w.data;
  g.out = out;
  g.experts = static_cast<int>(w.shape[0]);
  g.N = static_cast<int>(w.shape[1]);
  g.K = static_cast<int>(w.shape[2]);
  g.x_stride = x_stride;
  g.w_stride = w.stride[1];
  g.out_stride = g.N;
  g.w_expert_stride = w.stride[0];
  g.expert_first = expert_first;
  g.expert_rows = expert_rows;
  g.bf16 = xt == DType::BF16;
  g.num_sms = detail::num_sms();
  return g;
}

// One grouped product on CUTLASS's wgmma GEMM (gemm_grouped_sm90.cu): expert e's rows of x (in
// expert order, x_stride apart, counted by moe_align_kernel) against its slice of w.
void grouped_sm90(void* out, const void* x, int64_t x_stride, const Tensor& w,
                  const int* expert_first, const int* expert_rows, Sm90GroupedTile tile,
                  DType xt, cudaStream_t s) {
  sm90_grouped_gemm(grouped_args(out, x, x_stride, w, expert_first, expert_rows, xt), tile, s);
}

// fp8 experts (gemm_grouped_fp8_sm90.cu): the rows' codes xq (K-wide rows) and their expert
// blocks of scales (moe_quant_fp8_kernel's), against w's codes and w_scale [E, K / 128, N].
void grouped_sm90_fp8(void* out, const void* xq, const float* x_scale, const Tensor& w,
                      const Tensor& w_scale, const int* expert_first, const int* expert_rows,
                      Sm90GroupedTile tile, DType xt, cudaStream_t s) {
  Sm90GroupedFp8Args f;
  f.g = grouped_args(out, xq, w.shape[2], w, expert_first, expert_rows, xt);
  f.x_scale = x_scale;
  f.w_scale = w_scale.ptr<float>();
  f.w_scale_expert_stride = w_scale.stride[0];
  sm90_grouped_fp8_gemm(f, tile, s);
}

// The fp8 grouped GEMM's tile: as sm90_tile's, but fp8 experts have no mma.sync kernel, so the
// swapped tiles take every chunk the straight ones do not.
Sm90GroupedTile fp8_tile(int64_t P, int64_t E) {
  if (lin::grouped_rows_many(P, E)) return Sm90GroupedTile::k128x128;
  return P <= 16 * std::min(P, E) ? Sm90GroupedTile::kSwap128x16 : Sm90GroupedTile::kSwap128x64;
}
#endif

// A stacked expert weight: x's dtype, or fp8 e4m3 codes where `scale` is given.
void check_stack(const Tensor& w, const char* name, DType xt, int64_t E, int64_t N, int64_t K,
                 const Tensor& scale) {
  check_on_device(w, kOp, name);
  const DType wt = scale.defined() ? DType::F8_E4M3 : xt;
  VLLMX_CHECK(w.defined() && w.ndim == 3 && w.dtype == wt && w.stride[2] == 1 &&
                  w.stride[1] >= w.shape[2] && w.stride[0] >= w.shape[1] * w.stride[1],
              kOp,
              std::string(name) + " " + w.str() + " must be a stacked [E, N, K] weight in " +
                  (scale.defined() ? "fp8 e4m3 (its scales given)" : "x's dtype") +
                  " with contiguous rows (the GPU runs bf16 / f16 / f32 and fp8 experts)");
  VLLMX_CHECK(w.shape[0] == E && (N < 0 || w.shape[1] == N) && w.shape[2] == K, kOp,
              std::string(name) + " " + w.str() + " disagrees with the other operands");
  if (scale.defined()) check_on_device(scale, kOp, name);
}

void check_bias(const Tensor& b, const char* name, int64_t E, int64_t N) {
  if (!b.defined()) return;
  check_on_device(b, kOp, name);
  VLLMX_CHECK(b.dtype == DType::F32 && b.ndim == 2 && b.shape[0] == E && b.shape[1] == N &&
                  b.stride[1] == 1,
              kOp, std::string(name) + " " + b.str() + " must be f32 [" + std::to_string(E) +
                       ", " + std::to_string(N) + "]");
}

void fused_experts(const Tensor& out, const Tensor& x, const Tensor& w13, const Tensor& w2,
                   const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& w13_bias,
                   const Tensor& w2_bias, int64_t activation, const Tensor& w13_scale,
                   const Tensor& w2_scale) {
  VLLMX_CHECK(activation >= 0 && activation <= 2, kOp,
              "activation must be 0 (silu), 1 (swigluoai) or 2 (relu2)");
  for (const Tensor* t : {&out, &x, &topk_weights, &topk_ids}) check_on_device(*t, kOp, "tensor");
  check_act(x, kOp, "x");
  check_rows(x, kOp, "x");
  check_rows(out, kOp, "out");
  const DType xt = x.dtype;
  const int64_t T = x.shape[0], H = x.shape[1];
  VLLMX_CHECK(out.dtype == xt && out.ndim == 2 && out.shape[0] == T && out.shape[1] == H, kOp,
              "out " + out.str() + " must be like x " + x.str());
  VLLMX_CHECK(w13.defined() && w13.ndim == 3, kOp, "w13 must be a stacked [E, 2 I, H] weight");
  const int64_t E = w13.shape[0], G = w13.shape[1];
  const int64_t I = activation == 2 ? G : G / 2;
  VLLMX_CHECK(activation == 2 || G % 2 == 0, kOp, "w13 " + w13.str() + " must be [E, 2 I, H]");
  const bool fp8 = w13_scale.defined();
  check_stack(w13, "w13", xt, E, -1, H, w13_scale);
  check_stack(w2, "w2", xt, E, H, I, w2_scale);
  VLLMX_CHECK(E >= 1 && E <= kMaxExperts, kOp,
              "1 to " + std::to_string(kMaxExperts) + " experts, got w13 " + w13.str());
  VLLMX_CHECK(topk_ids.dtype == DType::I32 && topk_ids.ndim == 2 && topk_ids.shape[0] == T &&
                  topk_ids.stride[1] == 1 && topk_ids.shape[1] >= 1,
              kOp, "topk_ids " + topk_ids.str() + " must be i32 [T, k] for x " + x.str());
  const int64_t k = topk_ids.shape[1];
  VLLMX_CHECK(topk_weights.dtype == DType::F32 && topk_weights.ndim == 2 &&
                  topk_weights.shape[0] == T && topk_weights.shape[1] == k &&
                  topk_weights.stride[1] == 1,
              kOp, "topk_weights " + topk_weights.str() + " must be f32 [T, k] like topk_ids");
  check_bias(w13_bias, "w13_bias", E, G);
  check_bias(w2_bias, "w2_bias", E, H);
  if (T == 0 || H == 0) return;
  VLLMX_CHECK(T * k < (int64_t{1} << 30) && G * H < (int64_t{1} << 31), kOp,
              "too large: x " + x.str() + ", w13 " + w13.str());

  cudaStream_t s = stream();
  const size_t es = static_cast<size_t>(type_traits(xt).type_size);
  const bool tensor_cores = xt != DType::F32 && H % 8 == 0 && I % 8 == 0;
  // Hopper's grouped wgmma GEMM for the chunks sm90_tile gives one, where x's rows can be copied
  // in 16-byte chunks and TMA takes the weights.
#ifdef VLLMX_WITH_SM90_GEMM
  const bool sm90_ok = tensor_cores && detail::sm90_kernels() && aligned(x.data, 16) &&
                       x.stride[0] * static_cast<int64_t>(es) % 16 == 0 && tma_stack(w13) &&
                       tma_stack(w2);
  // fp8 experts run on the fp8 grouped GEMM alone: what the 16-bit one needs (Hopper, 16-byte
  // rows) and K's of whole 128s (H for w13, I for w2).
  const bool fp8_ok = sm90_ok && H % kFp8GroupValues == 0 && I % kFp8GroupValues == 0;
#else
  const bool fp8_ok = false;
#endif
  VLLMX_CHECK(!fp8 || fp8_ok, kOp,
              "fp8 experts run on Hopper (compute capability 9.0, an sm_90a build) only, with "
              "x " + x.str() + " 16-byte aligned in bf16 / f16 and H, I whole 128s (w13 " +
              w13.str() + ", w2 " + w2.str() + ")");
  // Scratch a row: w13's products, the activations, w2's products, x's gathered copy (fp8: its
  // codes and scales, or the activations').
  const int64_t row_bytes = (G + I + 2 * H) * static_cast<int64_t>(es) +
                            (fp8 ? std::max(H, I) * 2 : 0);
  const int64_t chunk_pairs =
      std::clamp(kChunkScratchBytes / row_bytes, kMinChunkPairs, kMaxChunkPairs);
  const int64_t chunk = std::max<int64_t>(1, chunk_pairs / k);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t nt = std::min(chunk, T - t0), P = nt * k;
    bool sm90 = false;
#ifdef VLLMX_WITH_SM90_GEMM
    Sm90GroupedTile tile{};
    if (fp8) {
      tile = fp8_tile(P, E);
      sm90 = true;
    } else {
      sm90 = sm90_ok && sm90_tile(P, E, std::min(G, H), &tile);
    }
#endif
    const int bm = sm90 ? kSm90ExpertRows : lin::grouped_tile_rows(tensor_cores, P, E);
    const int64_t tiles = (P + bm - 1) / bm + std::min(P, E), rows = tiles * bm;
    int* slot_of_pair = static_cast<int*>(scratch<0>(P * sizeof(int)));
    int* pair_of_slot = static_cast<int*>(scratch<1>(rows * sizeof(int)));
    int* tile_expert = static_cast<int*>(scratch<2>(tiles * sizeof(int)));
    void* xg = fp8 ? nullptr : scratch<3>(rows * I * es);  // the activations, row by row
    void* h = scratch<4>(rows * G * es);   // w13's products
    int* expert_first = sm90 ? static_cast<int*>(scratch<6>(2 * E * sizeof(int))) : nullptr;
    int* expert_rows = sm90 ? expert_first + E : nullptr;
    const int32_t* ids = topk_ids.ptr<int32_t>() + t0 * topk_ids.stride[0];
    launch(moe_align_kernel, 1, kAlignThreads, (2 * E + 1) * sizeof(int), s, ids,
           topk_ids.stride[0], static_cast<int>(P), static_cast<int>(k), static_cast<int>(E),
           bm, static_cast<int>(tiles), slot_of_pair, pair_of_slot, tile_expert, expert_first,
           expert_rows);
    check_launch("moe_align_kernel");
    const char* x0 = static_cast<const char*>(x.data) + t0 * x.stride[0] * es;
    // fp8 experts: rows quantized by moe_quant_fp8_kernel (x's gathered for w13, or the
    // activations computed from h for w2), then the fp8 grouped GEMM.
    auto fp8_product = [&](void* out_rows, const void* src, int64_t src_stride, bool act,
                           const Tensor& w, const Tensor& w_scale) {
#ifdef VLLMX_WITH_SM90_GEMM
      const int64_t K = w.shape[2];
      Fp8RowsArgs qa{};
      qa.groups = static_cast<int>(K / kFp8GroupValues);
      qa.rows = rows;
      qa.q = static_cast<uint8_t*>(scratch<8>(rows * K));
      qa.scales = static_cast<float*>(scratch<9>(rows * qa.groups * sizeof(float)));
      qa.tile_expert = tile_expert;
      qa.bm = bm;
      qa.expert_first = expert_first;
      qa.expert_rows = expert_rows;
      qa.pair_of_slot = pair_of_slot;
      qa.k = static_cast<int>(k);
      qa.bias = w13_bias.defined() ? w13_bias.ptr<float>() : nullptr;
      qa.bias_stride = w13_bias.defined() ? w13_bias.stride[0] : 0;
      qa.I = static_cast<int>(I);
      qa.activation = static_cast<int>(activation);
      const auto blocks =
          static_cast<unsigned>((rows * qa.groups + kQuantWarps - 1) / kQuantWarps);
      dispatch_float(xt, kOp, [&](auto z) {
        using TQ = decltype(z);
        launch(act ? moe_quant_fp8_kernel<TQ, true> : moe_quant_fp8_kernel<TQ, false>, blocks,
               kQuantWarps * 32, 0, s, qa, static_cast<const TQ*>(src), src_stride);
      });
      check_launch("moe_quant_fp8_kernel");
      grouped_sm90_fp8(out_rows, qa.q, qa.scales, w, w_scale, expert_first, expert_rows, tile,
                       xt, s);
#else
      (void)out_rows, (void)src, (void)src_stride, (void)act, (void)w, (void)w_scale;
#endif
    };
    // The wgmma and mma.sync products of w13 and w2; on the mma.sync path w13's product reads
    // x's rows (this chunk's) through pair_of_slot: no gathered copy.
    auto product = [&](void* out_rows, const void* in_rows, int64_t in_stride, const int* row_of,
                       int row_div, const Tensor& w) {
#ifdef VLLMX_WITH_SM90_GEMM
      if (sm90) {
        grouped_sm90(out_rows, in_rows, in_stride, w, expert_first, expert_rows, tile, xt, s);
        return;
      }
#endif
      grouped(out_rows, in_rows, in_stride, row_of, row_div, w, static_cast<int>(rows), bm,
              tile_expert, xt, s);
    };
    if (fp8) {
      fp8_product(h, x0, x.stride[0], false, w13, w13_scale);
    } else if (sm90) {
      void* xs = scratch<7>(rows * H * es);
      const int chunks = static_cast<int>(H * static_cast<int64_t>(es) / 16);
      launch(moe_gather_kernel, static_cast<unsigned>(rows),
             std::min(256, (chunks + 31) / 32 * 32), 0, s, static_cast<uint4*>(xs), x0,
             x.stride[0] * static_cast<int64_t>(es), chunks, pair_of_slot, static_cast<int>(k));
      check_launch("moe_gather_kernel");
      product(h, xs, H, nullptr, 1, w13);
    } else {
      product(h, x0, x.stride[0], pair_of_slot, static_cast<int>(k), w13);
    }
    void* y = scratch<5>(rows * H * es);
    dispatch_float(xt, kOp, [&](auto z) {
      using TA = decltype(z);
      // 16-byte vectors of 8 values where the rows are whole vectors apart (the scratch rows
      // start 16-byte aligned; out's rows where its pointer and stride keep them so).
      constexpr int kV = sizeof(TA) == 2 ? Vec16<TA>::N : 1;
      const bool act_vec = kV > 1 && I % kV == 0;
      const int tpr = static_cast<int>(
          std::min<int64_t>(256, ((act_vec ? I / kV : I) + 31) / 32 * 32));
      const int rpb = 256 / tpr;
      if (fp8) {  // the activations quantized as they are computed
        fp8_product(y, h, G, true, w2, w2_scale);
      } else {
        auto act_kernel = act_vec ? moe_act_kernel<TA, kV> : moe_act_kernel<TA, 1>;
        launch(act_kernel, static_cast<unsigned>((rows + rpb - 1) / rpb), rpb * tpr, 0, s,
               static_cast<TA*>(xg), static_cast<const TA*>(h), rows, static_cast<int>(I),
               static_cast<int>(G), w13_bias.defined() ? w13_bias.ptr<float>() : nullptr,
               w13_bias.defined() ? w13_bias.stride[0] : 0, tile_expert, bm, tpr,
               static_cast<int>(activation));
        check_launch("moe_act_kernel");
        product(y, xg, I, nullptr, 1, w2);
      }
      TA* out0 = out.ptr<TA>() + t0 * out.stride[0];
      const bool comb_vec = kV > 1 && H % kV == 0 && vec16_ok<TA>(out0, out.stride[0]);
      const int per = comb_vec ? kV : 1;  // columns a thread
      // A block 64 threads of vectors (512 columns), or 256 of columns.
      const int ct = static_cast<int>(
          std::min<int64_t>(comb_vec ? 64 : 256, (H / per + 31) / 32 * 32));
      auto comb_kernel = comb_vec ? moe_combine_kernel<TA, kV> : moe_combine_kernel<TA, 1>;
      launch(comb_kernel, dim3(static_cast<unsigned>(nt),
                               static_cast<unsigned>((H + ct * per - 1) / (ct * per))),
             ct, 0, s, out0, out.stride[0], static_cast<const TA*>(y), static_cast<int>(H),
             topk_weights.ptr<float>() + t0 * topk_weights.stride[0], topk_weights.stride[0],
             ids, topk_ids.stride[0], slot_of_pair, static_cast<int>(k),
             w2_bias.defined() ? w2_bias.ptr<float>() : nullptr,
             w2_bias.defined() ? w2_bias.stride[0] : 0);
      check_launch("moe_combine_kernel");
    });
  }
}

}  // namespace

VLLMX_KERNEL(fused_experts, kCUDA, fused_experts);

}  // namespace vllmx::cuda
