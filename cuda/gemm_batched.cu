// batched_linear's kernel for a few rows (MLA's per-head projections in decode steps):
// out[t, g, :] = x[t, g, :] @ w[g]^T for every group g in one launch, on the tensor cores.
// linear() through each group in turn costs a launch a group: 2 x 16 a DeepSeek-V2-Lite layer,
// 2 x 128 a V3 one, each a few microseconds of work. A CTA takes 16 rows x 128 columns of one
// group (4 warps of 32 columns), K in chunks of 64 double-buffered by cp.async; x and out are
// read and written through their strides (MLA passes column views). Many rows (prefill) still
// go group by group through linear, whose GEMMs reuse each weight tile across the rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda_ops.h"
#include "cuda_util.cuh"
#include "mma.cuh"

namespace vllmx::cuda {

namespace {

using namespace detail;

constexpr int kBM = 16, kBN = 128, kBK = 64, kWarps = 4, kThreads = kWarps * 32, kStages = 2;
constexpr int kLD = kBK + 8;  // shared row stride (elements): conflict-free ldmatrix
constexpr int kMaxRows = 256;  // rows past which linear's GEMMs, group by group, do better

template <typename E>
__global__ void __launch_bounds__(kThreads) batched_gemm_kernel(
    const E* __restrict__ x, int64_t x_t, int64_t x_g, const E* __restrict__ w, E* __restrict__ out,
    int64_t out_t, int64_t out_g, int T, int N, int K) {
  pdl_begin();
  const int n0 = blockIdx.x * kBN, g = blockIdx.y, t0 = blockIdx.z * kBM;
  __shared__ alignas(16) E Xs[kStages][kBM][kLD];
  __shared__ alignas(16) E Ws[kStages][kBN][kLD];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const E* xg = x + g * x_g;
  const E* wg = w + static_cast<int64_t>(g) * N * K;
  const int nk = (K + kBK - 1) / kBK;
  // Rows past T or N and columns past K are zero-filled (their sources never read).
  auto load = [&](int kc) {
    if (kc < nk) {
      const int k0 = kc * kBK, s = kc % kStages;
      {  // x: 16 rows x 8 chunks, one a thread
        const int r = tid / 8, c = tid % 8, t = t0 + r, k = k0 + c * 8;
        const bool ok = t < T && k < K;
        cp_async16(&Xs[s][r][c * 8], xg + (ok ? t * x_t + k : 0), ok);
      }
      for (int i = tid; i < kBN * (kBK / 8); i += kThreads) {
        const int r = i / (kBK / 8), c = i % (kBK / 8), n = n0 + r, k = k0 + c * 8;
        const bool ok = n < N && k < K;
        cp_async16(&Ws[s][r][c * 8], wg + (ok ? static_cast<int64_t>(n) * K + k : 0), ok);
      }
    }
    cp_async_commit();  // (an empty group past the last chunk: the wait counts groups)
  };
  load(0);
  float acc[4][4];  // the warp's 32 columns: four n8 tiles
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  for (int kc = 0; kc < nk; ++kc) {
    load(kc + 1);
    cp_async_wait<1>();
    __syncthreads();
    const int s = kc % kStages;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, &Xs[s][lane % 16][kk * 16 + (lane / 16) * 8]);
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // 16 columns an ldmatrix: n8 tiles 2j and 2j + 1
        uint32_t b[4];
        ldmatrix_x4(b, &Ws[s][warp * 32 + j * 16 + lane % 8 + (lane / 16) * 8]
                          [kk * 16 + ((lane / 8) % 2) * 8]);
        mma16816<E>(acc[2 * j], a, b[0], b[1]);
        mma16816<E>(acc[2 * j + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // the next chunk's loads overwrite this stage
  }
  cp_async_wait<0>();
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = t0 + lane / 4 + 8 * h;
      if (t >= T) continue;
      E* o = out + t * out_t + g * out_g;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = n0 + warp * 32 + j * 8 + (lane % 4) * 2 + e;
        if (n < N) o[n] = from_f32<E>(acc[j][2 * h + e]);
      }
    }
}

}  // namespace

bool batched_gemm_fits(const Tensor& out, const Tensor& x, const Tensor& w) {
  const int64_t T = x.shape[0], G = x.shape[1], K = x.shape[2], N = w.shape[1];
  const bool half = x.dtype == DType::F16 || x.dtype == DType::BF16;
  return half && w.dtype == x.dtype && out.dtype == x.dtype && T <= kMaxRows && G <= 65535 &&
         K % 8 == 0 && x.stride[2] == 1 && out.stride[2] == 1 && aligned(x.data, 16) &&
         x.stride[0] % 8 == 0 && x.stride[1] % 8 == 0 && aligned(w.data, 16) &&
         w.stride[2] == 1 && w.stride[1] == K && w.stride[0] == N * K && N * K < INT32_MAX;
}

void batched_gemm(const Tensor& out, const Tensor& x, const Tensor& w) {
  const int T = static_cast<int>(x.shape[0]), G = static_cast<int>(x.shape[1]);
  const int K = static_cast<int>(x.shape[2]), N = static_cast<int>(w.shape[1]);
  if (T == 0 || N == 0) return;
  const dim3 grid((N + kBN - 1) / kBN, G, (T + kBM - 1) / kBM);
  auto run = [&](auto e) {
    using E = decltype(e);
    launch(batched_gemm_kernel<E>, grid, kThreads, 0, stream(), x.ptr<E>(), x.stride[0],
           x.stride[1], w.ptr<E>(), out.ptr<E>(), out.stride[0], out.stride[1], T, N, K);
  };
  if (x.dtype == DType::BF16)
    run(__nv_bfloat16{});
  else
    run(__half{});
  check_launch("batched_linear");
}

}  // namespace vllmx::cuda
