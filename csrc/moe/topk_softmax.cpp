// MoE routing, softmax flavour (vLLM's topk_softmax: Mixtral, Qwen2/3-MoE, OLMoE ...): per
// token, the k most probable experts and their routing weights. Contract in csrc/ops.def.
#include "core/kernel_pragmas.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/op_table.h"
#include "core/simd_math.h"

namespace vllmx {

namespace {

// The k largest logits of a row into ids, descending, the lower expert id first on ties.
// Logits order the experts as their probabilities do, so selecting needs no exp. O(E k): k is
// 1..8 for every model this serves.
void select_topk(const float* g, int64_t E, int64_t k, int32_t* ids) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float v = g[e];
    int64_t pos;
    if (n < k) {
      pos = n++;
    } else {
      if (!(v > g[ids[k - 1]])) continue;
      pos = k - 1;
    }
    while (pos > 0 && v > g[ids[pos - 1]]) {
      ids[pos] = ids[pos - 1];
      --pos;
    }
    ids[pos] = static_cast<int32_t>(e);
  }
}

float row_max(const float* g, int64_t E) {
  float m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = std::max(m, g[e]);
  return m;
}

// sum_e exp(g[e] - m): the softmax's denominator.
float exp_sum_scalar(const float* g, int64_t E, float m) {
  float s = 0.0f;
  for (int64_t e = 0; e < E; ++e) s += std::exp(g[e] - m);
  return s;
}

#if VLLMX_X86
VLLMX_TARGET_AVX512 float exp_sum_512(const float* g, int64_t E, float m) {
  __m512 acc = _mm512_setzero_ps();
  const __m512 mv = _mm512_set1_ps(m);
  for (int64_t e = 0; e < E; e += 16) {
    const __mmask16 k = lanes512(E - e);
    const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, g + e), mv);
    acc = _mm512_mask_add_ps(acc, k, acc, exp512(x, -150.0f));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  float s = 0.0f;
  for (float v : lanes) s += v;
  return s;
}
#endif

void route_row_fast(const float* g, int64_t E, int64_t k, bool renormalize, bool avx512,
                    float* w, int32_t* ids) {
  select_topk(g, E, k, ids);
  const float m = row_max(g, E);
  float denom = 0.0f;
  if (renormalize) {
    for (int64_t j = 0; j < k; ++j) denom += std::exp(g[ids[j]] - m);
  } else {
#if VLLMX_X86
    denom = avx512 ? exp_sum_512(g, E, m) : exp_sum_scalar(g, E, m);
#else
    (void)avx512;
    denom = exp_sum_scalar(g, E, m);
#endif
  }
  for (int64_t j = 0; j < k; ++j) w[j] = std::exp(g[ids[j]] - m) / denom;
}

// The scalar twin: the softmax in double, the experts by a stable sort.
void route_row_reference(const float* g, int64_t E, int64_t k, bool renormalize, float* w,
                         int32_t* ids) {
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return g[a] > g[b]; });
  double m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = std::max(m, static_cast<double>(g[e]));
  double denom = 0.0;
  for (int64_t e = 0; e < (renormalize ? k : E); ++e)
    denom += std::exp(static_cast<double>(g[renormalize ? order[e] : e]) - m);
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = order[j];
    w[j] = static_cast<float>(std::exp(static_cast<double>(g[order[j]]) - m) / denom);
  }
}

void topk_softmax(const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& gating_output,
                  bool renormalize, bool reference) {
  check_dtype(gating_output, DType::F32, "topk_softmax", "gating_output");
  const int64_t T = gating_output.shape[0], E = gating_output.shape[1];
  const int64_t k = topk_ids.shape[1];
  const float* g = gating_output.ptr<float>();
  float* w = topk_weights.ptr<float>();
  int32_t* ids = topk_ids.ptr<int32_t>();
  const int64_t gs = gating_output.stride[0], ws = topk_weights.stride[0];
  const int64_t is = topk_ids.stride[0];
  const bool avx512 = simd_level() >= 2;
#pragma omp parallel for if (T * E > 32768) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    if (reference)
      route_row_reference(g + t * gs, E, k, renormalize, w + t * ws, ids + t * is);
    else
      route_row_fast(g + t * gs, E, k, renormalize, avx512, w + t * ws, ids + t * is);
  }
}

void remap_expert_ids(const Tensor& topk_ids, int64_t start, int64_t count) {
  // (dtype and rows: the op's contract, csrc/ops.cpp)
  int32_t* ids = topk_ids.ptr<int32_t>();
  const int64_t is = topk_ids.stride[0];
  for (int64_t t = 0; t < topk_ids.shape[0]; ++t)
    for (int64_t j = 0; j < topk_ids.shape[1]; ++j) {
      int32_t& e = ids[t * is + j];
      e = (e >= start && e < start + count) ? static_cast<int32_t>(e - start) : -1;
    }
}

}  // namespace

VLLMX_KERNEL(topk_softmax, kCPU, topk_softmax);
VLLMX_KERNEL(remap_expert_ids, kCPU, remap_expert_ids);

}  // namespace vllmx
