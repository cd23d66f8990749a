// CPU kernels that other CPU kernels compose (fused_experts runs each expert's rows through
// linear and silu_and_mul). Each is the op table's kernel, with its checks; reference selects
// the scalar twin.
#pragma once
#include "core/tensor.h"
#include "core/dtype.h"

namespace vllmx {

// Matrix g of a stacked weight [G, N, K] (fused_experts' experts, batched_linear's groups), as
// the 2-D [N, K] view linear takes.
inline Tensor stacked_view(const Tensor& w, int64_t g) {
  Tensor v = w;
  const TypeTraits& tt = type_traits(w.dtype);
  const int64_t bytes = tt.quantized ? w.stride[0] : w.stride[0] * tt.type_size;
  v.data = static_cast<uint8_t*>(w.data) + g * bytes;
  v.ndim = 2;
  v.shape[0] = w.shape[1];
  v.shape[1] = w.shape[2];
  v.stride[0] = w.stride[1];
  v.stride[1] = w.stride[2];
  v.shape[2] = v.stride[2] = 0;
  return v;
}

void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
            bool reference);
void silu_and_mul(const Tensor& out, const Tensor& x, bool reference);
void relu2(const Tensor& out, const Tensor& x, bool reference);
void swigluoai_and_mul(const Tensor& out, const Tensor& x, float alpha, float limit,
                       bool reference);

}  // namespace vllmx
