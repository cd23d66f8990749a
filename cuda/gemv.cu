// linear's GEMV (T <= 4 for block weights, T <= 2 for same-dtype ones, decode; plan_linear in
// linear_plan.cu picks it): memory-bound, each CTA streams 4 weight rows with 16-byte loads (dense)
// or 8-element chunks of GGUF blocks dequantized in registers, f32 FMAs, then a warp +
// shared-memory reduction. Optional norm prologue (rms_norm_linear) and SwiGLU epilogue
// (linear_act_and_mul).
#include <type_traits>

#include "linear.cuh"

namespace vllmx::cuda::lin {

namespace {

constexpr int kGemvRows = 4;
constexpr int kGemvThreads = 128;

// ACT < 0: out = x @ w^T, rows n0 .. n0 + 4 per CTA. ACT >= 0 (an Act, gated): w is [gate; up]
// (2 * a.N rows) and out[:, j] = act(gate_j . x) * (up_j . x), each dot rounded to T first, as
// linear followed by act_and_mul would store it; a CTA takes gate rows j0, j0 + 1 and the
// matching up rows, so every row's sum runs in the same order as in the plain kernel.
template <typename T, int WK, int MAXT, int ACT = -1>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(LinearArgs a) {
  constexpr bool kBf = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kGated = ACT >= 0;
  const int n0 = blockIdx.x * (kGated ? kGemvRows / 2 : kGemvRows);
  auto row_of = [&](int r) { return kGated ? n0 + (r & 1) + (r >> 1) * a.N : n0 + r; };
  auto row_ok = [&](int r) { return (kGated ? n0 + (r & 1) : n0 + r) < a.N; };
  const int nchunks = a.K / 8;
  // Elements k .. k + 8 of row t of an activation (x or the residual) as f32.
  auto load_act = [&](const void* p, int64_t stride, int t, int k, float (&f)[8]) {
    unpack8(__ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + t * stride +
                                                  k)), kBf, f);
  };
  auto load_raw = [&](int c, uint4 (&raw)[kGemvRows]) {
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r)
      raw[r] = row_ok(r) ? load_chunk<WK>(a.w, a.w_stride, row_of(r), c * 8)
                         : make_uint4(0, 0, 0, 0);
  };
  // The weights do not depend on the previous kernel: this thread's first chunk is requested
  // before waiting for it (PDL), so a short product's loads overlap its predecessor's tail.
  uint4 first[kGemvRows];
  if (static_cast<int>(threadIdx.x) < nchunks) load_raw(threadIdx.x, first);
  pdl_begin();

  // Norm prologue: every CTA takes each row's sum of squares of x (+ res), as add_rms_norm
  // does (the f32 sum of the unrounded values); the main loop then normalizes x chunks as it
  // reads them, rounding where add_rms_norm stores. This costs a second read of x (L1 / L2),
  // not a kernel launch.
  float inv[MAXT];
  if (a.norm_w != nullptr) {
    __shared__ float ss_red[kGemvThreads / 32][MAXT];
    float ss[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; ++t) ss[t] = 0.f;
    const bool write_res = a.res_out != nullptr && blockIdx.x == 0;
    for (int c = threadIdx.x; c < nchunks; c += kGemvThreads) {
#pragma unroll
      for (int t = 0; t < MAXT; ++t) {
        if (t < a.T) {
          float v[8];
          load_act(a.x, a.x_stride, t, c * 8, v);
          if (a.res != nullptr) {
            float r[8];
            load_act(a.res, a.res_stride, t, c * 8, r);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] += r[j];
          }
#pragma unroll
          for (int j = 0; j < 8; ++j) ss[t] += v[j] * v[j];
          if (write_res)
            *reinterpret_cast<uint4*>(static_cast<uint16_t*>(a.res_out) + t * a.res_out_stride +
                                      c * 8) = pack8(v, kBf);
        }
      }
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
      const float v = warp_sum(ss[t]);
      if (lane == 0) ss_red[warp][t] = v;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
      float tot = 0.f;
#pragma unroll
      for (int wi = 0; wi < kGemvThreads / 32; ++wi) tot += ss_red[wi][t];
      inv[t] = 1.0f / sqrtf(tot / static_cast<float>(a.K) + a.eps);
    }
  }
  float acc[MAXT][kGemvRows];
#pragma unroll
  for (int t = 0; t < MAXT; ++t)
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) acc[t][r] = 0.f;

  auto consume = [&](int c, const uint4 (&raw)[kGemvRows]) {
    const int k = c * 8;
    float wf[kGemvRows][8];
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) chunk_to_float<WK>(raw[r], k, kBf, wf[r]);
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
      if (t < a.T) {
        float xf[8];
        load_act(a.x, a.x_stride, t, k, xf);
        if (a.norm_w != nullptr) {
          if (a.res != nullptr) {
            float r[8];
            load_act(a.res, a.res_stride, t, k, r);
#pragma unroll
            for (int j = 0; j < 8; ++j) xf[j] = round_to(xf[j] + r[j], kBf);  // the residual
          }
          const float4 g0 = __ldg(reinterpret_cast<const float4*>(a.norm_w + k));
          const float4 g1 = __ldg(reinterpret_cast<const float4*>(a.norm_w + k + 4));
          const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
          for (int j = 0; j < 8; ++j) xf[j] = round_to(xf[j] * inv[t] * g[j], kBf);
        }
#pragma unroll
        for (int r = 0; r < kGemvRows; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[t][r] = fmaf(xf[j], wf[r][j], acc[t][r]);
      }
    }
  };
  if (static_cast<int>(threadIdx.x) < nchunks) consume(threadIdx.x, first);
#pragma unroll 2
  for (int c = threadIdx.x + kGemvThreads; c < nchunks; c += kGemvThreads) {
    uint4 raw[kGemvRows];
    load_raw(c, raw);
    consume(c, raw);
  }

  __shared__ float red[kGemvThreads / 32][MAXT * kGemvRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < MAXT; ++t)
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      const float v = warp_sum(acc[t][r]);
      if (lane == 0) red[warp][t * kGemvRows + r] = v;
    }
  __syncthreads();
  if constexpr (kGated) {
    for (int i = threadIdx.x; i < MAXT * 2; i += kGemvThreads) {
      const int t = i / 2, j = i % 2;
      if (t >= a.T || n0 + j >= a.N) continue;
      float gate = 0.f, up = 0.f;
#pragma unroll
      for (int wi = 0; wi < kGemvThreads / 32; ++wi) {
        gate += red[wi][t * kGemvRows + j];
        up += red[wi][t * kGemvRows + 2 + j];
      }
      gate = round_to(gate, kBf);
      up = round_to(up, kBf);
      static_cast<uint16_t*>(a.out)[t * a.out_stride + n0 + j] =
          float_to_bits(activate<static_cast<Act>(ACT)>(gate) * up, kBf);
    }
  } else {
    for (int i = threadIdx.x; i < MAXT * kGemvRows; i += kGemvThreads) {
      const int t = i / kGemvRows, n = n0 + i % kGemvRows;
      if (t >= a.T || n >= a.N) continue;
      float s = 0.f;
#pragma unroll
      for (int wi = 0; wi < kGemvThreads / 32; ++wi) s += red[wi][i];
      store_out(a, kBf, t, n, s, 0.f, false);
    }
  }
}

template <typename T, int GK, int ACT>
void launch_rows(const LinearArgs& a, int max_t, cudaStream_t s) {
  const int rows = ACT >= 0 ? kGemvRows / 2 : kGemvRows;
  const dim3 grid((a.N + rows - 1) / rows);
  if (max_t == 1)
    launch(gemv_kernel<T, GK, 1, ACT>, grid, kGemvThreads, 0, s, a);
  else
    launch(gemv_kernel<T, GK, kGemvMaxT, ACT>, grid, kGemvThreads, 0, s, a);
}

template <typename T, int GK>
void launch_act(const LinearArgs& a, int max_t, bool silu_gated, cudaStream_t s) {
  // Only SwiGLU (Llama, Qwen, Mistral) has a gated instantiation; linear_act_and_mul and
  // rms_norm_linear send the other activations through linear + act_and_mul.
  if (silu_gated)
    launch_rows<T, GK, static_cast<int>(Act::kSilu)>(a, max_t, s);
  else
    launch_rows<T, GK, -1>(a, max_t, s);
}

template <typename T>
void launch_kind(const LinearArgs& a, int gk, int max_t, bool silu_gated, cudaStream_t s) {
  switch (gk) {
    case kWF16: launch_act<T, kWF16>(a, max_t, silu_gated, s); break;
    case kWBF16: launch_act<T, kWBF16>(a, max_t, silu_gated, s); break;
    default:
      visit_quant_kind(gk, [&](auto wk) {
        launch_act<T, decltype(wk)::value>(a, max_t, silu_gated, s);
      });
  }
}

}  // namespace

void launch_gemv(const LinearArgs& a, bool bf16_x, int gk, int max_t, bool silu_gated,
                 cudaStream_t s) {
  if (bf16_x)
    launch_kind<__nv_bfloat16>(a, gk, max_t, silu_gated, s);
  else
    launch_kind<__half>(a, gk, max_t, silu_gated, s);
}

}  // namespace vllmx::cuda::lin
