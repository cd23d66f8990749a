// The gates of the hybrid models' mixers on the CPU (contracts in csrc/ops.def):
// rms_norm_gated (Gated DeltaNet's and Mamba2's output norm, gated by silu(z)) and sigmoid_gate
// (Qwen3-Next's gated attention output and its shared expert's gate).
#include "core/kernel_pragmas.h"

#include <cmath>

#include "core/op_table.h"

namespace vllmx {

namespace {

template <typename F>
F silu(float z) {
  return F(z) / (F(1) + std::exp(-F(z)));
}

template <typename F>
void gated_group(const float* x, const float* z, const float* w, int64_t D, float eps,
                 bool norm_before_gate, float* o) {
  F ss = 0;
  for (int64_t i = 0; i < D; ++i) {
    const F v = norm_before_gate ? F(x[i]) : F(x[i]) * silu<F>(z[i]);
    ss += v * v;
  }
  const F inv = F(1) / std::sqrt(ss / F(D) + F(eps));
  for (int64_t i = 0; i < D; ++i) {
    const F v = norm_before_gate ? F(x[i]) * inv * F(w[i]) * silu<F>(z[i])
                                 : F(x[i]) * silu<F>(z[i]) * inv * F(w[i]);
    o[i] = static_cast<float>(v);
  }
}

void rms_norm_gated(const Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w,
                    float eps, int64_t group_size, bool norm_before_gate, bool reference) {
  const char* op = "rms_norm_gated";
  for (const Tensor* t : {&out, &x, &z, &w}) check_dtype(*t, DType::F32, op, "tensors");
  const int64_t rows = x.shape[0], D = group_size, groups = x.shape[1] / D;
  const bool shared = w.shape[0] == D;  // one weight for every group, else [G * D]
#pragma omp parallel for if (rows > 4) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xr = x.ptr<float>() + r * x.stride[0] + g * D;
      const float* zr = z.ptr<float>() + r * z.stride[0] + g * D;
      float* o = out.ptr<float>() + r * out.stride[0] + g * D;
      const float* wr = w.ptr<float>() + (shared ? 0 : g * D);
      if (reference)
        gated_group<double>(xr, zr, wr, D, eps, norm_before_gate, o);
      else
        gated_group<float>(xr, zr, wr, D, eps, norm_before_gate, o);
    }
}

void sigmoid_gate(const Tensor& x, const Tensor& gate, bool reference) {
  const char* op = "sigmoid_gate";
  check_dtype(x, DType::F32, op, "x");
  check_dtype(gate, DType::F32, op, "gate");
  const int64_t rows = x.shape[0], n = x.shape[1];
  const bool per_row = gate.shape[1] == 1;
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.ptr<float>() + r * x.stride[0];
    const float* gr = gate.ptr<float>() + r * gate.stride[0];
    for (int64_t i = 0; i < n; ++i) {
      const float g = gr[per_row ? 0 : i];
      xr[i] = reference ? static_cast<float>(xr[i] / (1.0 + std::exp(-static_cast<double>(g))))
                        : xr[i] / (1.0f + std::exp(-g));
    }
  }
}

}  // namespace

VLLMX_KERNEL(rms_norm_gated, kCPU, rms_norm_gated);
VLLMX_KERNEL(sigmoid_gate, kCPU, sigmoid_gate);

}  // namespace vllmx
