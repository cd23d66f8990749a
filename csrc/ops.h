// The native CPU ops. Every op validates its arguments (std::invalid_argument naming the op
// and shapes) and has a scalar reference twin, selected by `reference = true`, that the tests
// compare the fast path against. Activations are f32, row-major, contiguous.
#pragma once
#include <cstdint>

#include "tensor.h"

namespace vllmx {

// out[T, H] (f32) = table[ids[t]] for ids (i32 [T]); table [V, H] is f32/f16/bf16 or any
// supported block type (rows are dequantized).
void embedding(const Tensor& out, const Tensor& ids, const Tensor& table, bool reference);

// Dequantizes a whole tensor of n elements (rows of blocks) into f32.
void dequantize(const Tensor& out, const Tensor& src, bool reference);
// Quantizes f32 [rows, n] to a block type (Q8_0, Q8_1 for now: the activation formats).
void quantize(const Tensor& out, const Tensor& src, bool reference);

// out[T, N] = x[T, K] @ w[N, K]^T (+ bias[N]). w: f32/f16/bf16 or a block type; for block
// types x is quantized to 8-bit blocks and the dot products are integer (llama.cpp's scheme).
void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
            bool reference);

// out = x / rms(x) * w over the last dim. x, out: f32 [T, H]; w: f32 [H].
void rms_norm(const Tensor& out, const Tensor& x, const Tensor& w, float eps, bool reference);
// vLLM's fused op: residual += x; x = rms_norm(residual) * w (both in place).
void fused_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps,
                        bool reference);

// Rotates q [T, nq * D] and k [T, nk * D] in place by positions (i32 [T]) using
// cos_sin_cache (f32 [max_pos, rot_dim]: rot_dim/2 cosines then rot_dim/2 sines), the first
// rot_dim dims of each head, neox (rotate halves) or gptj (rotate interleaved pairs) layout.
void rotary(const Tensor& positions, const Tensor& q, const Tensor& k, const Tensor& cos_sin_cache,
            int64_t head_size, bool is_neox, bool reference);

// out[T, I] = silu(x[:, :I]) * x[:, I:] for x [T, 2I].
void silu_and_mul(const Tensor& out, const Tensor& x, bool reference);

// Writes key/value (f32 [T, nkv * D]) into the paged caches (f16/bf16/f32
// [num_blocks, block_size, nkv, D]) at slot_mapping (i32 [T]; slot < 0 is skipped).
void write_kv_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                    const Tensor& value_cache, const Tensor& slot_mapping, bool reference);

// Varlen causal attention over the paged cache. q: f32 [T, nq * D]; out like q. Sequence b owns
// query rows query_start_loc[b] .. query_start_loc[b+1] (i32 [B + 1]); its context holds
// seq_lens[b] tokens (i32 [B]), the queries being the last ones, so query i of a sequence with
// q_len queries sees context positions [0, seq_len - q_len + i]. block_table: i32 [B, max_blocks].
// sliding_window <= 0 means none; logits_soft_cap <= 0 means none.
void paged_attention(const Tensor& out, const Tensor& q, const Tensor& key_cache,
                     const Tensor& value_cache, const Tensor& block_table,
                     const Tensor& query_start_loc, const Tensor& seq_lens, float scale,
                     int64_t sliding_window, float logits_soft_cap, bool reference);

// Samples one token per row of logits (f32 [B, V], modified in place). Per row:
// temperature (f32 [B], 0 = greedy), top_k (i32 [B], <= 0 = off), top_p (f32 [B], 1 = off),
// min_p (f32 [B], 0 = off), rng_state (u64 [B, 2]: the row's own generator, advanced in place).
// out_ids: i32 [B]; out_logprobs (optional f32 [B]): log-prob of the chosen token under the
// unmodified logits.
void sample(const Tensor& out_ids, const Tensor& out_logprobs, const Tensor& logits,
            const Tensor& temperature, const Tensor& top_k, const Tensor& top_p,
            const Tensor& min_p, const Tensor& rng_state, bool reference);

// vLLM V1's built-in logits processors, applied in place to logits (f32 [B, V]) in vLLM's order:
// allowed_token_ids, bad words, sparse additions (logit_bias; -inf for ids banned by
// min_tokens), then penalties. Each group is optional (leave its indptr undefined). All lists are
// CSR: an i32 indptr [rows + 1] into flat i32 lists of token ids.
struct LogitsProcessorArgs {
  // Row b keeps only allowed_ids[allowed_indptr[b] .. allowed_indptr[b + 1]); no entries: no mask.
  Tensor allowed_indptr, allowed_ids;
  // Row b's bad words are words bad_words_indptr[b] .. [b + 1); word w is the token list
  // bad_word_tokens[bad_word_token_indptr[w] .. [w + 1]). output_tail(_indptr): the end of each
  // row's output (at least the longest word's length - 1 tokens, when there are that many).
  Tensor bad_words_indptr, bad_word_token_indptr, bad_word_tokens, output_tail_indptr, output_tail;
  // logits[b, bias_ids[j]] += bias_values[j] (f32).
  Tensor bias_indptr, bias_ids, bias_values;
  // The distinct tokens of row b's prompt and output, with output_counts (i32) their counts in
  // the output; repetition / frequency / presence penalties: f32 [B].
  Tensor penalty_indptr, penalty_ids, output_counts;
  Tensor repetition_penalty, frequency_penalty, presence_penalty;
};
void apply_logits_processors(const Tensor& logits, const LogitsProcessorArgs& args,
                             bool reference);

// Log-probabilities under log_softmax(logits) (f32 [N, V], NaN ignored), per row n:
// out_token_logprob[n] (f32 [N]) of token_ids[n] (i32 [N]); where num_logprobs[n] (i32 [N]) >= 0,
// out_rank[n] (i32 [N]) = 1 + #tokens with a strictly greater logit, and the num_logprobs[n] most
// probable tokens in out_top_ids / out_top_logprobs (i32 / f32 [N, K], descending, lower id first
// on ties; the rest of the row -1 / -inf). num_logprobs[n] < 0: rank 0, no top list. The top
// arrays may be left undefined when no row asks for any (K = 0).
void compute_logprobs(const Tensor& out_token_logprob, const Tensor& out_rank,
                      const Tensor& out_top_ids, const Tensor& out_top_logprobs,
                      const Tensor& logits, const Tensor& token_ids, const Tensor& num_logprobs,
                      bool reference);

// Repacks a block weight w [N, K] (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0) into out, its packed dtype
// (Q4_0_X16 ...) of the same shape and bytes: panels of 16 rows for the linear kernels
// (layout in repack.h). linear() accepts either form and gives the same results up to f32
// rounding; the packed form is faster where packed_is_fast().
void repack_weight(const Tensor& out, const Tensor& w);

}  // namespace vllmx

namespace vllmx {
// out[T, I] = gelu(x[:, :I]) * x[:, I:] for x [T, 2I] (GeGLU); gelu is exact (erf) or, with
// approximate_tanh, PyTorch's tanh approximation (gelu_pytorch_tanh).
void gelu_and_mul(const Tensor& out, const Tensor& x, bool approximate_tanh, bool reference);
}  // namespace vllmx

namespace vllmx {
// Quantizes f32 weights [rows, n] (contiguous) to out, a GGUF weight type of the same shape:
// Q2_K..Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 with llama.cpp's reference quantizers (no importance
// matrix; bit-identical to llama-quantize), or F32/F16/BF16 (round to nearest even). Rows run in
// parallel; each row is quantized on its own, so the result does not depend on the thread count.
void quantize_weight(const Tensor& out, const Tensor& src);
}  // namespace vllmx

namespace vllmx {
// out[:, out_col : out_col + n] = x[:, x_col : x_col + n] for row-major out [T, Wo] and x [T, Wx]
// of one dense dtype: splits q/k/v out of a fused projection, joins projections that cannot
// share a matmul. A plain copy, so it has no reference twin.
void copy_columns(const Tensor& out, int64_t out_col, const Tensor& x, int64_t x_col,
                  int64_t n);
// out = x * s elementwise (f32; out may be x). Gemma's embedding scale.
void scale(const Tensor& out, const Tensor& x, float s);
}  // namespace vllmx
