// Shared by the two skinny GEMMs (gemm_skinny.cu: x and w of one 16-bit dtype;
// gemm_skinny_quant.cu: block-quantized w): the CTA shape, the split-K plan and scratch, and
// the epilogue. Internal to those two files.
#pragma once
#include <algorithm>

#include "linear.cuh"
#include "runtime.h"

namespace vllmx::cuda::lin::skinny {

constexpr int kRows = 64;  // w rows per CTA: 4 warps x 16
constexpr int kThreads = 128;
constexpr int kMaxSplits = 16;

// How a product's K range is split over CTAs, and the split-K scratch.
struct SplitK {
  int splits = 1, per = 0;  // per: pipeline stages a split runs
  float* partials = nullptr;
  int* counters = nullptr;
};

// Splits so that the CTAs fill the GPU once (ctas_per_sm at a time; a second, partial wave would
// leave most SMs idle at its end), each split at least min_per stages long; then no split is
// left empty. A function of N, K and the kernel, never of T: a row's bits do not depend on the
// batch.
inline SplitK split_k(int tiles, int k_tiles, int ctas_per_sm, int min_per) {
  SplitK p;
  p.splits = std::clamp(ctas_per_sm * num_sms() / tiles, 1, kMaxSplits);
  p.splits = std::max(1, std::min(p.splits, k_tiles / min_per));
  p.per = (k_tiles + p.splits - 1) / p.splits;
  p.splits = std::max(1, (k_tiles + p.per - 1) / p.per);
  return p;
}
// p's split-K scratch, where it has splits; tt: the token tile the partials hold.
inline void split_scratch(SplitK& p, int tiles, int tt) {
  if (p.splits > 1) {
    static GrowOnlyBuffer partial_buf, counter_buf(/*zeroed=*/true);
    p.partials = static_cast<float*>(
        partial_buf.get(static_cast<size_t>(tiles) * p.splits * kRows * tt * sizeof(float)));
    p.counters = static_cast<int*>(counter_buf.get(static_cast<size_t>(tiles) * sizeof(int)));
  }
}
// split_k with its scratch.
inline SplitK plan_split(int tiles, int k_tiles, int ctas_per_sm, int min_per, int tt) {
  SplitK p = split_k(tiles, k_tiles, ctas_per_sm, min_per);
  split_scratch(p, tiles, tt);
  return p;
}

// The start of both skinny kernels' pipelines: the first S - 1 stages' weight copies before
// the wait for the previous kernel (w is never its output; x may be), then x's, one commit
// group a stage, and the wait for stage 0.
template <int S, class LoadW, class LoadX>
__device__ __forceinline__ void skinny_prologue(int nkt, const LoadW& load_w, const LoadX& load_x) {
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < nkt) load_w(s, s);
  pdl_begin();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nkt) load_x(s, s);
    cp_async_commit();
  }
  cp_async_wait<S - 2>();
  __syncthreads();
}

// The end of the skinny kernels: acc[j][e] (an m16n8 tile per 8 tokens, warp w's 16 rows)
// to out directly, or with split-K through f32 partials that the tile's last CTA adds in split
// order (an atomic ticket), so that no bit depends on which CTA finished first. Threads not
// active (a producer warp past the kThreads that hold acc) only join its barriers.
template <int NT>
__device__ __forceinline__ void skinny_epilogue(const LinearArgs& a, bool kBf,
                                                const float (&acc)[NT][4], int n0,
                                                float* partials, int* counters,
                                                bool active = true) {
  constexpr int TT = 8 * NT;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int split = blockIdx.y, splits = gridDim.y;
  // acc[j][e] is w row warp * 16 + lane / 4 (+ 8 for e >= 2), token j * 8 + (lane % 4) * 2
  // (+ 1 for odd e): its index in the CTA's [kRows][TT] tile.
  auto local = [&](int j, int e) {
    return (warp * 16 + lane / 4 + (e >= 2 ? 8 : 0)) * TT + j * 8 + (lane % 4) * 2 + (e & 1);
  };
  if (splits == 1) {
    if (!active) return;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = n0 + warp * 16 + lane / 4 + (e >= 2 ? 8 : 0);
        const int t = j * 8 + (lane % 4) * 2 + (e & 1);
        if (n < a.N && t < a.T) store_out(a, kBf, t, n, acc[j][e], 0.f, false);
      }
    return;
  }
  float* mine = partials + (static_cast<int64_t>(blockIdx.x) * splits + split) * kRows * TT;
  if (active)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2)
        *reinterpret_cast<float2*>(mine + local(j, e)) = make_float2(acc[j][e], acc[j][e + 1]);
  __threadfence();  // the partials are visible before the ticket says so
  __syncthreads();
  __shared__ bool last;
  if (tid == 0) last = atomicAdd(&counters[blockIdx.x], 1) == splits - 1;
  __syncthreads();
  if (!last || !active) return;
  __threadfence();
  // The last CTA adds the tile's partials split by split (a fixed order), every thread over its
  // float4s of the [kRows][TT] tile, all loads of all splits in flight at once.
  constexpr int kTile4 = kRows * TT / 4, kVec = kTile4 / kThreads;
  const float4* tile =
      reinterpret_cast<const float4*>(partials) + static_cast<int64_t>(blockIdx.x) * splits * kTile4;
  float4 sum[kVec];
#pragma unroll
  for (int v = 0; v < kVec; ++v) sum[v] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int sp = 0; sp < kMaxSplits; ++sp) {
    if (sp < splits) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const float4 p = __ldcg(tile + sp * kTile4 + tid + v * kThreads);
        sum[v].x += p.x, sum[v].y += p.y, sum[v].z += p.z, sum[v].w += p.w;
      }
    }
  }
  if (tid == 0) counters[blockIdx.x] = 0;  // ready for the next launch (and graph replay)
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    const int idx = (tid + v * kThreads) * 4, n = n0 + idx / TT, t = idx % TT;
    const float r[4] = {sum[v].x, sum[v].y, sum[v].z, sum[v].w};
    if (n < a.N)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (t + c < a.T) store_out(a, kBf, t + c, n, r[c], 0.f, false);
  }
}

}  // namespace vllmx::cuda::lin::skinny

namespace vllmx::cuda::lin {
// gemm_skinny_bulk_sm90.cu: the skinny GEMM fed by TMA, where the GPU, the product's shape
// (skinny_bulk_ctas_per_sm) and its operands' alignment suit it (returns false, launching
// nothing, where they do not).
bool launch_gemm_skinny_bulk(const LinearArgs& a, bool bf16, cudaStream_t s);
}  // namespace vllmx::cuda::lin
