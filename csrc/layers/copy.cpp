// Column copies, token scatters and scaling: the small data movements a model's forward used to do in numpy
// (q/k/v split out of a fused projection, Gemma's embedding scale). As native ops they are
// recorded in a step tape and replayed like every other op (csrc/step_tape.h).
#include <cstring>
#include <string>

#include "core/op_table.h"

namespace vllmx {

void copy_columns(const Tensor& out, int64_t out_col, const Tensor& x, int64_t x_col,
                  int64_t n, int64_t heads, int64_t out_head_stride, int64_t x_head_stride) {
  // The shapes and column ranges are the op's contract (csrc/ops.cpp).
  const int64_t item = type_traits(x.dtype).type_size, rows = x.shape[0];
  char* o = static_cast<char*>(out.data) + out_col * item;
  const char* s = static_cast<const char*>(x.data) + x_col * item;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(o + (r * out.stride[0] + h * out_head_stride) * item,
                  s + (r * x.stride[0] + h * x_head_stride) * item,
                  static_cast<size_t>(n * item));
}

void scale(const Tensor& out, const Tensor& x, float s) {
  // The dtype match and the sizes are the op's contract (csrc/ops.cpp); the CPU runs f32.
  check_dtype(x, DType::F32, "scale", "x");
  const int64_t n = x.numel();
  const float* xp = x.ptr<float>();
  float* op_ = out.ptr<float>();
  for (int64_t i = 0; i < n; ++i) op_[i] = xp[i] * s;  // one rounding, as numpy's x * s
}

void scatter_tokens(const Tensor& out, const Tensor& dst, const Tensor& tokens,
                    const Tensor& src) {
  // dtypes and lengths are the op's contract (csrc/ops.cpp); indices out of range are skipped,
  // as on the GPU.
  const int32_t* d = dst.ptr<int32_t>();
  const int32_t* s = src.ptr<int32_t>();
  const int32_t* tok = tokens.ptr<int32_t>();
  int32_t* o = out.ptr<int32_t>();
  const int64_t n_out = out.shape[0], n_tok = tokens.shape[0];
  for (int64_t i = 0; i < dst.shape[0]; ++i)
    if (d[i] >= 0 && d[i] < n_out && s[i] >= 0 && s[i] < n_tok) o[d[i]] = tok[s[i]];
}

VLLMX_KERNEL(copy_columns, kCPU, copy_columns);
VLLMX_KERNEL(scatter_tokens, kCPU, scatter_tokens);
VLLMX_KERNEL(scale, kCPU, scale);

}  // namespace vllmx
