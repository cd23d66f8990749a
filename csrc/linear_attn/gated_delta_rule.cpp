// gated_delta_rule on the CPU (Gated DeltaNet's linear attention: Qwen3-Next, Qwen3.5). Contract
// in csrc/ops.def. Per sequence and value head the recurrence runs token by token over the
// head's [dk, dv] state, which stays in cache (64 KiB at dk = dv = 128): decay, read the
// memory for the key, write the corrected value, read for the query. The chunked form the GPU
// uses for prefill is the same recurrence regrouped for matrix units; on the CPU the
// token-by-token form is as fast and each token's arithmetic is fixed (batch invariant).
#include "core/kernel_pragmas.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/op_table.h"
#include "linear_attn/spec_slots.h"

namespace vllmx {

namespace {

template <typename F>
F softplus(F x) {
  return x > F(20) ? x : std::log1p(std::exp(x));  // torch's threshold 20
}

// x / sqrt(sum x^2 + 1e-6) * scale into dst (FLA's l2norm, as transformers writes it).
template <typename F>
void l2norm(const float* x, int64_t n, F scale, F* dst) {
  F ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += F(x[i]) * F(x[i]);
  const F inv = F(1) / std::sqrt(ss + F(1e-6)) * scale;
  for (int64_t i = 0; i < n; ++i) dst[i] = F(x[i]) * inv;
}

struct Dims {
  int64_t hk, hv, dk, dv;
};

template <typename F>
void run_head(const Dims& d, int64_t h, int64_t t0, int64_t n, const Tensor& q, const Tensor& k,
              const Tensor& v, const Tensor& a, const Tensor& b, float a_log, float dt_bias,
              float* state, bool init, const Tensor& out, const int32_t* spec, float* base,
              int64_t stride) {
  const int64_t dk = d.dk, dv = d.dv, kh = h / (d.hv / d.hk);
  std::vector<F> S(static_cast<size_t>(dk * dv), F(0)), qn(dk), kn(dk), mem(dv);
  if (init)
    for (int64_t i = 0; i < dk * dv; ++i) S[i] = F(state[i]);
  auto save = [&](float* dst) {
    for (int64_t i = 0; i < dk * dv; ++i) dst[i] = static_cast<float>(S[i]);
  };
  const F neg_a = -std::exp(F(a_log)), qscale = F(1) / std::sqrt(F(dk));
  for (int64_t t = t0; t < t0 + n; ++t) {
    l2norm<F>(q.ptr<float>() + t * q.stride[0] + kh * dk, dk, qscale, qn.data());
    l2norm<F>(k.ptr<float>() + t * k.stride[0] + kh * dk, dk, F(1), kn.data());
    const float* vt = v.ptr<float>() + t * v.stride[0] + h * dv;
    const F decay = std::exp(neg_a * softplus(F(a.ptr<float>()[t * a.stride[0] + h]) +
                                              F(dt_bias)));
    const F beta = F(1) / (F(1) + std::exp(-F(b.ptr<float>()[t * b.stride[0] + h])));
    std::fill(mem.begin(), mem.end(), F(0));
    for (int64_t i = 0; i < dk; ++i) {
      F* row = S.data() + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        row[j] *= decay;
        mem[j] += row[j] * kn[i];
      }
    }
    for (int64_t j = 0; j < dv; ++j) mem[j] = (F(vt[j]) - mem[j]) * beta;  // the delta
    float* o = out.ptr<float>() + t * out.stride[0] + h * dv;
    std::vector<F> acc(static_cast<size_t>(dv), F(0));
    for (int64_t i = 0; i < dk; ++i) {
      F* row = S.data() + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        row[j] += kn[i] * mem[j];
        acc[j] += row[j] * qn[i];
      }
    }
    for (int64_t j = 0; j < dv; ++j) o[j] = static_cast<float>(acc[j]);
    if (spec != nullptr && spec[t] >= 0) save(base + spec[t] * stride);
  }
  save(state);
}

void gated_delta_rule(const Tensor& out, const Tensor& recurrent_state, const Tensor& q,
                      const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                      const Tensor& A_log, const Tensor& dt_bias, const Tensor& query_start_loc,
                      const Tensor& state_indices, const Tensor& has_initial_state,
                      const Tensor& spec_state_indices, bool reference) {
  const char* op = "gated_delta_rule";
  for (const Tensor* t : {&out, &q, &k, &v, &a, &b}) check_dtype(*t, DType::F32, op, "activations");
  const Dims d{q.shape[1] / recurrent_state.shape[2], recurrent_state.shape[1],
               recurrent_state.shape[2], recurrent_state.shape[3]};
  const int64_t B = state_indices.shape[0], slots = recurrent_state.shape[0];
  const int32_t* qsl = query_start_loc.ptr<int32_t>();
  const int32_t* idx = state_indices.ptr<int32_t>();
  const int32_t* init = has_initial_state.ptr<int32_t>();
  for (int64_t s = 0; s < B; ++s) {
    VLLMX_CHECK(idx[s] >= 0 && idx[s] < slots, op,
                "state_indices[" + std::to_string(s) + "] = " + std::to_string(idx[s]) +
                    " is not a slot of recurrent_state " + recurrent_state.str());
    VLLMX_CHECK(qsl[s + 1] >= qsl[s] && qsl[s + 1] <= q.shape[0], op,
                "query_start_loc must rise within the " + std::to_string(q.shape[0]) + " rows");
  }
  const int32_t* spec = spec_slots(spec_state_indices, slots, op, "recurrent_state");
  const float* al = A_log.ptr<float>();
  const float* db = dt_bias.ptr<float>();
  const int64_t items = B * d.hv;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t s = it / d.hv, h = it % d.hv;
    const int64_t n = qsl[s + 1] - qsl[s];
    if (n == 0) continue;
    float* st = recurrent_state.ptr<float>() + idx[s] * recurrent_state.stride[0] +
                h * d.dk * d.dv;
    float* base = recurrent_state.ptr<float>() + h * d.dk * d.dv;
    const int64_t stride = recurrent_state.stride[0];
    if (reference)
      run_head<double>(d, h, qsl[s], n, q, k, v, a, b, al[h], db[h], st, init[s] != 0, out,
                       spec, base, stride);
    else
      run_head<float>(d, h, qsl[s], n, q, k, v, a, b, al[h], db[h], st, init[s] != 0, out,
                      spec, base, stride);
  }
}

}  // namespace

VLLMX_KERNEL(gated_delta_rule, kCPU, gated_delta_rule);

}  // namespace vllmx
