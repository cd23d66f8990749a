// The CUDA kernels one kernel file calls from another (linear.cu's unfused paths run
// elementwise.cu's and norm.cu's). Every op's contract is in csrc/ops.def; kernels register themselves in
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

// gated_delta_chunked.cu: gated_delta_rule's sequences of at least kChunkedMinTokens tokens in
// chunks on the tensor cores, where it takes the batch (f16 / bf16, no speculative rows, the
// head sizes and layouts it needs; false: it launched nothing); linear_attn.cu's token-by-token
// kernel then leaves those sequences to it.
constexpr int64_t kChunkedMinTokens = 8;
bool gated_delta_rule_chunked(const Tensor& out, const Tensor& recurrent_state, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                              const Tensor& A_log, const Tensor& dt_bias,
                              const Tensor& query_start_loc, const Tensor& state_indices,
                              const Tensor& has_initial_state);

}  // namespace vllmx::cuda
