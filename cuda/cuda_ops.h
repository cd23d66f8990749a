// The CUDA kernels one kernel file calls from another (linear.cu's unfused paths run
// elementwise.cu's and norm.cu's). Every op's contract is in csrc/ops.def; kernels register themselves in
// the op table (VLLMX_KERNEL) beside their code.
#pragma once
#include <cstdint>
#include <functional>

#include "core/tensor.h"

namespace vllmx::cuda {

void silu_and_mul(const Tensor& out, const Tensor& x);
void gelu_and_mul(const Tensor& out, const Tensor& x, bool approximate_tanh);
void add_rms_norm(const Tensor& out, const Tensor& res_out, const Tensor& x, const Tensor& res,
                  const Tensor& w, float eps);
// add_rms_norm with res, its normed rows quantized as per_token_group_quant_fp8 quantizes them
// (codes [T, K] q_stride bytes apart, scales [K / 128][s_stride] f32) in one kernel, in place
// of out: the same res_out, codes and scales bit for bit. Where it takes the rows (16-byte
// vectors, K whole 128s, at most 32768 16-bit values); false: it launched nothing.
bool add_rms_norm_quant_fp8(uint8_t* q, int64_t q_stride, float* s, int64_t s_stride,
                            const Tensor& res_out, const Tensor& x, const Tensor& res,
                            const Tensor& w, float eps);
// fp8.cu: per_token_group_quant_fp8 of x's rows into codes (q, rows q_stride apart) and scales
// s [K / 128][s_stride >= T]. Four values a lane: x's rows on 4-element boundaries (q_stride
// too, the caller's).
void per_token_group_quant_fp8_rows(uint8_t* q, int64_t q_stride, float* s, int64_t s_stride,
                                    const Tensor& x, const char* op);
// fp8_linear once quantize(q, s, s_stride) has written x's codes [T, K] (rows K bytes
// apart) and scales [K / 128][s_stride] (it may be called twice, the second time with
// s_stride = T); out [T, N] = that x @ w^T with w's scales w_s (+ bias).
using Fp8Quantize = std::function<void(uint8_t* q, float* s, int64_t s_stride)>;
void fp8_linear_quantized(const Tensor& out, int64_t T, int64_t K, const Tensor& w,
                          const Tensor& w_s, const Tensor& bias, const Fp8Quantize& quantize,
                          const char* op);
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
