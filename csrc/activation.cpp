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
  VLLMX_CHECK(out.shape[0] == rows && x.shape[1] == 2 * d, op,
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

namespace vllmx {

// GeGLU. Exact GELU is x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); the tanh form is PyTorch's
// approximate="tanh" (Gemma's gelu_pytorch_tanh).
void gelu_and_mul(const Tensor& out, const Tensor& x, bool approximate_tanh, bool reference) {
  const char* op = "gelu_and_mul";
  check_dtype(x, DType::F32, op, "x");
  check_dtype(out, DType::F32, op, "out");
  check_ndim(x, 2, op, "x");
  check_ndim(out, 2, op, "out");
  const int64_t rows = x.shape[0], d = out.shape[1];
  VLLMX_CHECK(out.shape[0] == rows && x.shape[1] == 2 * d, op,
        "x " + x.str() + " must be [T, 2 * I] for out " + out.str());
  const float* xp = x.ptr<float>();
  float* op_ = out.ptr<float>();
  constexpr double kSqrt2OverPi = 0.7978845608028654, kInvSqrt2 = 0.7071067811865476;
#pragma omp parallel for if (rows * d > 65536) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = xp + r * 2 * d;
    const float* u = g + d;
    float* o = op_ + r * d;
    if (reference) {
      for (int64_t i = 0; i < d; ++i) {
        const double v = g[i];
        const double t = approximate_tanh ? std::tanh(kSqrt2OverPi * (v + 0.044715 * v * v * v))
                                          : std::erf(v * kInvSqrt2);
        o[i] = static_cast<float>(0.5 * v * (1.0 + t) * u[i]);
      }
    } else if (approximate_tanh) {
      const float c = static_cast<float>(kSqrt2OverPi);
      for (int64_t i = 0; i < d; ++i) {
        const float v = g[i];
        o[i] = 0.5f * v * (1.0f + std::tanh(c * (v + 0.044715f * v * v * v))) * u[i];
      }
    } else {
      const float c = static_cast<float>(kInvSqrt2);
      for (int64_t i = 0; i < d; ++i) o[i] = 0.5f * g[i] * (1.0f + std::erf(g[i] * c)) * u[i];
    }
  }
}

}  // namespace vllmx
