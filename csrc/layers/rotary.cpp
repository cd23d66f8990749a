// Rotary position embedding from a precomputed cos/sin cache (vLLM's design: the scaling
// variants — linear, dynamic NTK, llama3, yarn — only change the cache, built in Python).
#include "core/op_table.h"

namespace vllmx {

namespace {

void rotate_head(float* x, const float* cos, const float* sin, int64_t half, bool is_neox) {
  if (is_neox) {  // rotate the two halves of the rotary dims
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * cos[i] - b * sin[i];
      x[i + half] = b * cos[i] + a * sin[i];
    }
  } else {  // gptj: rotate interleaved pairs
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * cos[i] - b * sin[i];
      x[2 * i + 1] = b * cos[i] + a * sin[i];
    }
  }
}

}  // namespace

void rotary(const Tensor& positions, const Tensor& q, const Tensor& k, const Tensor& cache,
            int64_t head_size, bool is_neox, bool reference) {
  const char* op = "rotary";
  (void)reference;  // elementwise: the plain loop is both the reference and the fast path
  check_dtype(positions, DType::I32, op, "positions");
  check_dtype(q, DType::F32, op, "q");
  check_dtype(cache, DType::F32, op, "cos_sin_cache");
  check_ndim(positions, 1, op, "positions");
  check_ndim(q, 2, op, "q");
  check_ndim(cache, 2, op, "cos_sin_cache");
  const int64_t t = positions.shape[0], rot_dim = cache.shape[1], max_pos = cache.shape[0];
  VLLMX_CHECK(head_size > 0 && q.shape[1] % head_size == 0, op,
        "q " + q.str() + " is not a whole number of heads of " + std::to_string(head_size));
  VLLMX_CHECK(q.shape[0] == t, op, "q " + q.str() + " and positions " + positions.str() + " disagree");
  VLLMX_CHECK(rot_dim % 2 == 0 && rot_dim <= head_size, op,
        "cos_sin_cache " + cache.str() + " rotary dim must be even and <= head_size");
  if (k.defined()) {
    check_dtype(k, DType::F32, op, "k");
    VLLMX_CHECK(k.ndim == 2 && k.shape[0] == t && k.shape[1] % head_size == 0, op,
          "k " + k.str() + " must be [T, nk * head_size]");
  }
  const int32_t* pos = positions.ptr<int32_t>();
  for (int64_t i = 0; i < t; ++i)
    VLLMX_CHECK(pos[i] >= 0 && pos[i] < max_pos, op,
          "position " + std::to_string(pos[i]) + " outside the rotary cache of " +
              std::to_string(max_pos));
  const int64_t half = rot_dim / 2;
  const int64_t nq = q.shape[1] / head_size, nk = k.defined() ? k.shape[1] / head_size : 0;
  float* qp = q.ptr<float>();
  float* kp = k.defined() ? k.ptr<float>() : nullptr;
  const float* cp = cache.ptr<float>();
#pragma omp parallel for if (t > 8) schedule(static)
  for (int64_t i = 0; i < t; ++i) {
    const float* cos = cp + pos[i] * rot_dim;
    const float* sin = cos + half;
    for (int64_t h = 0; h < nq; ++h) rotate_head(qp + i * q.shape[1] + h * head_size, cos, sin, half, is_neox);
    for (int64_t h = 0; h < nk; ++h) rotate_head(kp + i * k.shape[1] + h * head_size, cos, sin, half, is_neox);
  }
}

VLLMX_KERNEL(rotary, kCPU, rotary);

}  // namespace vllmx
