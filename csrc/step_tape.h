// A decode step recorded as the native op calls it made, replayed without Python: the CPU's
// counterpart of a CUDA graph. vllmx._C appends each op to the tape being recorded (while a model's
// forward runs) and still runs it; replay() re-issues the same calls on the same views. Views are
// raw pointers, so the memory they name must stay allocated and in place for the tape's lifetime
// (the Python side holds it); relocate() repoints the views of one buffer into another, which is
// how a capture packs a step's activations into one arena by liveness.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "tensor.h"

namespace vllmx {

class StepTape {
 public:
  // One recorder per op a model's forward calls; arguments as in ops.h.
  void embedding(const Tensor& out, const Tensor& ids, const Tensor& table, bool reference);
  void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
              bool reference);
  void rms_norm(const Tensor& out, const Tensor& x, const Tensor& w, float eps, bool reference);
  void fused_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps,
                          bool reference);
  void rotary(const Tensor& positions, const Tensor& q, const Tensor& k,
              const Tensor& cos_sin_cache, int64_t head_size, bool is_neox, bool reference);
  void silu_and_mul(const Tensor& out, const Tensor& x, bool reference);
  void gelu_and_mul(const Tensor& out, const Tensor& x, bool approximate_tanh, bool reference);
  void write_kv_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                      const Tensor& value_cache, const Tensor& slot_mapping, bool reference);
  void paged_attention(const Tensor& out, const Tensor& q, const Tensor& key_cache,
                       const Tensor& value_cache, const Tensor& block_table,
                       const Tensor& query_start_loc, const Tensor& seq_lens, float scale,
                       int64_t sliding_window, float logits_soft_cap, bool reference);
  void copy_columns(const Tensor& out, int64_t out_col, const Tensor& x, int64_t x_col,
                    int64_t n);
  void scale(const Tensor& out, const Tensor& x, float s);

  // Runs the recorded ops in order (on the calling thread; each op uses the thread pool).
  void replay() const;
  // Every view whose data lies in [begin, begin + nbytes) moves to the same offset from `to`.
  void relocate(const void* begin, int64_t nbytes, void* to);
  int64_t size() const { return static_cast<int64_t>(ops_.size()); }

 private:
  enum class Kind : uint8_t {
    kEmbedding, kLinear, kRmsNorm, kFusedAddRmsNorm, kRotary, kSiluAndMul, kGeluAndMul,
    kWriteKvCache, kPagedAttention, kCopyColumns, kScale
  };
  struct Op {
    Kind kind;
    bool flag = false;  // is_neox / approximate_tanh
    bool reference = false;
    int num_tensors = 0;
    Tensor t[7];
    float f[2] = {0.0f, 0.0f};
    int64_t i[3] = {0, 0, 0};
  };
  Op& push(Kind kind, bool reference, std::initializer_list<Tensor> tensors);
  std::vector<Op> ops_;
};

}  // namespace vllmx
