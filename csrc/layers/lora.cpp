// add_lora_linear on the CPU (vLLM's punica add_lora_linear). Contract in csrc/ops.def.
//
// The rows are grouped by adapter slot (a counting sort, stable in t; rows of slot -1 skipped),
// each slot's rows gathered into one block and run through the linear kernel twice (its A, then
// its B), and the product added into their rows of y: the sgmv shape, so a slot's matrices are
// read once for all its rows. Linear computes a row from that row alone (linear.cpp), so a
// row's result is the same whatever else the batch holds. The slots live in the op's inputs,
// not in the call's shape: a step tape (step_tape.h) records the op once and replays it with
// whatever adapters the rows have then.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/op_table.h"
#include "layers/cpu_kernels.h"
#include "repack/repack.h"

namespace vllmx {

namespace {

// Rows [n0, n1) of a [N, r] matrix (one slot of lora_b): a slice's own matrix, in panels where
// the caller packed it so.
Tensor row_range(const Tensor& w, int64_t n0, int64_t n1) {
  Tensor v = w;
  v.data = static_cast<uint8_t*>(w.data) + n0 * w.stride[0] * type_traits(w.dtype).type_size;
  v.shape[0] = n1 - n0;
  return v;
}

// Columns [c0, c0 + n) of a row-major f32 [rows, cols] buffer.
Tensor columns(float* data, int64_t rows, int64_t cols, int64_t c0, int64_t n) {
  Tensor v = f32_matrix(data + c0, rows, n);
  v.stride[0] = cols;
  return v;
}

void add_lora_linear(const Tensor& y, const Tensor& x, const Tensor& lora_a,
                     const Tensor& lora_b, const Tensor& lora_indices,
                     const Tensor& output_slices, bool reference) {
  const char* op = "add_lora_linear";
  check_dtype(x, DType::F32, op, "x");
  check_dtype(y, DType::F32, op, "y");
  for (const auto& [w, name] : {std::pair{&lora_a, "lora_a"}, std::pair{&lora_b, "lora_b"}}) {
    const DType d = is_packed(w->dtype) ? packed_base(w->dtype) : w->dtype;
    VLLMX_CHECK(d == DType::F32 || d == DType::F16 || d == DType::BF16, op,
                std::string(name) + " must be f32, f16 or bf16 (or their 16-row panels), got " +
                    w->str());
  }
  const int64_t T = x.shape[0], K = x.shape[1], N = y.shape[1];
  const int64_t L = lora_a.shape[0], R = lora_a.shape[1], r = lora_b.shape[2];
  const int64_t S = output_slices.shape[0] - 1;
  std::vector<int64_t> o(static_cast<size_t>(S + 1));
  for (int64_t i = 0; i <= S; ++i)
    o[i] = output_slices.ptr<int32_t>()[i * output_slices.stride[0]];
  const int32_t* idx = lora_indices.ptr<int32_t>();
  const int64_t is = lora_indices.stride[0];

  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = idx[t * is];
    if (s < -1 || s >= L)
      fail(op, "lora_indices[" + std::to_string(t) + "] = " + std::to_string(s) +
                   " is neither -1 (no adapter) nor a slot of lora_a " + lora_a.str());
  }
  // Rows of slot s: rows[offsets[s] .. offsets[s + 1]).
  std::vector<int64_t> offsets, rows;
  const int64_t max_rows = group_by_bucket(
      T, L, [&](int64_t t) { return idx[t * is]; }, offsets, rows);
  if (max_rows == 0) return;

  float* xg = f32_scratch(0, static_cast<size_t>(max_rows * K));  // the slot's rows of x
  float* h = f32_scratch(1, static_cast<size_t>(max_rows * R));   // their x A^T
  float* p = f32_scratch(2, static_cast<size_t>(max_rows * N));   // their x A^T B^T
  const float* xp = x.ptr<float>();
  float* yp = y.ptr<float>();
  const int64_t xs = x.stride[0], ys = y.stride[0];
  for (int64_t s = 0; s < L; ++s) {
    const int64_t r0 = offsets[s], n = offsets[s + 1] - r0;
    if (n == 0) continue;
    for (int64_t r = 0; r < n; ++r) std::copy_n(xp + rows[r0 + r] * xs, K, xg + r * K);
    linear(f32_matrix(h, n, R), f32_matrix(xg, n, K), stacked_view(lora_a, s), Tensor{},
           reference);
    const Tensor b = stacked_view(lora_b, s);
    for (int64_t i = 0; i < S; ++i)
      linear(columns(p, n, N, o[i], o[i + 1] - o[i]), columns(h, n, R, i * r, r),
             row_range(b, o[i], o[i + 1]), Tensor{}, reference);
    for (int64_t r = 0; r < n; ++r) {
      float* yr = yp + rows[r0 + r] * ys;
      const float* pr = p + r * N;
      for (int64_t j = 0; j < N; ++j) yr[j] += pr[j];
    }
  }
}

}  // namespace

VLLMX_KERNEL(add_lora_linear, kCPU, add_lora_linear);

}  // namespace vllmx
