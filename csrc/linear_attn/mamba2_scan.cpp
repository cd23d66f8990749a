// mamba2_scan on the CPU (Mamba2's selective state space, the SSD recurrence: Granite-4 /
// GraniteMoeHybrid, Nemotron-H, Falcon-H1). Contract in csrc/ops.def. Token by token per head
// over its [P, N] state, as the GPU's chunked scan computes it regrouped: on the CPU the
// recurrence is as fast and each token's arithmetic fixed (batch invariant).
#include "core/kernel_pragmas.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/cpu_features.h"
#include "core/op_table.h"
#include "linear_attn/spec_slots.h"

#if VLLMX_X86
#include <immintrin.h>
#endif

namespace vllmx {

namespace {

constexpr int kLanes = 8;  // partial sums of a state row's dot with C

// One token over a head's [P, N] state (rows in place): row = row * decay + (step x_p) B,
// o_p = row . C + d x_p, the dot in kLanes interleaved partial sums and then a fixed tree.
template <typename F>
__attribute__((always_inline)) inline void scan_token(F* S, int64_t P, int64_t N, F decay,
                                                      F step, const float* xt, const float* bt,
                                                      const float* ct, float d, float* o) {
  for (int64_t p = 0; p < P; ++p) {
    F* row = S + p * N;
    const F xs = step * F(xt[p]);
    // y = row . C in kLanes interleaved partial sums, then a fixed tree: one sum in order
    // was a chain of N dependent adds, the compiler may not reorder, and took a third of a
    // Mamba2 hybrid's prefill.
    F part[kLanes] = {};
    int64_t s = 0;
    for (; s + kLanes <= N; s += kLanes)
      for (int j = 0; j < kLanes; ++j) {
        row[s + j] = row[s + j] * decay + xs * F(bt[s + j]);
        part[j] += row[s + j] * F(ct[s + j]);
      }
    for (; s < N; ++s) {
      row[s] = row[s] * decay + xs * F(bt[s]);
      part[s % kLanes] += row[s] * F(ct[s]);
    }
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) part[j] += part[j + w];
    o[p] = static_cast<float>(part[0] + F(d) * F(xt[p]));
  }
}

#if VLLMX_X86
// scan_token in f32 with the kLanes partial sums as the lanes of one AVX2 register (lane j
// sums elements j, j + 8, ...: the scalar form's order), the same tree after: the same bits, 8
// elements an instruction where the baseline build took 4 (a Mamba2 hybrid's scan was 37% of
// its prefill and 23% of its decode on the 2-core EPYC). AVX-512 CPUs run it too (16 lanes
// would be 16 partial sums, other bits).
VLLMX_TARGET_AVX2 void scan_token_avx2(float* S, int64_t P, int64_t N, float decay, float step,
                                       const float* xt, const float* bt, const float* ct,
                                       float d, float* o) {
  static_assert(kLanes == 8, "one AVX2 register of partial sums");
  const __m256 dec = _mm256_set1_ps(decay);
  for (int64_t p = 0; p < P; ++p) {
    float* row = S + p * N;
    const float xs = step * xt[p];
    const __m256 vxs = _mm256_set1_ps(xs);
    __m256 acc = _mm256_setzero_ps();
    int64_t s = 0;
    for (; s + kLanes <= N; s += kLanes) {
      const __m256 r = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(row + s), dec),
                                     _mm256_mul_ps(vxs, _mm256_loadu_ps(bt + s)));
      _mm256_storeu_ps(row + s, r);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(r, _mm256_loadu_ps(ct + s)));
    }
    alignas(32) float part[kLanes];
    _mm256_store_ps(part, acc);
    for (; s < N; ++s) {
      row[s] = row[s] * decay + xs * bt[s];
      part[s % kLanes] += row[s] * ct[s];
    }
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) part[j] += part[j + w];
    o[p] = part[0] + d * xt[p];
  }
}
#endif

using ScanTokenF32 = void (*)(float*, int64_t, int64_t, float, float, const float*,
                              const float*, const float*, float, float*);
ScanTokenF32 pick_scan_token() {
#if VLLMX_X86
  if (simd_level() >= 1) return scan_token_avx2;
#endif
  return scan_token<float>;
}

template <typename F>
void run_head(int64_t h, int64_t t0, int64_t n, int64_t P, int64_t N, int64_t g,
              const Tensor& x, const Tensor& dt, const Tensor& B, const Tensor& C, float a_log,
              float d, float dt_bias, float dt_min, float dt_max, float* state, bool init,
              const Tensor& out, const int32_t* spec, float* base, int64_t stride) {
  // f32 runs in place in the slot (its [P, N] rows are S's layout); the f64 reference in a copy.
  constexpr bool kInPlace = std::is_same_v<F, float>;
  std::vector<F> copy(kInPlace ? 0 : static_cast<size_t>(P * N), F(0));
  F* S = kInPlace ? reinterpret_cast<F*>(state) : copy.data();
  if (kInPlace && !init) std::fill(state, state + P * N, 0.0f);
  if (!kInPlace && init)
    for (int64_t i = 0; i < P * N; ++i) S[i] = F(state[i]);
  auto save = [&](float* dst) {
    for (int64_t i = 0; i < P * N; ++i) dst[i] = static_cast<float>(S[i]);
  };
  const F A = -std::exp(F(a_log));
  for (int64_t t = t0; t < t0 + n; ++t) {
    F step = F(dt.ptr<float>()[t * dt.stride[0] + h]) + F(dt_bias);
    step = step > F(20) ? step : std::log1p(std::exp(step));  // softplus, torch's threshold
    step = std::min(std::max(step, F(dt_min)), F(dt_max));
    const F decay = std::exp(step * A);
    const float* xt = x.ptr<float>() + t * x.stride[0] + h * P;
    const float* bt = B.ptr<float>() + t * B.stride[0] + g * N;
    const float* ct = C.ptr<float>() + t * C.stride[0] + g * N;
    float* o = out.ptr<float>() + t * out.stride[0] + h * P;
    if constexpr (std::is_same_v<F, float>) {
      static const ScanTokenF32 run = pick_scan_token();
      run(reinterpret_cast<float*>(S), P, N, decay, step, xt, bt, ct, d, o);
    } else {  // (the f64 reference)
      scan_token<F>(S, P, N, decay, step, xt, bt, ct, d, o);
    }
    if (spec != nullptr && spec[t] >= 0) save(base + spec[t] * stride);
  }
  if (!kInPlace) save(state);
}

void mamba2_scan(const Tensor& out, const Tensor& ssm_state, const Tensor& x, const Tensor& dt,
                 const Tensor& B, const Tensor& C, const Tensor& A_log, const Tensor& D,
                 const Tensor& dt_bias, const Tensor& query_start_loc,
                 const Tensor& state_indices, const Tensor& has_initial_state,
                 const Tensor& spec_state_indices, float dt_min, float dt_max, bool reference) {
  const char* op = "mamba2_scan";
  for (const Tensor* t : {&out, &x, &dt, &B, &C}) check_dtype(*t, DType::F32, op, "activations");
  const int64_t H = ssm_state.shape[1], P = ssm_state.shape[2], N = ssm_state.shape[3];
  const int64_t G = B.shape[1] / N, slots = ssm_state.shape[0], Bn = state_indices.shape[0];
  const int32_t* qsl = query_start_loc.ptr<int32_t>();
  const int32_t* idx = state_indices.ptr<int32_t>();
  const int32_t* init = has_initial_state.ptr<int32_t>();
  for (int64_t s = 0; s < Bn; ++s) {
    VLLMX_CHECK(idx[s] >= 0 && idx[s] < slots, op,
                "state_indices[" + std::to_string(s) + "] = " + std::to_string(idx[s]) +
                    " is not a slot of ssm_state " + ssm_state.str());
    VLLMX_CHECK(qsl[s + 1] >= qsl[s] && qsl[s + 1] <= x.shape[0], op,
                "query_start_loc must rise within the " + std::to_string(x.shape[0]) + " rows");
  }
  const int32_t* spec = spec_slots(spec_state_indices, slots, op, "ssm_state");
  const float* al = A_log.ptr<float>();
  const float* dp = D.ptr<float>();
  const float* db = dt_bias.ptr<float>();
  const int64_t items = Bn * H;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t s = it / H, h = it % H, n = qsl[s + 1] - qsl[s];
    if (n == 0) continue;
    float* st = ssm_state.ptr<float>() + idx[s] * ssm_state.stride[0] + h * P * N;
    const int64_t g = h / (H / G);
    float* base = ssm_state.ptr<float>() + h * P * N;
    const int64_t stride = ssm_state.stride[0];
    if (reference)
      run_head<double>(h, qsl[s], n, P, N, g, x, dt, B, C, al[h], dp[h], db[h], dt_min, dt_max,
                       st, init[s] != 0, out, spec, base, stride);
    else
      run_head<float>(h, qsl[s], n, P, N, g, x, dt, B, C, al[h], dp[h], db[h], dt_min, dt_max,
                      st, init[s] != 0, out, spec, base, stride);
  }
}

}  // namespace

VLLMX_KERNEL(mamba2_scan, kCPU, mamba2_scan);

}  // namespace vllmx
