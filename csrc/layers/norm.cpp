// RMSNorm and LayerNorm, each with vLLM's fused residual add. Rows are independent and each
// row's sums are taken in a fixed order, so a row's result never depends on the batch around it.
#include <cmath>

#include "core/op_table.h"

namespace vllmx {

namespace {

void check_norm_args(const char* op, const Tensor& x, const Tensor& w) {
  check_dtype(x, DType::F32, op, "x");
  check_dtype(w, DType::F32, op, "weight");
  check_ndim(x, 2, op, "x");
  check_ndim(w, 1, op, "weight");
  VLLMX_CHECK(w.shape[0] == x.shape[1], op, "weight " + w.str() + " does not match x " + x.str());
}

// Sum of squares with 8 independent accumulators (vectorises; fixed order per row).
inline float sum_squares(const float* x, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j] * x[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

inline void norm_row(float* out, const float* x, const float* w, int64_t n, float eps) {
  const float inv = 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

inline void norm_row_reference(float* out, const float* x, const float* w, int64_t n, float eps) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(s / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

// Sum with 8 independent accumulators, as sum_squares.
inline float sum8(const float* x, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += x[i];
  return s;
}

// Sum of (x - mean)^2: two passes, so that a large mean does not cancel the variance away.
inline float centered_sum_squares(const float* x, int64_t n, float mean) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const float d = x[i + j] - mean;
      acc[j] += d * d;
    }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return s;
}

// out may alias x (each element is read before it is written). b may be null.
inline void layer_norm_row(float* out, const float* x, const float* w, const float* b, int64_t n,
                           float eps) {
  const float mean = sum8(x, n) / static_cast<float>(n);
  const float inv =
      1.0f / std::sqrt(centered_sum_squares(x, n, mean) / static_cast<float>(n) + eps);
  if (b != nullptr)
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - mean) * inv * w[i] + b[i];
  else
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - mean) * inv * w[i];
}

inline void layer_norm_row_reference(float* out, const float* x, const float* w, const float* b,
                                     int64_t n, float eps) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  const double mean = s / static_cast<double>(n);
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += (x[i] - mean) * (x[i] - mean);
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>((x[i] - mean) * inv * w[i] + (b != nullptr ? b[i] : 0.0f));
}

// The CPU's own checks (the shapes are the op's contract, csrc/ops.cpp): f32 throughout.
void check_layer_norm_dtypes(const char* op, const Tensor& x, const Tensor& w, const Tensor& b) {
  check_dtype(x, DType::F32, op, "x");
  check_dtype(w, DType::F32, op, "w");
  if (b.defined()) check_dtype(b, DType::F32, op, "b");
}

}  // namespace

void rms_norm(const Tensor& out, const Tensor& x, const Tensor& w, float eps, bool reference) {
  check_norm_args("rms_norm", x, w);
  check_dtype(out, DType::F32, "rms_norm", "out");
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == x.shape[0] && out.shape[1] == x.shape[1], "rms_norm",
        "out " + out.str() + " does not match x " + x.str());
  const int64_t rows = x.shape[0], n = x.shape[1];
  const float* xp = x.ptr<float>();
  const float* wp = w.ptr<float>();
  float* op = out.ptr<float>();
#pragma omp parallel for if (rows > 4) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    if (reference)
      norm_row_reference(op + r * n, xp + r * n, wp, n, eps);
    else
      norm_row(op + r * n, xp + r * n, wp, n, eps);
  }
}

void fused_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps,
                        bool reference) {
  check_norm_args("fused_add_rms_norm", x, w);
  check_dtype(residual, DType::F32, "fused_add_rms_norm", "residual");
  VLLMX_CHECK(residual.ndim == 2 && residual.shape[0] == x.shape[0] && residual.shape[1] == x.shape[1],
        "fused_add_rms_norm", "residual " + residual.str() + " does not match x " + x.str());
  const int64_t rows = x.shape[0], n = x.shape[1];
  float* xp = x.ptr<float>();
  float* rp = residual.ptr<float>();
  const float* wp = w.ptr<float>();
#pragma omp parallel for if (rows > 4) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = xp + r * n;
    float* rr = rp + r * n;
    for (int64_t i = 0; i < n; ++i) rr[i] += xr[i];
    if (reference)
      norm_row_reference(xr, rr, wp, n, eps);
    else
      norm_row(xr, rr, wp, n, eps);
  }
}

// Rows of G groups of D values (w [D] shared, or [G, D]); each (row, group) on its own.
void layer_norm(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                bool reference) {
  check_layer_norm_dtypes("layer_norm", x, w, b);
  const int64_t d = w.shape[w.ndim - 1], groups = x.shape[1] / d;
  const int64_t units = x.shape[0] * groups, w_step = w.ndim == 2 ? d : 0;
  const float* xp = x.ptr<float>();
  const float* wp = w.ptr<float>();
  const float* bp = b.defined() ? b.ptr<float>() : nullptr;
  float* op = out.ptr<float>();
#pragma omp parallel for if (units > 4 && units * d > 4096) schedule(static)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t g = u % groups;
    const float* wg = wp + g * w_step;
    const float* bg = bp != nullptr ? bp + g * w_step : nullptr;
    if (reference)
      layer_norm_row_reference(op + u * d, xp + u * d, wg, bg, d, eps);
    else
      layer_norm_row(op + u * d, xp + u * d, wg, bg, d, eps);
  }
}

void fused_add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& w,
                          const Tensor& b, float eps, bool reference) {
  check_layer_norm_dtypes("fused_add_layer_norm", x, w, b);
  check_dtype(residual, DType::F32, "fused_add_layer_norm", "residual");
  const int64_t rows = x.shape[0], n = x.shape[1];
  float* xp = x.ptr<float>();
  float* rp = residual.ptr<float>();
  const float* wp = w.ptr<float>();
  const float* bp = b.defined() ? b.ptr<float>() : nullptr;
#pragma omp parallel for if (rows > 4) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = xp + r * n;
    float* rr = rp + r * n;
    for (int64_t i = 0; i < n; ++i) rr[i] += xr[i];
    if (reference)
      layer_norm_row_reference(xr, rr, wp, bp, n, eps);
    else
      layer_norm_row(xr, rr, wp, bp, n, eps);
  }
}

VLLMX_KERNEL(rms_norm, kCPU, rms_norm);
VLLMX_KERNEL(fused_add_rms_norm, kCPU, fused_add_rms_norm);
VLLMX_KERNEL(layer_norm, kCPU, layer_norm);
VLLMX_KERNEL(fused_add_layer_norm, kCPU, fused_add_layer_norm);

}  // namespace vllmx
