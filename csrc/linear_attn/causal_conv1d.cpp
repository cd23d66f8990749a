// causal_conv1d on the CPU (the short depthwise convolution ahead of Gated DeltaNet and Mamba
// mixers). Contract in csrc/ops.def. Each sequence's tokens see the K - 1 inputs before them:
// the request's conv_state slot when it has one (a chunk or a decode step continuing it), else
// zeros; the slot then holds the sequence's last K - 1 inputs. A token's output depends on its
// own and those K - 1 inputs only, so it is the same whatever the batch or the chunking.
#include "core/kernel_pragmas.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/cpu_features.h"
#include "core/op_table.h"
#include "core/simd_math.h"
#include "linear_attn/spec_slots.h"

namespace vllmx {

namespace {

// o = a / (1 + exp(-a)) over a token's channels: std::exp, or on AVX-512 / AVX2 silu512 /
// silu256 (simd_math.h), the SwiGLU activation's (the scalar exp was two thirds of this op at
// 512 x 6144).
using SiluRow = void (*)(const float* a, float* o, int64_t n);
void silu_row_scalar(const float* a, float* o, int64_t n) {
  for (int64_t c = 0; c < n; ++c) o[c] = a[c] / (1.0f + std::exp(-a[c]));
}
#if VLLMX_X86
VLLMX_TARGET_AVX512 void silu_row_512(const float* a, float* o, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes512(n - i);
    _mm512_mask_storeu_ps(o + i, m, silu512(_mm512_maskz_loadu_ps(m, a + i)));
  }
}
VLLMX_TARGET_AVX2 void silu_row_256(const float* a, float* o, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = lanes256(n - i);
    _mm256_maskstore_ps(o + i, m, silu256(_mm256_maskload_ps(a + i, m)));
  }
}
#endif
SiluRow pick_silu_row() {
#if VLLMX_X86
  if (simd_level() >= 2) return silu_row_512;
  if (simd_level() == 1) return silu_row_256;
#endif
  return silu_row_scalar;
}


// Channels [d0, d1) of one sequence (a channel's outputs read that channel alone). spec: the
// sequence's rows' spec_state_indices (or null), slots of conv_state (base, stride) that also
// get the window after their row.
template <typename F>
void conv_sequence(const float* x, int64_t xs, float* out, int64_t os, const float* w,
                   const float* bias, float* state, int64_t d0, int64_t d1, int64_t K,
                   int64_t n, bool init, bool silu, const int32_t* spec, float* base,
                   int64_t stride) {
  const int64_t nd = d1 - d0;
  // hist[j * nd + d - d0]: input j of the window that ends before this sequence's first token.
  std::vector<float> hist(static_cast<size_t>((K - 1) * nd), 0.0f);
  if (init)
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t j = 0; j < K - 1; ++j) hist[j * nd + d - d0] = state[d * (K - 1) + j];
  // input at relative position p (p < 0: history), for channel d
  auto input = [&](int64_t p, int64_t d) -> float {
    return p >= 0 ? x[p * xs + d] : hist[(K - 1 + p) * nd + d - d0];
  };
  // The last K - 1 inputs before relative position `end` into a slot.
  auto save_window = [&](float* dst, int64_t end) {
    for (int64_t d = d0; d < d1; ++d)
      for (int64_t j = 0; j < K - 1; ++j) dst[d * (K - 1) + j] = input(end - (K - 1) + j, d);
  };
  // The window's taps channel-contiguous (wt[j * nd + d - d0]), so that a token's channels
  // take each tap as one vector loop over a row of inputs; a channel's sum still runs bias,
  // tap 0, tap 1, ... in order (the same bits as a channel at a time).
  std::vector<F> wt(static_cast<size_t>(K * nd)), acc(static_cast<size_t>(nd));
  for (int64_t d = d0; d < d1; ++d)
    for (int64_t j = 0; j < K; ++j) wt[j * nd + d - d0] = F(w[d * K + j]);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < nd; ++c) acc[c] = bias != nullptr ? F(bias[d0 + c]) : F(0);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t p = t - (K - 1) + j;
      const float* in = p >= 0 ? x + p * xs + d0 : hist.data() + (K - 1 + p) * nd;
      const F* wj = wt.data() + j * nd;
      for (int64_t c = 0; c < nd; ++c) acc[c] += wj[c] * F(in[c]);
    }
    float* o = out + t * os + d0;
    if constexpr (std::is_same_v<F, float>) {
      static const SiluRow silu_row = pick_silu_row();
      if (silu)
        silu_row(acc.data(), o, nd);
      else
        std::copy(acc.begin(), acc.end(), o);
    } else {  // (the f64 reference)
      for (int64_t c = 0; c < nd; ++c) {
        F a = acc[c];
        if (silu) a = a / (F(1) + std::exp(-a));
        o[c] = static_cast<float>(a);
      }
    }
    if (spec != nullptr && spec[t] >= 0) save_window(base + spec[t] * stride, t + 1);
  }
  save_window(state, n);
}

// Channels a work item takes: a prefill of one sequence splits across the threads by channel
// (by sequence alone, one thread ran it: 8% of a Qwen3.5 prefill on two cores).
constexpr int64_t kConvChannels = 256;

void causal_conv1d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& conv_state, const Tensor& query_start_loc,
                   const Tensor& state_indices, const Tensor& has_initial_state,
                   const Tensor& spec_state_indices, bool silu, bool reference) {
  const char* op = "causal_conv1d";
  check_dtype(x, DType::F32, op, "x");
  check_dtype(out, DType::F32, op, "out");
  const int64_t D = x.shape[1], K = weight.shape[1], B = state_indices.shape[0];
  const int64_t slots = conv_state.shape[0];
  const int32_t* qsl = query_start_loc.ptr<int32_t>();
  const int32_t* idx = state_indices.ptr<int32_t>();
  const int32_t* init = has_initial_state.ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    VLLMX_CHECK(idx[b] >= 0 && idx[b] < slots, op,
                "state_indices[" + std::to_string(b) + "] = " + std::to_string(idx[b]) +
                    " is not a slot of conv_state " + conv_state.str());
    VLLMX_CHECK(qsl[b + 1] >= qsl[b] && qsl[b + 1] <= x.shape[0], op,
                "query_start_loc must rise within the " + std::to_string(x.shape[0]) + " rows");
  }
  const int32_t* spec = spec_slots(spec_state_indices, slots, op, "conv_state");
  const float* w = weight.ptr<float>();
  const float* bp = bias.defined() ? bias.ptr<float>() : nullptr;
  const int64_t chunks = (D + kConvChannels - 1) / kConvChannels, items = B * chunks;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t b = it / chunks, d0 = it % chunks * kConvChannels;
    const int64_t d1 = std::min(D, d0 + kConvChannels);
    const int64_t t0 = qsl[b], n = qsl[b + 1] - qsl[b];
    if (n == 0) continue;
    float* st = conv_state.ptr<float>() + idx[b] * conv_state.stride[0];
    const float* xp = x.ptr<float>() + t0 * x.stride[0];
    float* op_ = out.ptr<float>() + t0 * out.stride[0];
    const int32_t* sp = spec != nullptr ? spec + t0 : nullptr;
    float* base = conv_state.ptr<float>();
    if (reference)
      conv_sequence<double>(xp, x.stride[0], op_, out.stride[0], w, bp, st, d0, d1, K, n,
                            init[b] != 0, silu, sp, base, conv_state.stride[0]);
    else
      conv_sequence<float>(xp, x.stride[0], op_, out.stride[0], w, bp, st, d0, d1, K, n,
                           init[b] != 0, silu, sp, base, conv_state.stride[0]);
  }
}

}  // namespace

VLLMX_KERNEL(causal_conv1d, kCPU, causal_conv1d);

}  // namespace vllmx
