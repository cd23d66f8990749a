// CPU kernels that other CPU kernels compose (fused_experts runs each expert's rows through
// linear and silu_and_mul, or per_token_group_quant_fp8 and scaled_mm for fp8 experts; add_lora_linear each adapter's rows through linear), and their
// helpers. Each is the op table's kernel, with its checks; reference selects
// the scalar twin.
#pragma once
#include <algorithm>
#include <vector>

#include "core/tensor.h"
#include "core/dtype.h"

namespace vllmx {

// A per-thread f32 buffer for one role (slot) of an op's temporaries: grows, never shrinks, so a
// warm call allocates nothing. An op is done with it before it returns.
inline float* f32_scratch(int slot, size_t floats) {
  static thread_local std::vector<float> buf[4];
  if (buf[slot].size() < floats) buf[slot].resize(floats + floats / 4);
  return buf[slot].data();
}

// A row-major f32 [rows, cols] view of data.
inline Tensor f32_matrix(float* data, int64_t rows, int64_t cols) {
  Tensor t;
  t.data = data;
  t.dtype = DType::F32;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.stride[0] = cols;
  t.stride[1] = 1;
  return t;
}

// Items 0 .. n-1 grouped by bucket (a counting sort, stable in item order; an item whose bucket
// is negative is left out): bucket b's items are members[offsets[b] .. offsets[b + 1]). Returns
// the largest bucket's size. bucket(i) is in [-1, buckets), checked by the caller.
template <typename Bucket>
int64_t group_by_bucket(int64_t n, int64_t buckets, Bucket bucket, std::vector<int64_t>& offsets,
                        std::vector<int64_t>& members) {
  offsets.assign(static_cast<size_t>(buckets + 1), 0);
  for (int64_t i = 0; i < n; ++i)
    if (const int64_t b = bucket(i); b >= 0) ++offsets[static_cast<size_t>(b) + 1];
  int64_t largest = 0;
  for (int64_t b = 0; b < buckets; ++b) {
    largest = std::max(largest, offsets[b + 1]);
    offsets[b + 1] += offsets[b];
  }
  members.resize(static_cast<size_t>(offsets[buckets]));
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    if (const int64_t b = bucket(i); b >= 0) members[next[b]++] = i;
  return largest;
}


void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
            bool reference);
void silu_and_mul(const Tensor& out, const Tensor& x, bool reference);
void relu2(const Tensor& out, const Tensor& x, bool reference);
void swigluoai_and_mul(const Tensor& out, const Tensor& x, float alpha, float limit,
                       bool reference);
void per_token_group_quant_fp8(const Tensor& out_q, const Tensor& out_s, const Tensor& x,
                               bool reference);
void scaled_mm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_s,
               const Tensor& b_s, const Tensor& bias, bool reference);
void fp8_linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& w_s,
                const Tensor& bias, bool reference);

}  // namespace vllmx
