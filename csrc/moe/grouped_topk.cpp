// MoE routing, grouped flavour (vLLM's grouped_topk: DeepSeek V2/V3, GLM-4.5): softmax or
// sigmoid scores, an optional bias that steers the choice but not the weights (DeepSeek V3's
// noaux_tc load balancing), expert groups of which only the best topk_group compete. Contract
// in csrc/ops.def. E is a few hundred and k at most 8 or so: a row is routed with a few passes.
#include "core/kernel_pragmas.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/op_table.h"

namespace vllmx {

namespace {

// The k best of n values v[0..n) (eligible[i] only) into ids, descending, ties to the lower
// index: insertion into a sorted list of k, O(n k).
template <typename F>
int64_t best_k(const F* v, const bool* eligible, int64_t n, int64_t k, int32_t* ids) {
  int64_t got = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (eligible != nullptr && !eligible[i]) continue;
    int64_t pos;
    if (got < k) {
      pos = got++;
    } else {
      if (!(v[i] > v[ids[k - 1]])) continue;
      pos = k - 1;
    }
    while (pos > 0 && v[i] > v[ids[pos - 1]]) {
      ids[pos] = ids[pos - 1];
      --pos;
    }
    ids[pos] = static_cast<int32_t>(i);
  }
  return got;
}

// One row, in F (float: the kernel; double: its scalar twin). scratch: 2 E + G values of F.
template <typename F>
void route_row(const float* g, const float* bias, int64_t E, int64_t G, int64_t topk_group,
               int64_t k, bool sigmoid, bool renormalize, float scaling, F* scores, F* choice,
               F* group_score, bool* eligible, int32_t* group_ids, float* w, int32_t* ids) {
  if (sigmoid) {
    for (int64_t e = 0; e < E; ++e) scores[e] = F(1) / (F(1) + std::exp(-F(g[e])));
  } else {
    F m = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, F(g[e]));
    for (int64_t e = 0; e < E; ++e) s += (scores[e] = std::exp(F(g[e]) - m));
    for (int64_t e = 0; e < E; ++e) scores[e] /= s;
  }
  for (int64_t e = 0; e < E; ++e) choice[e] = bias != nullptr ? scores[e] + F(bias[e]) : scores[e];
  const int64_t per = E / G;
  for (int64_t grp = 0; grp < G; ++grp) {
    const F* c = choice + grp * per;
    F best = -INFINITY, second = -INFINITY;
    for (int64_t i = 0; i < per; ++i) {
      if (c[i] > best) {
        second = best;
        best = c[i];
      } else if (c[i] > second) {
        second = c[i];
      }
    }
    group_score[grp] = bias != nullptr ? best + second : best;
  }
  std::fill(eligible, eligible + E, G == topk_group);
  if (G != topk_group) {
    best_k(group_score, nullptr, G, topk_group, group_ids);
    for (int64_t j = 0; j < topk_group; ++j)
      std::fill(eligible + group_ids[j] * per, eligible + (group_ids[j] + 1) * per, true);
  }
  best_k(choice, eligible, E, k, ids);
  F sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += scores[ids[j]];
  const F norm = renormalize ? F(scaling) / sum : F(scaling);
  for (int64_t j = 0; j < k; ++j) w[j] = static_cast<float>(scores[ids[j]] * norm);
}

template <typename F>
void route_rows(const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& gating_output,
                const Tensor& bias, int64_t G, int64_t topk_group, bool sigmoid,
                bool renormalize, float scaling) {
  const int64_t T = gating_output.shape[0], E = gating_output.shape[1];
  const int64_t k = topk_ids.shape[1];
  const float* g = gating_output.ptr<float>();
  const float* b = bias.defined() ? bias.ptr<float>() : nullptr;
  float* w = topk_weights.ptr<float>();
  int32_t* ids = topk_ids.ptr<int32_t>();
  const int64_t gs = gating_output.stride[0], ws = topk_weights.stride[0];
  const int64_t is = topk_ids.stride[0];
#pragma omp parallel if (T * E > 32768)
  {
    std::vector<F> f(static_cast<size_t>(2 * E + G));
    std::unique_ptr<bool[]> eligible(new bool[static_cast<size_t>(E)]);
    std::vector<int32_t> group_ids(static_cast<size_t>(G));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      route_row<F>(g + t * gs, b, E, G, topk_group, k, sigmoid, renormalize, scaling, f.data(),
                   f.data() + E, f.data() + 2 * E, eligible.get(),
                   group_ids.data(), w + t * ws, ids + t * is);
  }
}

void grouped_topk(const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& gating_output,
                  const Tensor& e_score_correction_bias, int64_t num_expert_group,
                  int64_t topk_group, bool sigmoid, bool renormalize, float routed_scaling_factor,
                  bool reference) {
  check_dtype(gating_output, DType::F32, "grouped_topk", "gating_output");
  if (reference)
    route_rows<double>(topk_weights, topk_ids, gating_output, e_score_correction_bias,
                       num_expert_group, topk_group, sigmoid, renormalize,
                       routed_scaling_factor);
  else
    route_rows<float>(topk_weights, topk_ids, gating_output, e_score_correction_bias,
                      num_expert_group, topk_group, sigmoid, renormalize, routed_scaling_factor);
}

}  // namespace

VLLMX_KERNEL(grouped_topk, kCPU, grouped_topk);

}  // namespace vllmx
