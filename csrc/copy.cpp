// Column copies and scaling: the small data movements a model's forward used to do in numpy
// (q/k/v split out of a fused projection, Gemma's embedding scale). As native ops they are
// recorded in a step tape and replayed like every other op (csrc/step_tape.h).
#include <cstring>
#include <string>

#include "ops.h"

namespace vllmx {

void copy_columns(const Tensor& out, int64_t out_col, const Tensor& x, int64_t x_col,
                  int64_t n) {
  const char* op = "copy_columns";
  VLLMX_CHECK(out.defined() && x.defined(), op, "missing tensor");
  check_ndim(out, 2, op, "out");
  check_ndim(x, 2, op, "x");
  const TypeTraits& tt = type_traits(x.dtype);
  VLLMX_CHECK(out.dtype == x.dtype && !tt.quantized, op,
              "out " + out.str() + " and x " + x.str() + " must have one dense dtype");
  VLLMX_CHECK(out.shape[0] == x.shape[0], op,
              "out " + out.str() + " and x " + x.str() + " must have the same rows");
  VLLMX_CHECK(n >= 0 && out_col >= 0 && x_col >= 0 && out_col + n <= out.shape[1] &&
                  x_col + n <= x.shape[1],
              op, "columns [" + std::to_string(x_col) + ", +" + std::to_string(n) + ") of x " +
                      x.str() + " -> [" + std::to_string(out_col) + ", +" + std::to_string(n) +
                      ") of out " + out.str() + " are out of range");
  const int64_t item = tt.type_size, rows = x.shape[0];
  char* o = static_cast<char*>(out.data) + out_col * item;
  const char* s = static_cast<const char*>(x.data) + x_col * item;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(o + r * out.stride[0] * item, s + r * x.stride[0] * item,
                static_cast<size_t>(n * item));
}

void scale(const Tensor& out, const Tensor& x, float s) {
  const char* op = "scale";
  VLLMX_CHECK(out.defined() && x.defined(), op, "missing tensor");
  check_dtype(out, DType::F32, op, "out");
  check_dtype(x, DType::F32, op, "x");
  VLLMX_CHECK(out.numel() == x.numel(), op,
              "out " + out.str() + " and x " + x.str() + " must have as many elements");
  const int64_t n = x.numel();
  const float* xp = x.ptr<float>();
  float* op_ = out.ptr<float>();
  for (int64_t i = 0; i < n; ++i) op_[i] = xp[i] * s;  // one rounding, as numpy's x * s
}

}  // namespace vllmx
