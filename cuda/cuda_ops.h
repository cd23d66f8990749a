// The CUDA kernels one kernel file calls from another (linear.cu's unfused paths run
// elementwise.cu's). Every op's contract is in csrc/ops.def; kernels register themselves in
// the op table (VLLMX_KERNEL) beside their code.
#pragma once
#include "core/tensor.h"

namespace vllmx::cuda {

void silu_and_mul(const Tensor& out, const Tensor& x);
void gelu_and_mul(const Tensor& out, const Tensor& x, bool approximate_tanh);
void add_rms_norm(const Tensor& out, const Tensor& res_out, const Tensor& x, const Tensor& res,
                  const Tensor& w, float eps);

}  // namespace vllmx::cuda
