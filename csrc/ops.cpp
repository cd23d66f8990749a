// The contracts of the ops that every device shares (shapes, index dtypes, how tensors relate),
// checked once by the op table's dispatcher before any kernel runs (VLLMX_OP_CHECK). A kernel
// checks only what is its own: the activation dtypes it implements, the layouts it needs, and
// what it can read cheaply where the data live (a host-side slot range, say).
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/op_table.h"

namespace vllmx {

namespace {

std::string i2s(int64_t v) { return std::to_string(v); }

// key_cache / value_cache: [num_blocks, block_size, num_kv_heads, head_size] of one float dtype.
// One buffer may be both (shared_ok) where that is what the model means: MLA's latent cache is
// its keys and its values (the op writes the same rows to it twice, or only reads it).
void check_kv_caches(const char* op, const Tensor& key_cache, const Tensor& value_cache,
                     bool shared_ok = false) {
  check_ndim(key_cache, 4, op, "key_cache");
  check_ndim(value_cache, 4, op, "value_cache");
  const DType dt = key_cache.dtype;
  VLLMX_CHECK(dt == DType::F16 || dt == DType::BF16 || dt == DType::F32, op,
              "cache dtype must be f16, bf16 or f32, got key_cache " + key_cache.str());
  bool same = value_cache.dtype == dt;
  for (int d = 0; d < 4; ++d) same = same && value_cache.shape[d] == key_cache.shape[d];
  VLLMX_CHECK(same, op,
              "value_cache " + value_cache.str() + " does not match key_cache " + key_cache.str());
  VLLMX_CHECK(shared_ok || key_cache.data != value_cache.data || key_cache.numel() == 0, op,
              "key_cache and value_cache must be distinct buffers (one is both only when key "
              "and value are one tensor)");
}

void check_write_kv_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                          const Tensor& value_cache, const Tensor& slot_mapping) {
  const char* op = "write_kv_cache";
  check_ndim(key, 2, op, "key");
  check_ndim(value, 2, op, "value");
  VLLMX_CHECK(value.dtype == key.dtype, op,
              "value " + value.str() + " must have key's dtype (key " + key.str() + ")");
  check_kv_caches(op, key_cache, value_cache, key.data == value.data);
  check_dtype(slot_mapping, DType::I32, op, "slot_mapping");
  check_ndim(slot_mapping, 1, op, "slot_mapping");
  const int64_t row = key_cache.shape[2] * key_cache.shape[3];
  const int64_t T = key.shape[0];
  VLLMX_CHECK(key.shape[1] == row && value.shape[0] == T && value.shape[1] == row, op,
              "key " + key.str() + " / value " + value.str() +
                  " do not match the cache rows of " + key_cache.str() + " (expected [T, " +
                  i2s(row) + "])");
  VLLMX_CHECK(slot_mapping.shape[0] == T, op,
              "slot_mapping " + slot_mapping.str() + " does not match key " + key.str());
}

void check_paged_attention(const Tensor& out, const Tensor& q, const Tensor& key_cache,
                           const Tensor& value_cache, const Tensor& block_table,
                           const Tensor& query_start_loc, const Tensor& seq_lens, float scale,
                           int64_t sliding_window, float logits_soft_cap, int64_t max_query_len,
                           const Tensor& sinks) {
  (void)sliding_window;
  (void)max_query_len;
  const char* op = "paged_attention";
  check_ndim(q, 2, op, "q");
  check_ndim(out, 2, op, "out");
  VLLMX_CHECK(out.dtype == q.dtype && out.shape[0] == q.shape[0] && out.shape[1] == q.shape[1],
              op, "out " + out.str() + " does not match q " + q.str());
  check_kv_caches(op, key_cache, value_cache, true);
  check_dtype(block_table, DType::I32, op, "block_table");
  check_ndim(block_table, 2, op, "block_table");
  check_dtype(query_start_loc, DType::I32, op, "query_start_loc");
  check_ndim(query_start_loc, 1, op, "query_start_loc");
  check_dtype(seq_lens, DType::I32, op, "seq_lens");
  check_ndim(seq_lens, 1, op, "seq_lens");
  const int64_t block_size = key_cache.shape[1], nkv = key_cache.shape[2];
  const int64_t D = key_cache.shape[3];
  VLLMX_CHECK(block_size > 0 && nkv > 0 && D > 0, op, "bad cache shape " + key_cache.str());
  VLLMX_CHECK(q.shape[1] % D == 0 && q.shape[1] > 0, op,
              "q " + q.str() + " is not a whole number of heads of size " + i2s(D) +
                  " (cache " + key_cache.str() + ")");
  const int64_t nq = q.shape[1] / D;
  VLLMX_CHECK(nq % nkv == 0, op,
              "num query heads " + i2s(nq) + " (q " + q.str() +
                  ") is not a multiple of num kv heads " + i2s(nkv) + " (cache " +
                  key_cache.str() + ")");
  const int64_t B = seq_lens.shape[0];
  VLLMX_CHECK(query_start_loc.shape[0] == B + 1, op,
              "query_start_loc " + query_start_loc.str() +
                  " must have len(seq_lens) + 1 entries (seq_lens " + seq_lens.str() + ")");
  VLLMX_CHECK(block_table.shape[0] == B, op,
              "block_table " + block_table.str() +
                  " must have one row per sequence (seq_lens " + seq_lens.str() + ")");
  VLLMX_CHECK(std::isfinite(scale), op, "scale must be finite");
  VLLMX_CHECK(std::isfinite(logits_soft_cap), op, "logits_soft_cap must be finite");
  if (sinks.defined()) {
    check_dtype(sinks, DType::F32, op, "sinks");
    VLLMX_CHECK(sinks.ndim == 1 && sinks.shape[0] == nq, op,
                "sinks " + sinks.str() + " must have one entry per query head (" + i2s(nq) +
                    ")");
  }
}

void check_sample(const Tensor& out_ids, const Tensor& out_logprobs, const Tensor& logits,
                  const Tensor& temperature, const Tensor& top_k, const Tensor& top_p,
                  const Tensor& min_p, const Tensor& rng_state) {
  const char* op = "sample";
  check_dtype(logits, DType::F32, op, "logits");
  check_ndim(logits, 2, op, "logits");
  const int64_t B = logits.shape[0], V = logits.shape[1];
  VLLMX_CHECK(V > 0 || B == 0, op, "logits " + logits.str() + " has an empty vocabulary");
  VLLMX_CHECK(V <= std::numeric_limits<int32_t>::max(), op, "vocabulary too large");
  const auto per_row = [&](const Tensor& t, DType d, const char* name) {
    check_dtype(t, d, op, name);
    VLLMX_CHECK(t.ndim == 1 && t.shape[0] == B, op,
                std::string(name) + " " + t.str() + " must have one entry per row of logits " +
                    logits.str());
  };
  per_row(out_ids, DType::I32, "out_ids");
  if (out_logprobs.defined()) per_row(out_logprobs, DType::F32, "out_logprobs");
  per_row(temperature, DType::F32, "temperature");
  per_row(top_k, DType::I32, "top_k");
  per_row(top_p, DType::F32, "top_p");
  per_row(min_p, DType::F32, "min_p");
  check_dtype(rng_state, DType::U64, op, "rng_state");
  VLLMX_CHECK(rng_state.ndim == 2 && rng_state.shape[0] == B && rng_state.shape[1] == 2, op,
              "rng_state " + rng_state.str() + " must be [" + i2s(B) + ", 2]");
}

void check_copy_columns(const Tensor& out, int64_t out_col, const Tensor& x, int64_t x_col,
                        int64_t n, int64_t heads, int64_t out_head_stride,
                        int64_t x_head_stride) {
  const char* op = "copy_columns";
  check_ndim(out, 2, op, "out");
  check_ndim(x, 2, op, "x");
  VLLMX_CHECK(out.dtype == x.dtype && !type_traits(x.dtype).quantized, op,
              "out " + out.str() + " and x " + x.str() + " must have one dense dtype");
  VLLMX_CHECK(out.shape[0] == x.shape[0], op,
              "out " + out.str() + " and x " + x.str() + " must have the same rows");
  VLLMX_CHECK(heads >= 1 && out_head_stride >= 0 && x_head_stride >= 0, op,
              "heads (" + i2s(heads) + ") must be >= 1 and the head strides (" +
                  i2s(out_head_stride) + ", " + i2s(x_head_stride) + ") >= 0");
  // The last head's columns are the furthest (strides are not negative).
  const int64_t out_last = out_col + (heads - 1) * out_head_stride;
  const int64_t x_last = x_col + (heads - 1) * x_head_stride;
  VLLMX_CHECK(n >= 0 && out_col >= 0 && x_col >= 0 && out_last + n <= out.shape[1] &&
                  x_last + n <= x.shape[1],
              op, "columns [" + i2s(x_col) + ", +" + i2s(n) + ") of x " + x.str() + " -> [" +
                      i2s(out_col) + ", +" + i2s(n) + ") of out " + out.str() + " (" +
                      i2s(heads) + " heads, strides " + i2s(out_head_stride) + " / " +
                      i2s(x_head_stride) + ") are out of range");
  VLLMX_CHECK(heads == 1 || n <= out_head_stride, op,
              "n (" + i2s(n) + ") must not exceed out_head_stride (" + i2s(out_head_stride) +
                  "): the heads' pieces of out would overlap");
}

void check_scatter_tokens(const Tensor& out, const Tensor& dst, const Tensor& tokens,
                          const Tensor& src) {
  const char* op = "scatter_tokens";
  const std::pair<const Tensor*, const char*> args[] = {
      {&out, "out"}, {&dst, "dst"}, {&tokens, "tokens"}, {&src, "src"}};
  for (const auto& [t, name] : args) {
    check_dtype(*t, DType::I32, op, name);
    check_ndim(*t, 1, op, name);
    VLLMX_CHECK(t->stride[0] == 1, op, std::string(name) + " " + t->str() + " must be contiguous");
  }
  VLLMX_CHECK(dst.shape[0] == src.shape[0], op,
              "dst " + dst.str() + " and src " + src.str() + " must have one length");
}

void check_argmax(const Tensor& out_ids, const Tensor& x) {
  const char* op = "argmax";
  check_ndim(x, 2, op, "x");
  check_dtype(out_ids, DType::I32, op, "out_ids");
  VLLMX_CHECK(out_ids.ndim == 1 && out_ids.shape[0] == x.shape[0] && x.shape[1] >= 1 &&
                  x.stride[1] == 1,
              op, "out_ids " + out_ids.str() + " must be i32 [B] for x " + x.str() +
                      " (rows of at least one value, contiguous)");
}

void check_zero_rows_at_position(const Tensor& x, const Tensor& positions, int64_t position) {
  (void)position;
  const char* op = "zero_rows_at_position";
  check_ndim(x, 2, op, "x");
  check_dtype(positions, DType::I32, op, "positions");
  VLLMX_CHECK(positions.ndim == 1 && positions.shape[0] == x.shape[0] && x.stride[1] == 1, op,
              "positions " + positions.str() + " must be i32 [T] for x " + x.str());
}

void check_remap_expert_ids(const Tensor& topk_ids, int64_t start, int64_t count) {
  const char* op = "remap_expert_ids";
  check_dtype(topk_ids, DType::I32, op, "topk_ids");
  check_ndim(topk_ids, 2, op, "topk_ids");
  VLLMX_CHECK(topk_ids.stride[1] == 1, op, "topk_ids " + topk_ids.str() + " needs unit columns");
  VLLMX_CHECK(start >= 0 && count >= 1, op,
              "experts [" + i2s(start) + ", " + i2s(start + count) + ") must be a nonempty range");
}

void check_topk_softmax(const Tensor& topk_weights, const Tensor& topk_ids,
                        const Tensor& gating_output, bool renormalize) {
  (void)renormalize;
  const char* op = "topk_softmax";
  check_ndim(gating_output, 2, op, "gating_output");
  check_dtype(topk_weights, DType::F32, op, "topk_weights");
  check_ndim(topk_weights, 2, op, "topk_weights");
  check_dtype(topk_ids, DType::I32, op, "topk_ids");
  check_ndim(topk_ids, 2, op, "topk_ids");
  const int64_t T = gating_output.shape[0], E = gating_output.shape[1], k = topk_ids.shape[1];
  VLLMX_CHECK(topk_weights.shape[0] == T && topk_ids.shape[0] == T && topk_weights.shape[1] == k,
              op, "topk_weights " + topk_weights.str() + " and topk_ids " + topk_ids.str() +
                      " must both be [T, k] for gating_output " + gating_output.str());
  VLLMX_CHECK(k >= 1 && k <= E, op,
              "k = " + i2s(k) + " experts per token must be in 1.." + i2s(E) + " (gating_output " +
                  gating_output.str() + ")");
}

void check_grouped_topk(const Tensor& topk_weights, const Tensor& topk_ids,
                        const Tensor& gating_output, const Tensor& e_score_correction_bias,
                        int64_t num_expert_group, int64_t topk_group, bool sigmoid,
                        bool renormalize, float routed_scaling_factor) {
  (void)sigmoid;
  (void)renormalize;
  check_topk_softmax(topk_weights, topk_ids, gating_output, false);
  const char* op = "grouped_topk";
  const int64_t E = gating_output.shape[1], k = topk_ids.shape[1];
  const int64_t G = num_expert_group;
  VLLMX_CHECK(G >= 1 && E % G == 0, op,
              "num_expert_group = " + i2s(G) + " must divide the " + i2s(E) + " experts");
  VLLMX_CHECK(topk_group >= 1 && topk_group <= G && topk_group * (E / G) >= k, op,
              "topk_group = " + i2s(topk_group) + " groups of " + i2s(E / G) +
                  " experts must be in 1.." + i2s(G) + " and hold the k = " + i2s(k) +
                  " experts a token picks");
  if (e_score_correction_bias.defined()) {
    check_dtype(e_score_correction_bias, DType::F32, op, "e_score_correction_bias");
    VLLMX_CHECK(e_score_correction_bias.ndim == 1 && e_score_correction_bias.shape[0] == E, op,
                "e_score_correction_bias " + e_score_correction_bias.str() + " must be [" +
                    i2s(E) + "]");
    VLLMX_CHECK(G == 1 || E / G >= 2, op,
                "a group scores its two best experts with e_score_correction_bias: groups of " +
                    i2s(E / G) + " expert are too small");
  }
  VLLMX_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0, op,
              "routed_scaling_factor must be finite and positive");
}

void check_batched_linear(const Tensor& out, const Tensor& x, const Tensor& w) {
  const char* op = "batched_linear";
  check_ndim(x, 3, op, "x");
  check_ndim(w, 3, op, "w");
  check_ndim(out, 3, op, "out");
  const int64_t T = x.shape[0], G = x.shape[1], K = x.shape[2], N = w.shape[1];
  VLLMX_CHECK(w.shape[0] == G && w.shape[2] == K, op,
              "w " + w.str() + " must be [G, N, K] = [" + i2s(G) + ", N, " + i2s(K) +
                  "] for x " + x.str());
  VLLMX_CHECK(out.dtype == x.dtype && out.shape[0] == T && out.shape[1] == G &&
                  out.shape[2] == N,
              op, "out " + out.str() + " must be [" + i2s(T) + ", " + i2s(G) + ", " + i2s(N) +
                      "] in x's dtype (x " + x.str() + ", w " + w.str() + ")");
}

void check_fused_experts(const Tensor& out, const Tensor& x, const Tensor& w13, const Tensor& w2,
                         const Tensor& topk_weights, const Tensor& topk_ids,
                         const Tensor& w13_bias, const Tensor& w2_bias, int64_t activation,
                         const Tensor& w13_scale, const Tensor& w2_scale) {
  const char* op = "fused_experts";
  check_ndim(x, 2, op, "x");
  check_ndim(out, 2, op, "out");
  check_ndim(w13, 3, op, "w13");
  check_ndim(w2, 3, op, "w2");
  const int64_t T = x.shape[0], H = x.shape[1], E = w13.shape[0], I2 = w13.shape[1];
  VLLMX_CHECK(out.dtype == x.dtype && out.shape[0] == T && out.shape[1] == H, op,
              "out " + out.str() + " does not match x " + x.str());
  const bool gated = activation != 2;  // relu2's experts have no gate: w13 is up_proj alone
  const int64_t I = gated ? I2 / 2 : I2;
  VLLMX_CHECK(E >= 1 && (!gated || I2 % 2 == 0) && I2 > 0 && w13.shape[2] == H, op,
              "w13 " + w13.str() + " must be [E, " + (gated ? "2 * I" : "I") + ", H] with H = " +
                  i2s(H) + " (x " + x.str() + ")");
  VLLMX_CHECK(w2.shape[0] == E && w2.shape[1] == H && w2.shape[2] == I, op,
              "w2 " + w2.str() + " must be [E, H, I] = [" + i2s(E) + ", " + i2s(H) + ", " +
                  i2s(I) + "] for w13 " + w13.str());
  check_dtype(topk_weights, DType::F32, op, "topk_weights");
  check_ndim(topk_weights, 2, op, "topk_weights");
  check_dtype(topk_ids, DType::I32, op, "topk_ids");
  check_ndim(topk_ids, 2, op, "topk_ids");
  const int64_t k = topk_ids.shape[1];
  VLLMX_CHECK(topk_ids.shape[0] == T && topk_weights.shape[0] == T && topk_weights.shape[1] == k,
              op, "topk_weights " + topk_weights.str() + " and topk_ids " + topk_ids.str() +
                      " must both be [T, k] for x " + x.str());
  VLLMX_CHECK(k >= 1 && k <= E, op,
              "k = " + i2s(k) + " experts per token must be in 1.." + i2s(E) + " (w13 " +
                  w13.str() + ")");
  const auto check_bias = [&](const Tensor& b, int64_t n, const char* name) {
    if (!b.defined()) return;
    check_dtype(b, DType::F32, op, name);
    VLLMX_CHECK(b.ndim == 2 && b.shape[0] == E && b.shape[1] == n, op,
                std::string(name) + " " + b.str() + " must be [" + i2s(E) + ", " + i2s(n) + "]");
  };
  check_bias(w13_bias, I2, "w13_bias");
  check_bias(w2_bias, H, "w2_bias");
  // fp8 experts: both stacks e4m3 codes, each with a scale per row and 128 of K.
  VLLMX_CHECK(w13_scale.defined() == w2_scale.defined(), op,
              "w13_scale and w2_scale come together (fp8 experts) or not at all");
  const auto check_scale = [&](const Tensor& w, const Tensor& sc, const char* name) {
    const std::string n(name);
    if (!sc.defined()) {
      VLLMX_CHECK(w.dtype != DType::F8_E4M3, op,
                  n + " " + w.str() + " holds fp8 codes: give " + n + "_scale");
      return;
    }
    const int64_t N = w.shape[1], K = w.shape[2];
    VLLMX_CHECK(w.dtype == DType::F8_E4M3 && w.stride[2] == 1 && K % 128 == 0, op,
                n + " " + w.str() + " must be F8_E4M3 codes [E, N, K] with K whole 128s " +
                    "where " + n + "_scale is given");
    check_dtype(sc, DType::F32, op, (n + "_scale").c_str());
    VLLMX_CHECK(sc.ndim == 3 && sc.shape[0] == E && sc.shape[1] == K / 128 &&
                    sc.shape[2] == N && sc.stride[2] == 1 && sc.stride[1] == N,
                op, n + "_scale " + sc.str() + " must be [" + i2s(E) + ", " + i2s(K / 128) +
                        ", " + i2s(N) + "] with contiguous [K / 128, N] blocks (a scale per " +
                        "row of " + n + " and 128 of K)");
  };
  check_scale(w13, w13_scale, "w13");
  check_scale(w2, w2_scale, "w2");
  VLLMX_CHECK(activation >= 0 && activation <= 2, op,
              "activation must be 0 (silu), 1 (swigluoai) or 2 (relu2), got " + i2s(activation));
}

void check_add_lora_linear(const Tensor& y, const Tensor& x, const Tensor& lora_a,
                           const Tensor& lora_b, const Tensor& lora_indices,
                           const Tensor& output_slices) {
  const char* op = "add_lora_linear";
  check_ndim(x, 2, op, "x");
  check_ndim(y, 2, op, "y");
  check_ndim(lora_a, 3, op, "lora_a");
  check_ndim(lora_b, 3, op, "lora_b");
  check_dtype(lora_indices, DType::I32, op, "lora_indices");
  check_ndim(lora_indices, 1, op, "lora_indices");
  check_dtype(output_slices, DType::I32, op, "output_slices");
  check_ndim(output_slices, 1, op, "output_slices");
  const int64_t T = x.shape[0], K = x.shape[1], N = y.shape[1], L = lora_a.shape[0];
  const int64_t S = output_slices.shape[0] - 1, r = lora_b.shape[2];
  VLLMX_CHECK(y.shape[0] == T && lora_indices.shape[0] == T, op,
              "y " + y.str() + " and lora_indices " + lora_indices.str() +
                  " must have x's rows (x " + x.str() + ")");
  VLLMX_CHECK(S >= 1 && r >= 1, op,
              "output_slices " + output_slices.str() + " must hold S + 1 >= 2 offsets and lora_b " +
                  lora_b.str() + " a rank >= 1");
  VLLMX_CHECK(lora_a.shape[1] == S * r && lora_a.shape[2] == K, op,
              "lora_a " + lora_a.str() + " must be [L, S r, K] = [L, " + i2s(S * r) + ", " +
                  i2s(K) + "] (x " + x.str() + ", lora_b " + lora_b.str() + ", S = " + i2s(S) +
                  " slices)");
  VLLMX_CHECK(lora_b.shape[0] == L && lora_b.shape[1] == N, op,
              "lora_b " + lora_b.str() + " must be [L, N, r] with L = " + i2s(L) + ", N = " +
                  i2s(N) + " (y " + y.str() + ")");
  if (output_slices.device == kCPU) {  // (a GPU's are the kernel's to read)
    const int32_t* o = output_slices.ptr<int32_t>();
    const int64_t os = output_slices.stride[0];
    bool ok = o[0] == 0 && o[S * os] == N;
    for (int64_t i = 0; i < S; ++i) ok = ok && o[i * os] < o[(i + 1) * os];
    VLLMX_CHECK(ok, op,
                "output_slices must rise from 0 to N = " + i2s(N) + " (y " + y.str() + ")");
  }
}

void check_relu2(const Tensor& out, const Tensor& x) {
  const char* op = "relu2";
  check_ndim(x, 2, op, "x");
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == x.shape[0] && out.shape[1] == x.shape[1], op,
              "out " + out.str() + " does not match x " + x.str());
}

void check_swigluoai_and_mul(const Tensor& out, const Tensor& x, float alpha, float limit) {
  const char* op = "swigluoai_and_mul";
  check_ndim(x, 2, op, "x");
  check_ndim(out, 2, op, "out");
  VLLMX_CHECK(out.shape[0] == x.shape[0] && x.shape[1] == 2 * out.shape[1], op,
              "x " + x.str() + " must be [T, 2 * I] for out " + out.str());
  VLLMX_CHECK(std::isfinite(alpha) && limit > 0, op, "alpha must be finite and limit positive");
}

// The hybrid mixers' sequence arguments: query_start_loc [B + 1], state_indices and
// has_initial_state [B], all i32; state a tensor of slots.
// state: f32, or the activations' f16 / bf16 where act names them (the gated delta rule's and
// Mamba2's recurrent states: vLLM's mamba_ssm_cache_dtype).
void check_state_args(const char* op, const Tensor& state, const Tensor& query_start_loc,
                      const Tensor& state_indices, const Tensor& has_initial_state,
                      const Tensor& spec_state_indices, int64_t rows,
                      DType act = DType::F32) {
  for (const auto& [t, name] : {std::pair{&query_start_loc, "query_start_loc"},
                                std::pair{&state_indices, "state_indices"},
                                std::pair{&has_initial_state, "has_initial_state"}}) {
    check_dtype(*t, DType::I32, op, name);
    check_ndim(*t, 1, op, name);
  }
  const int64_t B = state_indices.shape[0];
  VLLMX_CHECK(query_start_loc.shape[0] == B + 1 && has_initial_state.shape[0] == B, op,
              "query_start_loc " + query_start_loc.str() + " must have len(state_indices) + 1 "
              "entries and has_initial_state " + has_initial_state.str() + " one a sequence");
  if (state.dtype != act || (act != DType::F16 && act != DType::BF16))
    check_dtype(state, DType::F32, op, "state");
  VLLMX_CHECK(state.is_contiguous(), op, "state " + state.str() + " must be contiguous");
  if (spec_state_indices.defined()) {
    check_dtype(spec_state_indices, DType::I32, op, "spec_state_indices");
    VLLMX_CHECK(spec_state_indices.ndim == 1 && spec_state_indices.shape[0] == rows, op,
                "spec_state_indices " + spec_state_indices.str() + " must have one entry a row (" +
                    i2s(rows) + ")");
  }
}

void check_causal_conv1d(const Tensor& out, const Tensor& x, const Tensor& weight,
                         const Tensor& bias, const Tensor& conv_state,
                         const Tensor& query_start_loc, const Tensor& state_indices,
                         const Tensor& has_initial_state, const Tensor& spec_state_indices,
                         bool silu) {
  (void)silu;
  const char* op = "causal_conv1d";
  check_ndim(x, 2, op, "x");
  check_ndim(weight, 2, op, "weight");
  check_dtype(weight, DType::F32, op, "weight");
  const int64_t D = x.shape[1], K = weight.shape[1];
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == x.shape[0] && out.shape[1] == D, op,
              "out " + out.str() + " does not match x " + x.str());
  VLLMX_CHECK(weight.shape[0] == D && K >= 2, op,
              "weight " + weight.str() + " must be [" + i2s(D) + ", K >= 2] for x " + x.str());
  VLLMX_CHECK(!bias.defined() || (bias.ndim == 1 && bias.shape[0] == D &&
                                  bias.dtype == DType::F32),
              op, "bias " + bias.str() + " must be F32[" + i2s(D) + "]");
  check_state_args(op, conv_state, query_start_loc, state_indices, has_initial_state,
                   spec_state_indices, x.shape[0]);
  VLLMX_CHECK(conv_state.ndim == 3 && conv_state.shape[1] == D && conv_state.shape[2] == K - 1,
              op, "conv_state " + conv_state.str() + " must be [slots, " + i2s(D) + ", " +
                      i2s(K - 1) + "]");
}

void check_gated_delta_rule(const Tensor& out, const Tensor& recurrent_state, const Tensor& q,
                            const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                            const Tensor& A_log, const Tensor& dt_bias,
                            const Tensor& query_start_loc, const Tensor& state_indices,
                            const Tensor& has_initial_state, const Tensor& spec_state_indices) {
  const char* op = "gated_delta_rule";
  check_state_args(op, recurrent_state, query_start_loc, state_indices, has_initial_state,
                   spec_state_indices, q.shape[0], q.dtype);
  check_ndim(recurrent_state, 4, op, "recurrent_state");
  const int64_t hv = recurrent_state.shape[1], dk = recurrent_state.shape[2];
  const int64_t dv = recurrent_state.shape[3], T = q.shape[0];
  for (const Tensor* t : {&out, &q, &k, &v, &a, &b}) check_ndim(*t, 2, op, "activations");
  VLLMX_CHECK(q.shape[1] % dk == 0 && k.shape[1] == q.shape[1] && q.shape[1] > 0 &&
                  hv % (q.shape[1] / dk) == 0,
              op, "q " + q.str() + " and k " + k.str() + " must be [T, Hk * " + i2s(dk) +
                      "] with Hk dividing the " + i2s(hv) + " value heads of " +
                      recurrent_state.str());
  for (const Tensor* t : {&k, &v, &a, &b, &out})
    VLLMX_CHECK(t->shape[0] == T, op, "every activation must have q's " + i2s(T) + " rows");
  VLLMX_CHECK(v.shape[1] == hv * dv && out.shape[1] == hv * dv, op,
              "v " + v.str() + " and out " + out.str() + " must be [T, " + i2s(hv * dv) + "]");
  VLLMX_CHECK(a.shape[1] == hv && b.shape[1] == hv, op,
              "a " + a.str() + " and b " + b.str() + " must be [T, " + i2s(hv) + "]");
  for (const Tensor* t : {&A_log, &dt_bias}) {
    check_dtype(*t, DType::F32, op, "A_log / dt_bias");
    VLLMX_CHECK(t->ndim == 1 && t->shape[0] == hv, op,
                "A_log and dt_bias must be F32[" + i2s(hv) + "], got " + t->str());
  }
}

void check_mamba2_scan(const Tensor& out, const Tensor& ssm_state, const Tensor& x,
                       const Tensor& dt, const Tensor& B, const Tensor& C, const Tensor& A_log,
                       const Tensor& D, const Tensor& dt_bias, const Tensor& query_start_loc,
                       const Tensor& state_indices, const Tensor& has_initial_state,
                       const Tensor& spec_state_indices, float dt_min, float dt_max) {
  const char* op = "mamba2_scan";
  check_state_args(op, ssm_state, query_start_loc, state_indices, has_initial_state,
                   spec_state_indices, x.shape[0], x.dtype);
  check_ndim(ssm_state, 4, op, "ssm_state");
  const int64_t H = ssm_state.shape[1], P = ssm_state.shape[2], N = ssm_state.shape[3];
  const int64_t T = x.shape[0];
  for (const Tensor* t : {&out, &x, &dt, &B, &C}) check_ndim(*t, 2, op, "activations");
  VLLMX_CHECK(x.shape[1] == H * P && out.shape[0] == T && out.shape[1] == H * P, op,
              "x " + x.str() + " and out " + out.str() + " must be [T, " + i2s(H * P) +
                  "] for ssm_state " + ssm_state.str());
  VLLMX_CHECK(dt.shape[0] == T && dt.shape[1] == H, op,
              "dt " + dt.str() + " must be [T, " + i2s(H) + "]");
  VLLMX_CHECK(B.shape[0] == T && C.shape[0] == T && B.shape[1] == C.shape[1] &&
                  B.shape[1] % N == 0 && B.shape[1] > 0 && H % (B.shape[1] / N) == 0,
              op, "B " + B.str() + " and C " + C.str() + " must be [T, G * " + i2s(N) +
                      "] with G dividing the " + i2s(H) + " heads");
  for (const Tensor* t : {&A_log, &D, &dt_bias}) {
    check_dtype(*t, DType::F32, op, "A_log / D / dt_bias");
    VLLMX_CHECK(t->ndim == 1 && t->shape[0] == H, op,
                "A_log, D and dt_bias must be F32[" + i2s(H) + "], got " + t->str());
  }
  VLLMX_CHECK(dt_min >= 0 && dt_max >= dt_min, op, "need 0 <= dt_min <= dt_max");
}

void check_rms_norm_gated(const Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w,
                          float eps, int64_t group_size, bool norm_before_gate) {
  (void)norm_before_gate;
  const char* op = "rms_norm_gated";
  check_ndim(x, 2, op, "x");
  check_ndim(w, 1, op, "w");
  for (const Tensor* t : {&out, &z})
    VLLMX_CHECK(t->ndim == 2 && t->shape[0] == x.shape[0] && t->shape[1] == x.shape[1], op,
                t->str() + " does not match x " + x.str());
  VLLMX_CHECK(group_size > 0 && x.shape[1] % group_size == 0 &&
                  (w.shape[0] == group_size || w.shape[0] == x.shape[1]),
              op, "x " + x.str() + " must be whole groups of " + i2s(group_size) +
                      " values and w " + w.str() + " one group's or the whole row's");
  VLLMX_CHECK(eps >= 0 && std::isfinite(eps), op, "eps must be finite and >= 0");
}

void check_per_token_group_quant_fp8(const Tensor& out_q, const Tensor& out_s, const Tensor& x) {
  const char* op = "per_token_group_quant_fp8";
  check_ndim(x, 2, op, "x");
  VLLMX_CHECK(x.dtype == DType::F32 || x.dtype == DType::F16 || x.dtype == DType::BF16, op,
              "x must be f32, f16 or bf16, got " + x.str());
  const int64_t T = x.shape[0], K = x.shape[1];
  VLLMX_CHECK(K % 128 == 0, op, "x " + x.str() + ": K must be whole groups of 128");
  VLLMX_CHECK(x.stride[1] == 1, op, "x's rows must be contiguous");
  check_dtype(out_q, DType::F8_E4M3, op, "out_q");
  VLLMX_CHECK(out_q.ndim == 2 && out_q.shape[0] == T && out_q.shape[1] == K &&
                  out_q.stride[1] == 1,
              op, "out_q " + out_q.str() + " must be [T, K] like x " + x.str() + ", rows contiguous");
  check_dtype(out_s, DType::F32, op, "out_s");
  VLLMX_CHECK(out_s.ndim == 2 && out_s.shape[0] == K / 128 && out_s.shape[1] == T &&
                  out_s.is_contiguous(),
              op, "out_s " + out_s.str() + " must be a contiguous [K / 128, T] = [" +
                      std::to_string(K / 128) + ", " + std::to_string(T) + "]");
}

// scaled_mm's and fp8_linear's shared part: the left operand a (2-D, dtype checked by the
// caller) and the weight b [N, K] F8_E4M3 with its scales b_s [K / 128, N], out [T, N], bias.
struct Fp8Names {  // the op's own names for a, b and b_s
  std::string a, b, b_s;
};
void check_fp8_operands(const char* op, const Fp8Names& names, const Tensor& out,
                        const Tensor& a, const Tensor& b, const Tensor& b_s, const Tensor& bias) {
  const std::string &a_name = names.a, &b_name = names.b, &s_name = names.b_s;
  check_ndim(a, 2, op, a_name.c_str());
  check_dtype(b, DType::F8_E4M3, op, b_name.c_str());
  check_ndim(b, 2, op, b_name.c_str());
  const int64_t T = a.shape[0], K = a.shape[1], N = b.shape[0];
  VLLMX_CHECK(b.shape[1] == K && K > 0 && K % 128 == 0, op,
              a_name + " " + a.str() + " and " + b_name + " " + b.str() +
                  " must share K, one or more whole groups of 128");
  VLLMX_CHECK(a.stride[1] == 1 && b.stride[1] == 1, op,
              a_name + "'s and " + b_name + "'s rows must be contiguous");
  check_dtype(b_s, DType::F32, op, s_name.c_str());
  VLLMX_CHECK(b_s.ndim == 2 && b_s.shape[0] == K / 128 && b_s.shape[1] == N &&
                  b_s.is_contiguous(),
              op, s_name + " " + b_s.str() + " must be a contiguous [K / 128, N] = [" +
                      std::to_string(K / 128) + ", " + std::to_string(N) + "]");
  VLLMX_CHECK(out.dtype == DType::F32 || out.dtype == DType::F16 || out.dtype == DType::BF16, op,
              "out must be f32, f16 or bf16, got " + out.str());
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == T && out.shape[1] == N && out.stride[1] == 1, op,
              "out " + out.str() + " must be [T, N] = [" + std::to_string(T) + ", " +
                  std::to_string(N) + "], rows contiguous");
  VLLMX_CHECK(!bias.defined() || (bias.dtype == out.dtype && bias.ndim == 1 &&
                                   bias.shape[0] == N && bias.stride[0] == 1),
              op, "bias " + bias.str() + " must be out's dtype, [N] = [" + std::to_string(N) +
                      "], contiguous");
}

void check_scaled_mm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_s,
                     const Tensor& b_s, const Tensor& bias) {
  const char* op = "scaled_mm";
  check_dtype(a, DType::F8_E4M3, op, "a");
  check_fp8_operands(op, {"a", "b", "b_s"}, out, a, b, b_s, bias);
  const int64_t T = a.shape[0], K = a.shape[1];
  check_dtype(a_s, DType::F32, op, "a_s");
  VLLMX_CHECK(a_s.ndim == 2 && a_s.shape[0] == K / 128 && a_s.shape[1] == T &&
                  a_s.is_contiguous(),
              op, "a_s " + a_s.str() + " must be a contiguous [K / 128, T] = [" +
                      std::to_string(K / 128) + ", " + std::to_string(T) + "]");
}

void check_fp8_linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& w_s,
                      const Tensor& bias) {
  const char* op = "fp8_linear";
  VLLMX_CHECK(x.dtype == DType::F32 || x.dtype == DType::F16 || x.dtype == DType::BF16, op,
              "x must be f32, f16 or bf16, got " + x.str());
  check_fp8_operands(op, {"x", "w", "w_s"}, out, x, w, w_s, bias);
}

void check_sigmoid_gate(const Tensor& x, const Tensor& gate) {
  const char* op = "sigmoid_gate";
  check_ndim(x, 2, op, "x");
  check_ndim(gate, 2, op, "gate");
  VLLMX_CHECK(gate.shape[0] == x.shape[0] && (gate.shape[1] == x.shape[1] || gate.shape[1] == 1),
              op, "gate " + gate.str() + " must be [T, N] or [T, 1] for x " + x.str());
}

void check_compute_logprobs(const Tensor& out_token_logprob, const Tensor& out_rank,
                            const Tensor& out_top_ids, const Tensor& out_top_logprobs,
                            const Tensor& logits, const Tensor& token_ids,
                            const Tensor& num_logprobs) {
  const char* op = "compute_logprobs";
  check_dtype(logits, DType::F32, op, "logits");
  check_ndim(logits, 2, op, "logits");
  const int64_t N = logits.shape[0], V = logits.shape[1];
  VLLMX_CHECK(V > 0 || N == 0, op, "logits " + logits.str() + " has an empty vocabulary");
  VLLMX_CHECK(V <= std::numeric_limits<int32_t>::max(), op, "vocabulary too large");
  const auto per_row = [&](const Tensor& t, DType d, const char* name) {
    check_dtype(t, d, op, name);
    VLLMX_CHECK(t.ndim == 1 && t.shape[0] == N, op,
                std::string(name) + " " + t.str() + " must have one entry per row (" + i2s(N) +
                    ")");
  };
  per_row(out_token_logprob, DType::F32, "out_token_logprob");
  per_row(out_rank, DType::I32, "out_rank");
  per_row(token_ids, DType::I32, "token_ids");
  per_row(num_logprobs, DType::I32, "num_logprobs");
  VLLMX_CHECK(out_top_ids.defined() == out_top_logprobs.defined(), op,
              "out_top_ids and out_top_logprobs are given together");
  if (out_top_ids.defined()) {
    check_dtype(out_top_ids, DType::I32, op, "out_top_ids");
    check_dtype(out_top_logprobs, DType::F32, op, "out_top_logprobs");
    VLLMX_CHECK(out_top_ids.ndim == 2 && out_top_ids.shape[0] == N &&
                    out_top_logprobs.ndim == 2 && out_top_logprobs.shape[0] == N &&
                    out_top_logprobs.shape[1] == out_top_ids.shape[1],
                op, "out_top_ids " + out_top_ids.str() + " and out_top_logprobs " +
                        out_top_logprobs.str() + " must both be [" + i2s(N) + ", K]");
  }
}

void check_apply_logits_processors(
    const Tensor& logits, const Tensor& allowed_indptr, const Tensor& allowed_ids,
    const Tensor& bad_words_indptr, const Tensor& bad_word_token_indptr,
    const Tensor& bad_word_tokens, const Tensor& output_tail_indptr, const Tensor& output_tail,
    const Tensor& bias_indptr, const Tensor& bias_ids, const Tensor& bias_values,
    const Tensor& penalty_indptr, const Tensor& penalty_ids, const Tensor& output_counts,
    const Tensor& repetition_penalty, const Tensor& frequency_penalty,
    const Tensor& presence_penalty) {
  const char* op = "apply_logits_processors";
  check_dtype(logits, DType::F32, op, "logits");
  check_ndim(logits, 2, op, "logits");
  const int64_t B = logits.shape[0];
  VLLMX_CHECK(logits.shape[1] <= std::numeric_limits<int32_t>::max(), op,
              "vocabulary too large");
  const auto list = [&](const Tensor& t, DType d, const char* name) {
    if (!t.defined()) return;
    check_dtype(t, d, op, name);
    check_ndim(t, 1, op, name);
  };
  const auto indptr = [&](const Tensor& t, const char* name) {
    list(t, DType::I32, name);
    VLLMX_CHECK(!t.defined() || t.shape[0] == B + 1, op,
                std::string(name) + " " + t.str() + " must be [" + i2s(B + 1) + "]");
  };
  indptr(allowed_indptr, "allowed_indptr");
  indptr(bad_words_indptr, "bad_words_indptr");
  indptr(output_tail_indptr, "output_tail_indptr");
  indptr(bias_indptr, "bias_indptr");
  indptr(penalty_indptr, "penalty_indptr");
  list(allowed_ids, DType::I32, "allowed_ids");
  list(bad_word_token_indptr, DType::I32, "bad_word_token_indptr");
  list(bad_word_tokens, DType::I32, "bad_word_tokens");
  list(output_tail, DType::I32, "output_tail");
  list(bias_ids, DType::I32, "bias_ids");
  list(bias_values, DType::F32, "bias_values");
  list(penalty_ids, DType::I32, "penalty_ids");
  list(output_counts, DType::I32, "output_counts");
  VLLMX_CHECK(!bad_words_indptr.defined() ||
                  (bad_word_token_indptr.defined() && output_tail_indptr.defined()),
              op, "bad words need bad_word_token_indptr, bad_word_tokens and output_tail(_indptr)");
  const int64_t nbias = bias_ids.defined() ? bias_ids.shape[0] : 0;
  VLLMX_CHECK(!bias_indptr.defined() || nbias == 0 ||
                  (bias_values.defined() && bias_values.shape[0] == nbias),
              op, "bias_values must be f32 [" + i2s(nbias) + "], one per bias id");
  if (penalty_indptr.defined()) {
    const int64_t npen = penalty_ids.defined() ? penalty_ids.shape[0] : 0;
    VLLMX_CHECK(npen == 0 || (output_counts.defined() && output_counts.shape[0] == npen), op,
                "output_counts must be i32 [" + i2s(npen) + "], one per penalty id");
    for (const auto& [t, name] : {std::pair{&repetition_penalty, "repetition_penalty"},
                                  std::pair{&frequency_penalty, "frequency_penalty"},
                                  std::pair{&presence_penalty, "presence_penalty"}}) {
      VLLMX_CHECK(t->defined(), op, std::string(name) + " is required with penalty_indptr");
      check_dtype(*t, DType::F32, op, name);
      VLLMX_CHECK(t->ndim == 1 && t->shape[0] == B, op,
                  std::string(name) + " " + t->str() + " must have one entry per row (" +
                      i2s(B) + ")");
    }
  }
}

void check_apply_token_bitmask(const Tensor& logits, const Tensor& bitmask,
                               const Tensor& indices) {
  const char* op = "apply_token_bitmask";
  check_dtype(logits, DType::F32, op, "logits");
  check_ndim(logits, 2, op, "logits");
  VLLMX_CHECK(logits.shape[1] == 0 || logits.stride[1] == 1, op,
              "logits " + logits.str() + " must have contiguous rows");
  check_dtype(bitmask, DType::I32, op, "bitmask");
  check_ndim(bitmask, 2, op, "bitmask");
  VLLMX_CHECK(bitmask.is_contiguous(), op, "bitmask " + bitmask.str() + " must be contiguous");
  const int64_t words = (logits.shape[1] + 31) / 32;
  VLLMX_CHECK(bitmask.shape[1] == words, op,
              "bitmask " + bitmask.str() + " must have ceil(V / 32) = " + i2s(words) +
                  " words per row for logits " + logits.str());
  if (indices.defined()) {
    check_dtype(indices, DType::I32, op, "indices");
    VLLMX_CHECK(indices.ndim == 1 && indices.shape[0] == bitmask.shape[0], op,
                "indices " + indices.str() + " must have one entry per bitmask row (" +
                    i2s(bitmask.shape[0]) + ")");
  } else {
    VLLMX_CHECK(bitmask.shape[0] == logits.shape[0], op,
                "bitmask " + bitmask.str() + " needs one row per logits row (logits " +
                    logits.str() + ") when no indices are given");
  }
}

void check_scale(const Tensor& out, const Tensor& x, float) {
  VLLMX_CHECK(out.dtype == x.dtype && out.numel() == x.numel(), "scale",
              "out " + out.str() + " must have x's dtype and size (x " + x.str() + ")");
}

// w (and b) [D] shared by every group of D values of a row, or [G, D], one per group.
void check_layer_norm_params(const char* op, const Tensor& x, const Tensor& w, const Tensor& b,
                             float eps) {
  check_ndim(x, 2, op, "x");
  VLLMX_CHECK((w.ndim == 1 || w.ndim == 2) && w.shape[w.ndim - 1] > 0, op,
              "w " + w.str() + " must be [D] or [G, D]");
  const int64_t d = w.shape[w.ndim - 1], width = x.shape[1];
  VLLMX_CHECK(w.ndim == 1 ? width % d == 0 : w.shape[0] * d == width, op,
              "w " + w.str() + " does not split the rows of x " + x.str() + " into groups");
  if (b.defined()) {
    bool same = b.ndim == w.ndim && b.dtype == w.dtype;
    for (int i = 0; same && i < w.ndim; ++i) same = b.shape[i] == w.shape[i];
    VLLMX_CHECK(same, op, "b " + b.str() + " must match w " + w.str());
  }
  VLLMX_CHECK(std::isfinite(eps) && eps >= 0.0f, op, "eps must be finite and >= 0");
}

void check_layer_norm(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b,
                      float eps) {
  const char* op = "layer_norm";
  check_layer_norm_params(op, x, w, b, eps);
  VLLMX_CHECK(out.ndim == 2 && out.dtype == x.dtype && out.shape[0] == x.shape[0] &&
                  out.shape[1] == x.shape[1],
              op, "out " + out.str() + " does not match x " + x.str());
}

void check_fused_add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& w,
                                const Tensor& b, float eps) {
  const char* op = "fused_add_layer_norm";
  check_layer_norm_params(op, x, w, b, eps);
  VLLMX_CHECK(w.ndim == 1 && w.shape[0] == x.shape[1], op,
              "w " + w.str() + " must be [H] for x " + x.str());
  VLLMX_CHECK(residual.ndim == 2 && residual.dtype == x.dtype &&
                  residual.shape[0] == x.shape[0] && residual.shape[1] == x.shape[1],
              op, "residual " + residual.str() + " does not match x " + x.str());
}

void check_gelu(const Tensor& out, const Tensor& x, bool) {
  check_ndim(x, 2, "gelu", "x");
  VLLMX_CHECK(out.ndim == 2 && out.dtype == x.dtype && out.shape[0] == x.shape[0] &&
                  out.shape[1] == x.shape[1],
              "gelu", "out " + out.str() + " does not match x " + x.str());
}

void check_softcap(const Tensor& x, float cap) {
  check_ndim(x, 2, "softcap", "x");
  VLLMX_CHECK(cap > 0.0f && std::isfinite(cap), "softcap",
              "cap must be a positive number, got " + std::to_string(cap));
}

void check_fill_uniform(const Tensor& out, int64_t, float low, float high) {
  const char* op = "fill_uniform";
  VLLMX_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high, op,
              "need finite low <= high, got " + std::to_string(low) + ", " +
                  std::to_string(high));
  VLLMX_CHECK(out.dtype == DType::F32 || out.dtype == DType::F16 || out.dtype == DType::BF16, op,
              "out must be f32, f16 or bf16, got " + out.str());
  VLLMX_CHECK(out.is_contiguous(), op, "out " + out.str() + " must be contiguous");
}

}  // namespace

VLLMX_OP_CHECK(apply_logits_processors, check_apply_logits_processors);
VLLMX_OP_CHECK(apply_token_bitmask, check_apply_token_bitmask);
VLLMX_OP_CHECK(compute_logprobs, check_compute_logprobs);
VLLMX_OP_CHECK(topk_softmax, check_topk_softmax);
VLLMX_OP_CHECK(argmax, check_argmax);
VLLMX_OP_CHECK(zero_rows_at_position, check_zero_rows_at_position);
VLLMX_OP_CHECK(remap_expert_ids, check_remap_expert_ids);
VLLMX_OP_CHECK(fused_experts, check_fused_experts);
VLLMX_OP_CHECK(causal_conv1d, check_causal_conv1d);
VLLMX_OP_CHECK(gated_delta_rule, check_gated_delta_rule);
VLLMX_OP_CHECK(rms_norm_gated, check_rms_norm_gated);
VLLMX_OP_CHECK(mamba2_scan, check_mamba2_scan);
VLLMX_OP_CHECK(sigmoid_gate, check_sigmoid_gate);
VLLMX_OP_CHECK(per_token_group_quant_fp8, check_per_token_group_quant_fp8);
VLLMX_OP_CHECK(scaled_mm, check_scaled_mm);
VLLMX_OP_CHECK(fp8_linear, check_fp8_linear);
VLLMX_OP_CHECK(swigluoai_and_mul, check_swigluoai_and_mul);
VLLMX_OP_CHECK(relu2, check_relu2);
VLLMX_OP_CHECK(add_lora_linear, check_add_lora_linear);
VLLMX_OP_CHECK(grouped_topk, check_grouped_topk);
VLLMX_OP_CHECK(batched_linear, check_batched_linear);
VLLMX_OP_CHECK(write_kv_cache, check_write_kv_cache);
VLLMX_OP_CHECK(paged_attention, check_paged_attention);
VLLMX_OP_CHECK(sample, check_sample);
VLLMX_OP_CHECK(copy_columns, check_copy_columns);
VLLMX_OP_CHECK(scale, check_scale);
VLLMX_OP_CHECK(scatter_tokens, check_scatter_tokens);
VLLMX_OP_CHECK(softcap, check_softcap);
VLLMX_OP_CHECK(layer_norm, check_layer_norm);
VLLMX_OP_CHECK(fused_add_layer_norm, check_fused_add_layer_norm);
VLLMX_OP_CHECK(gelu, check_gelu);
VLLMX_OP_CHECK(fill_uniform, check_fill_uniform);

}  // namespace vllmx
