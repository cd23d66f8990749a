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
// Out of place: res_out = x + res (res undefined: plain rms_norm, res_out unused);
// out = rms_norm(res_out) * w.
void add_rms_norm(const Tensor& out, const Tensor& res_out, const Tensor& x, const Tensor& res,
                  const Tensor& w, float eps);
void rotary(const Tensor& positions, const Tensor& q, const Tensor& k, const Tensor& cos_sin_cache,
            int64_t head_size, bool is_neox);
void silu_and_mul(const Tensor& out, const Tensor& x);
void gelu_and_mul(const Tensor& out, const Tensor& x, bool approximate_tanh);
void write_kv_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                    const Tensor& value_cache, const Tensor& slot_mapping);
// The attention prologue of a step in one kernel: qkv [T, (nq + 2 nkv) * D] -> q_out [T, nq * D]
// rms-normed by q_norm (optional, Qwen3) and rotated; k normed by k_norm and rotated, and v, to
// the cache slots (as rms_norm, rotary and write_kv_cache would, one after the other).
void qk_norm_rope_cache(const Tensor& q_out, const Tensor& qkv, const Tensor& positions,
                        const Tensor& cos_sin_cache, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const Tensor& key_cache, const Tensor& value_cache,
                        const Tensor& slot_mapping, int64_t num_heads, int64_t num_kv_heads,
                        bool is_neox);
// out[T, N] = x[T, K] @ w[N, K]^T (+ bias): w bf16/f16 (tensor cores), or Q8_0/Q4_0/Q4_1 blocks
// (dequantized in registers). x/out bf16 or f16 (same dtype), bias like out. w is a weight: the
// GEMV starts reading it before the previous kernel on the stream has finished (PDL), so it
// must not be that kernel's output.
void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias);
// out[T, I] = act(x @ w[:I]^T) * (x @ w[I:]^T), w = [gate; up] (vLLM's merged gate_up_proj);
// act 0 silu, 1 gelu (erf), 2 gelu (tanh). Decode rows with silu: one GEMV that applies the
// activation in its epilogue; otherwise linear into tmp [T, 2 I] then act_and_mul. Same values
// either way (each dot product is rounded to the activation dtype before the activation).
void linear_act_and_mul(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& tmp,
                        int act);
// A norm and the projection after it (a decoder layer's input / post-attention norm and its
// qkv / gate_up projection): h = x + residual (res_out = h; residual undefined: h = x),
// y = rms_norm(h) * norm_w (f32 [K]), out = y @ w^T + bias, or with act >= 0 act and mul as in
// linear_act_and_mul. Decode rows: one GEMV that normalizes x as it reads it (no y in memory);
// otherwise add_rms_norm into tmp_norm [T, K] then linear / linear_act_and_mul (tmp_act
// [T, 2 I]). res_out must not alias x or residual.
void rms_norm_linear(const Tensor& out, const Tensor& res_out, const Tensor& x,
                     const Tensor& residual, const Tensor& norm_w, float eps, const Tensor& w,
                     const Tensor& bias, const Tensor& tmp_norm, const Tensor& tmp_act, int act);
void paged_attention(const Tensor& out, const Tensor& q, const Tensor& key_cache,
                     const Tensor& value_cache, const Tensor& block_table,
                     const Tensor& query_start_loc, const Tensor& seq_lens, float scale,
                     int64_t sliding_window, float logits_soft_cap, int64_t max_query_len = 0);
void sample(const Tensor& out_ids, const Tensor& out_logprobs, const Tensor& logits,
            const Tensor& temperature, const Tensor& top_k, const Tensor& top_p,
            const Tensor& min_p, const Tensor& rng_state);

}  // namespace vllmx::cuda
