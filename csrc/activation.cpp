#include <cmath>

#include "ops.h"

namespace vllmx {

void silu_and_mul(const Tensor& out, const Tensor& x, bool reference) {
  const char* op = "silu_and_mul";
  check_dtype(x, DType::F32, op, "x");
  check_dtype(out, DType::F32, op, "out");
  check_ndim(x, 2, op, "x");
  check_ndim(out, 2, op, "out");
  const int64_t rows = x.shape[0], d = out.shape[1];
  check(out.shape[0] == rows && x.shape[1] == 2 * d, op,
        "x " + x.str() + " must be [T, 2 * I] for out " + out.str());
  const float* xp = x.ptr<float>();
  float* op_ = out.ptr<float>();
#pragma omp parallel for if (rows * d > 65536) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = xp + r * 2 * d;
    const float* u = g + d;
    float* o = op_ + r * d;
    if (reference) {
      for (int64_t i = 0; i < d; ++i)
        o[i] = static_cast<float>(g[i] / (1.0 + std::exp(-static_cast<double>(g[i])))) * u[i];
    } else {
      for (int64_t i = 0; i < d; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  }
}

}  // namespace vllmx
