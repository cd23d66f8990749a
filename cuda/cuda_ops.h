// The CUDA ops: the same contracts as csrc/ops.h (read there), on tensors whose data live on
// the GPU (Tensor::device == kCUDA). Activations are bf16, f16 or f32 (the op's out/x dtype);
// reductions accumulate in f32. Every op validates its arguments like the CPU op (throwing
// std::invalid_argument naming the op and shapes) and launches on cuda::current_stream().
// Where vllmx is built without CUDA, csrc/cuda_shim.cpp defines these to throw
// "vllmx was built without CUDA".
#pragma once
#include <cstdint>

#include "tensor.h"

namespace vllmx::cuda {

void embedding(const Tensor& out, const Tensor& ids, const Tensor& table);
void rms_norm(const Tensor& out, const Tensor& x, const Tensor& w, float eps);
void fused_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps);
void rotary(const Tensor& positions, const Tensor& q, const Tensor& k, const Tensor& cos_sin_cache,
            int64_t head_size, bool is_neox);
void silu_and_mul(const Tensor& out, const Tensor& x);
void gelu_and_mul(const Tensor& out, const Tensor& x, bool approximate_tanh);
void write_kv_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                    const Tensor& value_cache, const Tensor& slot_mapping);
// out[T, N] = x[T, K] @ w[N, K]^T (+ bias): w bf16/f16 (tensor cores), or Q8_0/Q4_0/Q4_1 blocks
// (dequantized in registers). x/out bf16 or f16 (same dtype), bias like out.
void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias);
void paged_attention(const Tensor& out, const Tensor& q, const Tensor& key_cache,
                     const Tensor& value_cache, const Tensor& block_table,
                     const Tensor& query_start_loc, const Tensor& seq_lens, float scale,
                     int64_t sliding_window, float logits_soft_cap);
void sample(const Tensor& out_ids, const Tensor& out_logprobs, const Tensor& logits,
            const Tensor& temperature, const Tensor& top_k, const Tensor& top_p,
            const Tensor& min_p, const Tensor& rng_state);

}  // namespace vllmx::cuda
