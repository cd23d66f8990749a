#include "core/kernel_pragmas.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/op_table.h"
#include "layers/cpu_kernels.h"
#include "core/cpu_features.h"
#include "core/simd_math.h"

namespace vllmx {

namespace {
#if VLLMX_X86
// One row of SwiGLU: g / (1 + exp(-g)) * u with the ~1 ulp exp512 (scalar std::exp was most of
// this op, which every Llama-family layer runs over its intermediate width).
VLLMX_TARGET_AVX512 void silu_mul_row_512(const float* g, const float* u, float* o, int64_t d) {
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = lanes512(d - i);
    const __m512 r = silu512(_mm512_maskz_loadu_ps(m, g + i));
    _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

// The same at 8 lanes, for CPUs with AVX2 but not AVX-512.
VLLMX_TARGET_AVX2 void silu_mul_row_256(const float* g, const float* u, float* o, int64_t d) {
  for (int64_t i = 0; i < d; i += 8) {
    const __m256i m = lanes256(d - i);
    const __m256 r = silu256(_mm256_maskload_ps(g + i, m));
    _mm256_maskstore_ps(o + i, m, _mm256_mul_ps(r, _mm256_maskload_ps(u + i, m)));
  }
}
#endif
}  // namespace

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
  const bool fast512 = VLLMX_X86 && simd_level() >= 2;
  const bool fast256 = VLLMX_X86 && simd_level() == 1;
#pragma omp parallel for if (rows * d > 65536) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = xp + r * 2 * d;
    const float* u = g + d;
    float* o = op_ + r * d;
    if (reference) {
      for (int64_t i = 0; i < d; ++i)
        o[i] = static_cast<float>(g[i] / (1.0 + std::exp(-static_cast<double>(g[i])))) * u[i];
    } else if (fast512) {
#if VLLMX_X86
      silu_mul_row_512(g, u, o, d);
#endif
    } else if (fast256) {
#if VLLMX_X86
      silu_mul_row_256(g, u, o, d);
#endif
    } else {
      for (int64_t i = 0; i < d; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  }
}

// Squared ReLU (Nemotron-H's MLPs and experts): out = max(x, 0)^2, exact in f32 either way.
void relu2(const Tensor& out, const Tensor& x, bool reference) {
  (void)reference;
  check_dtype(x, DType::F32, "relu2", "x");
  check_dtype(out, DType::F32, "relu2", "out");
  const int64_t rows = x.shape[0], n = x.shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.ptr<float>() + r * x.stride[0];
    float* o = out.ptr<float>() + r * out.stride[0];
    for (int64_t i = 0; i < n; ++i) {
      const float v = xr[i] > 0.0f ? xr[i] : 0.0f;
      o[i] = v * v;
    }
  }
}

// gpt-oss's clamped SwiGLU (vLLM's swigluoai_and_mul): the gate clamped above at limit, the up
// half to [-limit, limit], then gate * sigmoid(alpha * gate) * (up + 1).
void swigluoai_and_mul(const Tensor& out, const Tensor& x, float alpha, float limit,
                       bool reference) {
  const char* op = "swigluoai_and_mul";
  check_dtype(x, DType::F32, op, "x");
  check_dtype(out, DType::F32, op, "out");
  const int64_t rows = x.shape[0], d = out.shape[1];
  const float* xp = x.ptr<float>();
  float* op_ = out.ptr<float>();
  const int64_t xs = x.stride[0], os = out.stride[0];
#pragma omp parallel for if (rows * d > 65536) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = xp + r * xs;
    const float* u = g + d;
    float* o = op_ + r * os;
    for (int64_t i = 0; i < d; ++i) {
      const float gc = std::min(g[i], limit), uc = std::clamp(u[i], -limit, limit);
      if (reference)
        o[i] = static_cast<float>(gc / (1.0 + std::exp(-static_cast<double>(alpha) * gc)) *
                                  (static_cast<double>(uc) + 1.0));
      else
        o[i] = gc / (1.0f + std::exp(-alpha * gc)) * (uc + 1.0f);
    }
  }
}

}  // namespace vllmx

namespace vllmx {

namespace {

#if VLLMX_X86
// One row of tanh-GELU, times u when u is given (GeGLU): 0.5 v (1 + tanh(y)) = v / (1 + exp(-2y)),
// y = c (v + 0.044715 v^3), with the ~1 ulp exp512 (scalar std::tanh made this op a third of a
// Gemma prefill).
VLLMX_TARGET_AVX512 void gelu_tanh_row_512(const float* g, const float* u, float* o, int64_t d,
                                           float c) {
  const __m512 k3 = _mm512_set1_ps(0.044715f), m2c = _mm512_set1_ps(-2.0f * c);
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = lanes512(d - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(k3, v), _mm512_mul_ps(v, v), v);
    const __m512 e = exp512(_mm512_mul_ps(m2c, y), -103.0f);
    __m512 r = _mm512_div_ps(v, _mm512_add_ps(one, e));
    if (u != nullptr) r = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, u + i));
    _mm512_mask_storeu_ps(o + i, m, r);
  }
}

// One row of exact GELU, times u when u is given: 0.5 v (1 + erf(v / sqrt 2)) with the rational
// erf512 (scalar erff was a tenth of a BERT encoder's time).
VLLMX_TARGET_AVX512 void gelu_erf_row_512(const float* g, const float* u, float* o, int64_t d,
                                          float c) {
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f), vc = _mm512_set1_ps(c);
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = lanes512(d - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 e = erf512(_mm512_mul_ps(v, vc));
    __m512 r = _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, e));
    if (u != nullptr) r = _mm512_mul_ps(r, _mm512_maskz_loadu_ps(m, u + i));
    _mm512_mask_storeu_ps(o + i, m, r);
  }
}

// The two GELU rows at 8 lanes (AVX2 without AVX-512).
VLLMX_TARGET_AVX2 void gelu_tanh_row_256(const float* g, const float* u, float* o, int64_t d,
                                         float c) {
  const __m256 k3 = _mm256_set1_ps(0.044715f), m2c = _mm256_set1_ps(-2.0f * c);
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < d; i += 8) {
    const __m256i m = lanes256(d - i);
    const __m256 v = _mm256_maskload_ps(g + i, m);
    const __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(k3, v), _mm256_mul_ps(v, v), v);
    const __m256 e = exp256(_mm256_mul_ps(m2c, y), -103.0f);
    __m256 r = _mm256_div_ps(v, _mm256_add_ps(one, e));
    if (u != nullptr) r = _mm256_mul_ps(r, _mm256_maskload_ps(u + i, m));
    _mm256_maskstore_ps(o + i, m, r);
  }
}

VLLMX_TARGET_AVX2 void gelu_erf_row_256(const float* g, const float* u, float* o, int64_t d,
                                        float c) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), vc = _mm256_set1_ps(c);
  for (int64_t i = 0; i < d; i += 8) {
    const __m256i m = lanes256(d - i);
    const __m256 v = _mm256_maskload_ps(g + i, m);
    const __m256 e = erf256(_mm256_mul_ps(v, vc));
    __m256 r = _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, e));
    if (u != nullptr) r = _mm256_mul_ps(r, _mm256_maskload_ps(u + i, m));
    _mm256_maskstore_ps(o + i, m, r);
  }
}

// A run of cap * tanh(x / cap): 1 - 2 / (1 + e^(2x/cap)), which saturates to +-1 at exp512's
// clamps (88.7 and lo).
VLLMX_TARGET_AVX512 void softcap_run_512(float* v, int64_t n, float cap) {
  const __m512 k = _mm512_set1_ps(2.0f / cap), c = _mm512_set1_ps(cap);
  const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes512(n - i);
    const __m512 e = exp512(_mm512_mul_ps(k, _mm512_maskz_loadu_ps(m, v + i)), -103.0f);
    const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(one, e)));
    _mm512_mask_storeu_ps(v + i, m, _mm512_mul_ps(c, t));
  }
}
#endif

}  // namespace

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654, kInvSqrt2 = 0.7071067811865476;

// One row of gelu(g), times u when u is given (GeGLU). Exact GELU is x * Phi(x) =
// 0.5 x (1 + erf(x / sqrt 2)); the tanh form is PyTorch's approximate="tanh" (gelu_pytorch_tanh,
// GPT-2's gelu_new).
void gelu_row(const float* g, const float* u, float* o, int64_t d, bool approximate_tanh,
              bool reference, int isa) {
  const bool fast512 = isa >= 2, fast256 = isa == 1;
  if (reference) {
    for (int64_t i = 0; i < d; ++i) {
      const double v = g[i];
      const double t = approximate_tanh ? std::tanh(kSqrt2OverPi * (v + 0.044715 * v * v * v))
                                        : std::erf(v * kInvSqrt2);
      o[i] = static_cast<float>(0.5 * v * (1.0 + t) * (u != nullptr ? u[i] : 1.0f));
    }
  } else if (approximate_tanh && fast512) {
#if VLLMX_X86
    gelu_tanh_row_512(g, u, o, d, static_cast<float>(kSqrt2OverPi));
#endif
  } else if (fast512 || fast256) {
#if VLLMX_X86
    if (approximate_tanh)
      gelu_tanh_row_256(g, u, o, d, static_cast<float>(kSqrt2OverPi));
    else if (fast512)
      gelu_erf_row_512(g, u, o, d, static_cast<float>(kInvSqrt2));
    else
      gelu_erf_row_256(g, u, o, d, static_cast<float>(kInvSqrt2));
#endif
  } else if (approximate_tanh) {
    const float c = static_cast<float>(kSqrt2OverPi);
    for (int64_t i = 0; i < d; ++i) {
      const float v = g[i];
      const float r = 0.5f * v * (1.0f + std::tanh(c * (v + 0.044715f * v * v * v)));
      o[i] = u != nullptr ? r * u[i] : r;
    }
  } else {
    const float c = static_cast<float>(kInvSqrt2);
    for (int64_t i = 0; i < d; ++i) {
      const float r = 0.5f * g[i] * (1.0f + std::erf(g[i] * c));
      o[i] = u != nullptr ? r * u[i] : r;
    }
  }
}

}  // namespace

// GeGLU: gelu(x[:, :I]) * x[:, I:].
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
  const int isa = VLLMX_X86 ? simd_level() : 0;
#pragma omp parallel for if (rows * d > 65536) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    gelu_row(xp + r * 2 * d, xp + r * 2 * d + d, op_ + r * d, d, approximate_tanh, reference,
             isa);
}

// gelu(x) elementwise (the shapes are the op's contract, csrc/ops.cpp; the CPU runs f32).
void gelu(const Tensor& out, const Tensor& x, bool approximate_tanh, bool reference) {
  check_dtype(x, DType::F32, "gelu", "x");
  check_dtype(out, DType::F32, "gelu", "out");
  const int64_t rows = x.shape[0], d = x.shape[1];
  const float* xp = x.ptr<float>();
  float* op_ = out.ptr<float>();
  const int isa = VLLMX_X86 ? simd_level() : 0;
#pragma omp parallel for if (rows * d > 65536) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    gelu_row(xp + r * d, nullptr, op_ + r * d, d, approximate_tanh, reference, isa);
}

// cap * tanh(x / cap) over a logits tensor (host arrays are contiguous: it is one flat run of
// elements, split into chunks so that a single 262k-wide row uses every thread). The AVX-512
// path is tanh(y) = 1 - 2 / (1 + e^2y) with the ~1 ulp exp512: scalar tanhf took 2.9 ms a
// Gemma row, several times numpy.
void softcap(const Tensor& x, float cap, bool reference) {
  // x's shape and cap are the op's contract (csrc/ops.cpp); the CPU runs f32.
  check_dtype(x, DType::F32, "softcap", "x");
  const int64_t n = x.numel();
  constexpr int64_t kChunk = 8192;
  float* p = x.ptr<float>();
  const float inv = 1.0f / cap;
  const bool fast512 = VLLMX_X86 && simd_level() >= 2;
#pragma omp parallel for if (n > 65536) schedule(static)
  for (int64_t c = 0; c < n; c += kChunk) {
    float* v = p + c;
    const int64_t m = std::min(kChunk, n - c);
    if (reference) {
      for (int64_t i = 0; i < m; ++i)
        v[i] = static_cast<float>(cap * std::tanh(static_cast<double>(v[i]) / cap));
    } else if (fast512) {
#if VLLMX_X86
      softcap_run_512(v, m, cap);
#endif
    } else {
      for (int64_t i = 0; i < m; ++i) v[i] = cap * std::tanh(v[i] * inv);
    }
  }
}

VLLMX_KERNEL(silu_and_mul, kCPU, silu_and_mul);
VLLMX_KERNEL(swigluoai_and_mul, kCPU, swigluoai_and_mul);
VLLMX_KERNEL(relu2, kCPU, relu2);
VLLMX_KERNEL(gelu_and_mul, kCPU, gelu_and_mul);
VLLMX_KERNEL(gelu, kCPU, gelu);
VLLMX_KERNEL(softcap, kCPU, softcap);

}  // namespace vllmx
