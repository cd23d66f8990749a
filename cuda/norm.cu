// The norms on the GPU (contracts in csrc/ops.def; the CPU twins in csrc/layers/norm.cpp):
// rms_norm and layer_norm, each with a fused residual add. Activations are f32, f16 or bf16;
// math is f32, a row's sums by block reductions, and stores round to nearest even.
#include <algorithm>

#include "core/op_table.h"
#include "cuda_ops.h"
#include "cuda_util.cuh"
#include "fp8.cuh"

namespace vllmx::cuda {

namespace {

using detail::block_sum;

// ---- rms_norm ----
template <typename T, typename W>
__global__ void rms_norm_kernel(T* out, const T* x, const W* w, int64_t n, int64_t x_stride,
                                int64_t out_stride, float eps) {
  pdl_begin();
  const T* xr = x + blockIdx.x * x_stride;
  T* orow = out + blockIdx.x * out_stride;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_f32(xr[i]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    orow[i] = from_f32<T>(to_f32(xr[i]) * inv * to_f32(w[i]));
}

// res_out = x + res (stored rounded to T); out = rms_norm(res_out) * w. As in vLLM, the variance
// is taken over the unrounded f32 sum and the normalisation reads the rounded residual. In place
// (out == x, res_out == res: vLLM's fused_add_rms_norm) is safe: a thread only rewrites the
// elements it has read.
template <typename T, typename W>
__global__ void fused_add_rms_norm_kernel(T* out, T* res_out, const T* x, const T* res,
                                          const W* w, int64_t n, int64_t out_stride,
                                          int64_t res_out_stride, int64_t x_stride,
                                          int64_t res_stride, float eps) {
  pdl_begin();
  const T* xr = x + blockIdx.x * x_stride;
  const T* rr = res + blockIdx.x * res_stride;
  T* ro = res_out + blockIdx.x * res_out_stride;
  T* orow = out + blockIdx.x * out_stride;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_f32(xr[i]) + to_f32(rr[i]);
    ss += v * v;
    ro[i] = from_f32<T>(v);
  }
  ss = block_sum(ss);  // (its barrier also orders the residual stores before the reads below)
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    orow[i] = from_f32<T>(to_f32(ro[i]) * inv * to_f32(w[i]));
}

// Where fused_add_rms_norm_vec_kernel's normed values go: stored, rounded to T (add_rms_norm).
template <typename T>
struct StoreRows {
  T* out;
  int64_t stride;
  __device__ __forceinline__ void operator()(int64_t row, int64_t c, const Vec16<T>& v,
                                             bool valid) const {
    if (valid) v.store(out + row * stride + c * Vec16<T>::N);
  }
};

// ... or quantized to fp8 e4m3 (add_rms_norm_quant_fp8): the values rounded to T as StoreRows
// would store them, then each 128-wide group to codes as per_token_group_quant_fp8 quantizes
// the stored row (fp8.cuh), so the codes and scales are those of the two kernels bit for bit.
// A group is kLanes consecutive lanes' chunks (n a multiple of 128: a group is all valid or
// all not); codes [rows, n] q_stride bytes apart, scales [n / 128][s_stride].
template <typename T>
struct QuantRows {
  uint8_t* q;
  int64_t q_stride;
  float* s;
  int64_t s_stride;
  __device__ __forceinline__ void operator()(int64_t row, int64_t c, const Vec16<T>& v,
                                             bool valid) const {
    constexpr int V = Vec16<T>::N, kLanes = kFp8GroupValues / V;
    const unsigned mask = __ballot_sync(0xffffffffu, valid);
    if (!valid) return;
    float y[V], amax = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      y[j] = to_f32(from_f32<T>(v.f[j]));
      amax = fmaxf(amax, fabsf(y[j]));
    }
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o));
    const float scale = fp8_group_scale(amax);
    uint32_t packed[V / 4] = {};
#pragma unroll
    for (int j = 0; j < V; ++j) packed[j / 4] |= fp8_code(y[j], scale) << (8 * (j % 4));
    uint8_t* qp = q + row * q_stride + c * V;
    if constexpr (V == 8)
      *reinterpret_cast<uint2*>(qp) = make_uint2(packed[0], packed[1]);
    else
      *reinterpret_cast<uint32_t*>(qp) = packed[0];
    if (threadIdx.x % kLanes == 0) s[c / kLanes * s_stride + row] = scale;
  }
};

// fused_add_rms_norm_kernel's arithmetic in 16-byte vectors, a thread's chunks held in
// registers between the two passes (kPer chunks of Vec16<T>::N at most, n a multiple of N);
// the normed chunks go to sink (every thread calls it kPer times, valid or not, so that a sink
// may exchange values across lanes).
template <typename T, typename W, int kPer, class Sink>
__global__ void __launch_bounds__(1024)
    fused_add_rms_norm_vec_kernel(Sink sink, T* res_out, const T* x, const T* res, const W* w,
                                  int64_t n, int64_t res_out_stride, int64_t x_stride,
                                  int64_t res_stride, float eps) {
  constexpr int V = Vec16<T>::N;
  pdl_begin();
  const T* xr = x + blockIdx.x * x_stride;
  const T* rr = res + blockIdx.x * res_stride;
  T* ro = res_out + blockIdx.x * res_out_stride;
  const int64_t chunks = n / V;
  Vec16<T> sum[kPer];
  float ss = 0.0f;
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    if (c >= chunks) break;
    Vec16<T> r;
    sum[p].load(xr + c * V);
    r.load(rr + c * V);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = sum[p].f[j] + r.f[j];
      ss += v * v;
      sum[p].f[j] = to_f32(from_f32<T>(v));  // the residual as stored
    }
    sum[p].store(ro + c * V);
  }
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    const bool valid = c < chunks;
    if (valid) {
#pragma unroll
      for (int j = 0; j < V; ++j) sum[p].f[j] = sum[p].f[j] * inv * to_f32(w[c * V + j]);
    }
    sink(blockIdx.x, c, sum[p], valid);
  }
}

// Launches fused_add_rms_norm_vec_kernel over x's rows with sink where every row takes 16-byte
// vectors (res_out, x, res; n a multiple of Vec16<T>::N, at most 4096 of them); false otherwise.
template <typename T, typename W, class Sink>
bool launch_add_rms_norm_vec(const Sink& sink, const Tensor& res_out, const Tensor& x,
                             const Tensor& res, const Tensor& w, float eps) {
  constexpr int V = Vec16<T>::N;
  const int64_t rows = x.shape[0], n = x.shape[1], chunks = n / V;
  if (n % V != 0 || chunks > 4 * 1024 || !vec16_ok<T>(res_out.data, res_out.stride[0]) ||
      !vec16_ok<T>(x.data, x.stride[0]) || !vec16_ok<T>(res.data, res.stride[0]))
    return false;
  // Up to 2 chunks a thread (4 past 2048 chunks).
  const int vthreads =
      static_cast<int>(std::min<int64_t>(1024, ((chunks + 1) / 2 + 31) / 32 * 32));
  auto kernel = chunks <= 2 * 1024 ? fused_add_rms_norm_vec_kernel<T, W, 2, Sink>
                                   : fused_add_rms_norm_vec_kernel<T, W, 4, Sink>;
  launch(kernel, rows, vthreads, 0, stream(), sink, res_out.ptr<T>(), x.ptr<T>(), res.ptr<T>(),
         w.ptr<W>(), n, res_out.stride[0], x.stride[0], res.stride[0], eps);
  return true;
}

// fn(T{}, W{}) with T x's dtype and W the norm weight's: f32, or x's dtype (the ops check which).
template <class Fn>
void dispatch_norm(const Tensor& x, const Tensor& w, const char* op, Fn&& fn) {
  dispatch_float(x.dtype, op, [&](auto xv) {
    if (w.dtype == DType::F32)
      fn(xv, float{});
    else
      fn(xv, decltype(xv){});
  });
}

// ---- layer_norm ----
// One CTA per (row, group) of d values. With res (one group per row), res_out = x + res is
// stored first, rounded to T, and the statistics are those of what was stored (transformers
// norms the rounded sum). The variance takes a second pass over the centred values, as the CPU
// does. In place (out == x, res_out == res: fused_add_layer_norm) is safe: a thread only
// rewrites the elements it has read.
template <typename T, typename W>
__global__ void layer_norm_kernel(T* out, T* res_out, const T* x, const T* res, const W* w,
                                  const W* b, int64_t d, int64_t groups, int64_t w_step,
                                  int64_t out_stride, int64_t res_out_stride, int64_t x_stride,
                                  int64_t res_stride, float eps) {
  pdl_begin();
  const int64_t row = blockIdx.x / groups, g = blockIdx.x % groups;
  const T* src = x + row * x_stride + g * d;
  T* orow = out + row * out_stride + g * d;
  const W* wg = w + g * w_step;
  const W* bg = b != nullptr ? b + g * w_step : nullptr;
  float s = 0.0f;
  if (res != nullptr) {
    const T* rr = res + row * res_stride;
    T* ro = res_out + row * res_out_stride;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const T v = from_f32<T>(to_f32(src[i]) + to_f32(rr[i]));
      ro[i] = v;
      s += to_f32(v);
    }
    src = ro;
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += to_f32(src[i]);
  }
  const float mean = block_sum(s) / static_cast<float>(d);
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float c = to_f32(src[i]) - mean;
    ss += c * c;
  }
  const float inv = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float y = (to_f32(src[i]) - mean) * inv * to_f32(wg[i]);
    if (bg != nullptr) y += to_f32(bg[i]);
    orow[i] = from_f32<T>(y);
  }
}

void check_2d_like(const Tensor& out, const Tensor& x, const char* op) {
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == x.shape[0] && out.shape[1] == x.shape[1], op,
        "out " + out.str() + " does not match x " + x.str());
}

}  // namespace

namespace {
// out = rms_norm(x (+ res)) * w; with res, res_out = x + res. out / res_out may alias x / res.
void norm_impl(const char* op, const Tensor& out, const Tensor& res_out, const Tensor& x,
               const Tensor& res, const Tensor& w, float eps) {
  const bool fused = res.defined();
  check_rows(x, op, "x");
  check_rows(out, op, "out");
  check_on_device(w, op, "weight");
  check_act(x, op, "x");
  check_ndim(x, 2, op, "x");
  check_ndim(w, 1, op, "weight");
  VLLMX_CHECK(w.shape[0] == x.shape[1], op, "weight " + w.str() + " does not match x " + x.str());
  VLLMX_CHECK(out.dtype == x.dtype, op, "out " + out.str() + " must have x's dtype " + x.str());
  check_2d_like(out, x, op);
  if (fused) {
    for (const Tensor* t : {&res, &res_out}) {
      check_rows(*t, op, "residual");
      VLLMX_CHECK(t->dtype == x.dtype, op, "residual " + t->str() + " must have x's dtype " + x.str());
      check_2d_like(*t, x, op);
    }
  }
  VLLMX_CHECK(w.dtype == DType::F32 || w.dtype == x.dtype, op,
        "weight " + w.str() + " must be f32 or x's dtype");
  const int64_t rows = x.shape[0], n = x.shape[1];
  if (rows == 0 || n == 0) return;
  const int threads = threads_for(n / 4);
  dispatch_norm(x, w, op, [&](auto xv, auto wv) {
    using T = decltype(xv);
    using W = decltype(wv);
    if (fused && vec16_ok<T>(out.data, out.stride[0]) &&
        launch_add_rms_norm_vec<T, W>(StoreRows<T>{out.ptr<T>(), out.stride[0]}, res_out, x,
                                      res, w, eps))
      return;
    if (fused)
      launch(fused_add_rms_norm_kernel<T, W>, rows, threads, 0, stream(), out.ptr<T>(),
             res_out.ptr<T>(), x.ptr<T>(), res.ptr<T>(), w.ptr<W>(), n, out.stride[0],
             res_out.stride[0], x.stride[0], res.stride[0], eps);
    else
      launch(rms_norm_kernel<T, W>, rows, threads, 0, stream(), out.ptr<T>(), x.ptr<T>(),
             w.ptr<W>(), n, x.stride[0], out.stride[0], eps);
  });
  check_launch(fused ? "fused_add_rms_norm kernel" : "rms_norm kernel");
}
}  // namespace

void rms_norm(const Tensor& out, const Tensor& x, const Tensor& w, float eps) {
  norm_impl("cuda.rms_norm", out, Tensor{}, x, Tensor{}, w, eps);
}

void fused_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) {
  norm_impl("cuda.fused_add_rms_norm", x, residual, x, residual, w, eps);
}

void add_rms_norm(const Tensor& out, const Tensor& res_out, const Tensor& x, const Tensor& res,
                  const Tensor& w, float eps) {
  norm_impl("cuda.add_rms_norm", out, res_out, x, res, w, eps);
}

bool add_rms_norm_quant_fp8(uint8_t* q, int64_t q_stride, float* s, int64_t s_stride,
                            const Tensor& res_out, const Tensor& x, const Tensor& res,
                            const Tensor& w, float eps) {
  if (!res.defined() || x.shape[0] == 0 || x.shape[1] % kFp8GroupValues != 0) return false;
  bool launched = false;
  dispatch_norm(x, w, "cuda.add_rms_norm_quant_fp8", [&](auto xv, auto wv) {
    using T = decltype(xv);
    launched = launch_add_rms_norm_vec<T, decltype(wv)>(QuantRows<T>{q, q_stride, s, s_stride},
                                                        res_out, x, res, w, eps);
  });
  if (launched) check_launch("add_rms_norm_quant_fp8 kernel");
  return launched;
}

namespace {
// out = layer_norm(x (+ res)) * w + b; with res, res_out = x + res. The shapes are the op's
// contract (csrc/ops.cpp): w, b [d] or [groups, d]; with res one group per row.
void layer_norm_impl(const char* op, const Tensor& out, const Tensor& res_out, const Tensor& x,
                     const Tensor& res, const Tensor& w, const Tensor& b, float eps) {
  const bool fused = res.defined();
  check_rows(x, op, "x");
  check_rows(out, op, "out");
  check_act(x, op, "x");
  check_on_device(w, op, "w");
  check_on_device(b, op, "b");
  if (fused) check_rows(res, op, "residual");
  VLLMX_CHECK(w.is_contiguous() && (!b.defined() || b.is_contiguous()), op,
              "w " + w.str() + " and b must be contiguous");
  VLLMX_CHECK(w.dtype == DType::F32 || w.dtype == x.dtype, op,
              "w " + w.str() + " must be f32 or x's dtype " + x.str());
  const int64_t d = w.shape[w.ndim - 1], groups = x.shape[1] / d, rows = x.shape[0];
  if (rows == 0 || d == 0) return;
  const int threads = threads_for(d / 4);
  const auto grid = static_cast<unsigned>(rows * groups);
  dispatch_norm(x, w, op, [&](auto xv, auto wv) {
    using T = decltype(xv);
    using W = decltype(wv);
    launch(layer_norm_kernel<T, W>, grid, threads, 0, stream(), out.ptr<T>(),
           fused ? res_out.ptr<T>() : nullptr, x.ptr<T>(), fused ? res.ptr<T>() : nullptr,
           w.ptr<W>(), b.defined() ? b.ptr<W>() : nullptr, d, groups,
           w.ndim == 2 ? d : int64_t{0}, out.stride[0], fused ? res_out.stride[0] : 0,
           x.stride[0], fused ? res.stride[0] : 0, eps);
  });
  check_launch(fused ? "fused_add_layer_norm kernel" : "layer_norm kernel");
}
}  // namespace

void layer_norm(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  layer_norm_impl("cuda.layer_norm", out, Tensor{}, x, Tensor{}, w, b, eps);
}

void fused_add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& w,
                          const Tensor& b, float eps) {
  layer_norm_impl("cuda.fused_add_layer_norm", x, residual, x, residual, w, b, eps);
}


VLLMX_KERNEL(rms_norm, kCUDA, rms_norm);
VLLMX_KERNEL(fused_add_rms_norm, kCUDA, fused_add_rms_norm);
VLLMX_KERNEL(add_rms_norm, kCUDA, add_rms_norm);
VLLMX_KERNEL(layer_norm, kCUDA, layer_norm);
VLLMX_KERNEL(fused_add_layer_norm, kCUDA, fused_add_layer_norm);

}  // namespace vllmx::cuda
