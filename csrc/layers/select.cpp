// argmax and zero_rows_at_position on the CPU (contracts in csrc/ops.def): a drafter's greedy
// token per row and MTP's first-token rule, as ops so that the GPU keeps them on the device.
#include <algorithm>

#include "core/op_table.h"

namespace vllmx {

namespace {

void argmax(const Tensor& out_ids, const Tensor& x) {
  check_dtype(x, DType::F32, "argmax", "x");
  const int64_t rows = x.shape[0], n = x.shape[1];
  int32_t* out = out_ids.ptr<int32_t>();
#pragma omp parallel for if (rows * n > 65536) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.ptr<float>() + r * x.stride[0];
    out[r * out_ids.stride[0]] = static_cast<int32_t>(std::max_element(row, row + n) - row);
  }
}

void zero_rows_at_position(const Tensor& x, const Tensor& positions, int64_t position) {
  check_dtype(x, DType::F32, "zero_rows_at_position", "x");
  const int32_t* pos = positions.ptr<int32_t>();
  for (int64_t t = 0; t < x.shape[0]; ++t)
    if (pos[t * positions.stride[0]] == position)
      std::fill_n(x.ptr<float>() + t * x.stride[0], x.shape[1], 0.0f);
}

}  // namespace

VLLMX_KERNEL(argmax, kCPU, argmax);
VLLMX_KERNEL(zero_rows_at_position, kCPU, zero_rows_at_position);

}  // namespace vllmx
