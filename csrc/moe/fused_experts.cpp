// fused_experts on the CPU (vLLM's fused MoE with SwiGLU experts). Contract in csrc/ops.def.
//
// The (token, rank) pairs are grouped by expert (a counting sort, stable in t * k + j), each
// expert's rows are gathered into one block and run through the linear kernel twice (w13, then
// w2, with silu_and_mul between), so quantized and repacked experts take the same paths as any
// other weight. Each result row lands in its own slot of a [T * k, H] buffer, and a token's k
// slots are summed in rank order j = 0..k-1. Linear computes a row from that row alone
// (linear.cpp), so a token's output is bit-identical whatever batch it is in. Long batches run
// in chunks of tokens, which keeps that true and the slot buffer bounded.
#include "core/kernel_pragmas.h"  // the weighted sum rounds as written (no fma), as the tests do

#include <algorithm>
#include <string>
#include <vector>

#include "core/op_table.h"
#include "layers/cpu_kernels.h"
#include "moe/swigluoai.h"

namespace vllmx {

namespace {

// Tokens [t0, t1): their k slots each, grouped by expert, through the experts, summed into out.
// Row e of a stacked bias [E, n] as a vector view; none where the op got none.
Tensor bias_row(const Tensor& b, int64_t e) {
  if (!b.defined()) return Tensor{};
  Tensor v = b;
  v.data = b.ptr<float>() + e * b.stride[0];
  v.ndim = 1;
  v.shape[0] = b.shape[1];
  v.stride[0] = 1;
  v.shape[1] = v.stride[1] = 0;
  return v;
}

// Rows of x through expert e of a stacked weight: linear, or fp8_linear (vLLM's block-fp8 MoE:
// the rows quantized per 128 values, then scaled_mm) where the experts are fp8 (their scales
// given).
void expert_linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& w_scale,
                   int64_t e, const Tensor& bias, bool reference) {
  if (w_scale.defined())
    fp8_linear(out, x, stacked_view(w, e), stacked_view(w_scale, e), bias, reference);
  else
    linear(out, x, stacked_view(w, e), bias, reference);
}

void run_chunk(const Tensor& out, const Tensor& x, const Tensor& w13, const Tensor& w2,
               const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& w13_bias,
               const Tensor& w2_bias, int64_t activation, const Tensor& w13_scale,
               const Tensor& w2_scale, int64_t t0, int64_t t1, bool reference) {
  const int64_t H = x.shape[1], E = w13.shape[0], k = topk_ids.shape[1];
  const int64_t G = w13.shape[1];  // rows of w13: [gate; up] (2 I), or up alone for relu2 (I)
  const int64_t I = activation == 2 ? G : G / 2;
  const int64_t T = t1 - t0;
  const int32_t* ids = topk_ids.ptr<int32_t>() + t0 * topk_ids.stride[0];
  const int64_t is = topk_ids.stride[0];

  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * is + j];
      if (e < -1 || e >= E)
        fail("fused_experts", "topk_ids[" + std::to_string(t0 + t) + ", " + std::to_string(j) +
                                  "] = " + std::to_string(e) + " is not an expert of w13 " +
                                  w13.str() + " (nor -1, another rank's)");
    }
  // Slots s = t * k + j (t from t0) by expert: slots[offsets[e] .. offsets[e + 1]).
  std::vector<int64_t> offsets, slots;
  const int64_t max_rows = group_by_bucket(
      T * k, E, [&](int64_t s) { return ids[s / k * is + s % k]; }, offsets, slots);

  float* xg = f32_scratch(0, static_cast<size_t>(max_rows * H));   // the expert's rows, in/out
  float* gu = f32_scratch(1, static_cast<size_t>(max_rows * G));   // [gate | up], or up
  float* act = f32_scratch(2, static_cast<size_t>(max_rows * I));  // silu(gate) * up
  float* y = f32_scratch(3, static_cast<size_t>(T * k * H));       // one row per slot
  const float* xp = x.ptr<float>() + t0 * x.stride[0];
  const int64_t xs = x.stride[0];
  for (int64_t e = 0; e < E; ++e) {
    const int64_t s0 = offsets[e], n = offsets[e + 1] - s0;
    if (n == 0) continue;
    for (int64_t r = 0; r < n; ++r) std::copy_n(xp + slots[s0 + r] / k * xs, H, xg + r * H);
    expert_linear(f32_matrix(gu, n, G), f32_matrix(xg, n, H), w13, w13_scale, e,
                  bias_row(w13_bias, e), reference);
    if (activation == 2)
      relu2(f32_matrix(act, n, I), f32_matrix(gu, n, G), reference);
    else if (activation == 1)
      swigluoai_and_mul(f32_matrix(act, n, I), f32_matrix(gu, n, 2 * I), kSwigluOaiAlpha,
                        kSwigluOaiLimit, reference);
    else
      silu_and_mul(f32_matrix(act, n, I), f32_matrix(gu, n, 2 * I), reference);
    expert_linear(f32_matrix(xg, n, H), f32_matrix(act, n, I), w2, w2_scale, e,
                  bias_row(w2_bias, e), reference);
    for (int64_t r = 0; r < n; ++r) std::copy_n(xg + r * H, H, y + slots[s0 + r] * H);
  }
  // Another rank's experts (-1) add nothing: their rows of y are zeros.
  for (int64_t s = 0; s < T * k; ++s)
    if (ids[s / k * is + s % k] < 0) std::fill_n(y + s * H, H, 0.0f);

  // out[t] = sum_j w[t, j] y[t, j], in rank order.
  const float* tw = topk_weights.ptr<float>() + t0 * topk_weights.stride[0];
  const int64_t ws = topk_weights.stride[0];
  float* op_ = out.ptr<float>() + t0 * out.stride[0];
  const int64_t os = out.stride[0];
#pragma omp parallel for if (T * k * H > 65536) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* o = op_ + t * os;
    const float* y0 = y + t * k * H;
    const float w0 = tw[t * ws];
    for (int64_t h = 0; h < H; ++h) o[h] = w0 * y0[h];
    for (int64_t j = 1; j < k; ++j) {
      const float wj = tw[t * ws + j];
      const float* yj = y0 + j * H;
      for (int64_t h = 0; h < H; ++h) o[h] += wj * yj[h];
    }
  }
}

// Slot rows per chunk: bounds the [T * k, H] buffer (32 MB) during long prefills while
// leaving each expert enough rows to reuse its weights across.
constexpr int64_t kChunkSlotFloats = int64_t{1} << 23;

void fused_experts(const Tensor& out, const Tensor& x, const Tensor& w13, const Tensor& w2,
                   const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& w13_bias,
                   const Tensor& w2_bias, int64_t activation, const Tensor& w13_scale,
                   const Tensor& w2_scale, bool reference) {
  check_dtype(x, DType::F32, "fused_experts", "x");
  check_dtype(out, DType::F32, "fused_experts", "out");
  const int64_t T = x.shape[0], H = x.shape[1], k = topk_ids.shape[1];
  const int64_t chunk = std::max<int64_t>(1, kChunkSlotFloats / std::max<int64_t>(k * H, 1));
  for (int64_t t0 = 0; t0 < T; t0 += chunk)
    run_chunk(out, x, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, activation, w13_scale,
              w2_scale, t0, std::min(T, t0 + chunk), reference);
}

}  // namespace

VLLMX_KERNEL(fused_experts, kCPU, fused_experts);

}  // namespace vllmx
