#include "step_tape.h"

#include "ops.h"

namespace vllmx {

StepTape::Op& StepTape::push(Kind kind, bool reference, std::initializer_list<Tensor> tensors) {
  Op& op = ops_.emplace_back();
  op.kind = kind;
  op.reference = reference;
  for (const Tensor& t : tensors) op.t[op.num_tensors++] = t;
  return op;
}

void StepTape::embedding(const Tensor& out, const Tensor& ids, const Tensor& table,
                         bool reference) {
  push(Kind::kEmbedding, reference, {out, ids, table});
}

void StepTape::linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                      bool reference) {
  push(Kind::kLinear, reference, {out, x, w, bias});
}

void StepTape::rms_norm(const Tensor& out, const Tensor& x, const Tensor& w, float eps,
                        bool reference) {
  push(Kind::kRmsNorm, reference, {out, x, w}).f[0] = eps;
}

void StepTape::fused_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w,
                                  float eps, bool reference) {
  push(Kind::kFusedAddRmsNorm, reference, {x, residual, w}).f[0] = eps;
}

void StepTape::rotary(const Tensor& positions, const Tensor& q, const Tensor& k,
                      const Tensor& cos_sin_cache, int64_t head_size, bool is_neox,
                      bool reference) {
  Op& op = push(Kind::kRotary, reference, {positions, q, k, cos_sin_cache});
  op.i[0] = head_size;
  op.flag = is_neox;
}

void StepTape::silu_and_mul(const Tensor& out, const Tensor& x, bool reference) {
  push(Kind::kSiluAndMul, reference, {out, x});
}

void StepTape::gelu_and_mul(const Tensor& out, const Tensor& x, bool approximate_tanh,
                            bool reference) {
  push(Kind::kGeluAndMul, reference, {out, x}).flag = approximate_tanh;
}

void StepTape::write_kv_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                              const Tensor& value_cache, const Tensor& slot_mapping,
                              bool reference) {
  push(Kind::kWriteKvCache, reference, {key, value, key_cache, value_cache, slot_mapping});
}

void StepTape::paged_attention(const Tensor& out, const Tensor& q, const Tensor& key_cache,
                               const Tensor& value_cache, const Tensor& block_table,
                               const Tensor& query_start_loc, const Tensor& seq_lens,
                               float scale, int64_t sliding_window, float logits_soft_cap,
                               bool reference) {
  Op& op = push(Kind::kPagedAttention, reference,
                {out, q, key_cache, value_cache, block_table, query_start_loc, seq_lens});
  op.f[0] = scale;
  op.f[1] = logits_soft_cap;
  op.i[0] = sliding_window;
}

void StepTape::copy_columns(const Tensor& out, int64_t out_col, const Tensor& x, int64_t x_col,
                            int64_t n) {
  Op& op = push(Kind::kCopyColumns, false, {out, x});
  op.i[0] = out_col;
  op.i[1] = x_col;
  op.i[2] = n;
}

void StepTape::scale(const Tensor& out, const Tensor& x, float s) {
  push(Kind::kScale, false, {out, x}).f[0] = s;
}

void StepTape::replay() const {
  for (const Op& op : ops_) {
    const Tensor* t = op.t;
    const bool ref = op.reference;
    switch (op.kind) {
      case Kind::kEmbedding: vllmx::embedding(t[0], t[1], t[2], ref); break;
      case Kind::kLinear: vllmx::linear(t[0], t[1], t[2], t[3], ref); break;
      case Kind::kRmsNorm: vllmx::rms_norm(t[0], t[1], t[2], op.f[0], ref); break;
      case Kind::kFusedAddRmsNorm:
        vllmx::fused_add_rms_norm(t[0], t[1], t[2], op.f[0], ref);
        break;
      case Kind::kRotary: vllmx::rotary(t[0], t[1], t[2], t[3], op.i[0], op.flag, ref); break;
      case Kind::kSiluAndMul: vllmx::silu_and_mul(t[0], t[1], ref); break;
      case Kind::kGeluAndMul: vllmx::gelu_and_mul(t[0], t[1], op.flag, ref); break;
      case Kind::kWriteKvCache: vllmx::write_kv_cache(t[0], t[1], t[2], t[3], t[4], ref); break;
      case Kind::kPagedAttention:
        vllmx::paged_attention(t[0], t[1], t[2], t[3], t[4], t[5], t[6], op.f[0], op.i[0],
                               op.f[1], ref);
        break;
      case Kind::kCopyColumns:
        vllmx::copy_columns(t[0], op.i[0], t[1], op.i[1], op.i[2]);
        break;
      case Kind::kScale: vllmx::scale(t[0], t[1], op.f[0]); break;
    }
  }
}

void StepTape::relocate(const void* begin, int64_t nbytes, void* to) {
  const char* lo = static_cast<const char*>(begin);
  for (Op& op : ops_)
    for (int j = 0; j < op.num_tensors; ++j) {
      const char* p = static_cast<const char*>(op.t[j].data);
      if (p != nullptr && p >= lo && p < lo + nbytes)
        op.t[j].data = static_cast<char*>(to) + (p - lo);
    }
}

}  // namespace vllmx
