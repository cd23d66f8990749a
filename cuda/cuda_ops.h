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
// gemm_batched.cu: batched_linear in one launch for the shapes it takes (a few rows of f16 /
// bf16, a dense contiguous w of x's dtype, 16-byte aligned rows).
bool batched_gemm_fits(const Tensor& out, const Tensor& x, const Tensor& w);
void batched_gemm(const Tensor& out, const Tensor& x, const Tensor& w);

}  // namespace vllmx::cuda
