// The memory-bound ops: embedding, rms_norm (+ fused residual add), rotary, silu/gelu-and-mul
// and the KV-cache write. Activations are f32, f16 or bf16; math is f32 and stores round to
// nearest even. Each op checks shapes and dtypes on the host like its CPU twin; values that
// live on the GPU (token ids, positions, slots) cannot be checked without a host sync, so the
// kernels skip out-of-range entries instead: an embedding row of zeros, a token left unrotated,
// a KV slot not written.
#include <cmath>

#include "cuda_ops.h"
#include "cuda_util.cuh"

namespace vllmx::cuda {

namespace {

constexpr int kThreads = 256;

// ---- block reductions ----
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

// ---- embedding ----
// One GGUF block element as f32, bit-exact with csrc/quant.cpp (no FMA contraction).
__device__ __forceinline__ float f16_bits(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}
template <int kType>
__device__ __forceinline__ float dequant(const uint8_t* row, int64_t e) {
  const int64_t b = e / 32;
  const int j = static_cast<int>(e % 32);
  if constexpr (kType == static_cast<int>(DType::Q8_0)) {
    const uint8_t* blk = row + b * 34;
    return __fmul_rn(static_cast<float>(static_cast<int8_t>(blk[2 + j])), f16_bits(blk));
  } else if constexpr (kType == static_cast<int>(DType::Q4_0)) {
    const uint8_t* blk = row + b * 18;
    const int q = j < 16 ? (blk[2 + j] & 0x0F) : (blk[2 + j - 16] >> 4);
    return __fmul_rn(f16_bits(blk), static_cast<float>(q - 8));
  } else {  // Q4_1
    const uint8_t* blk = row + b * 20;
    const int q = j < 16 ? (blk[4 + j] & 0x0F) : (blk[4 + j - 16] >> 4);
    return __fadd_rn(__fmul_rn(f16_bits(blk), static_cast<float>(q)), f16_bits(blk + 2));
  }
}

template <typename To, typename Tt>
__global__ void embedding_dense_kernel(To* out, const int32_t* ids, const Tt* table,
                                       int64_t vocab, int64_t hidden, int64_t table_stride) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  To* o = out + t * hidden;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = from_f32<To>(0.0f);
    return;
  }
  const Tt* row = table + id * table_stride;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = from_f32<To>(to_f32(row[i]));
}

template <typename To, int kType>
__global__ void embedding_quant_kernel(To* out, const int32_t* ids, const uint8_t* table,
                                       int64_t vocab, int64_t hidden, int64_t row_bytes) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  To* o = out + t * hidden;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = from_f32<To>(0.0f);
    return;
  }
  const uint8_t* row = table + id * row_bytes;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    o[i] = from_f32<To>(dequant<kType>(row, i));
}

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

// residual += x (stored rounded to T); x = rms_norm(residual) * w. As in vLLM, the variance is
// taken over the unrounded f32 sum and the normalisation reads the rounded residual.
template <typename T, typename W>
__global__ void fused_add_rms_norm_kernel(T* x, T* residual, const W* w, int64_t n,
                                          int64_t x_stride, int64_t r_stride, float eps) {
  pdl_begin();
  T* xr = x + blockIdx.x * x_stride;
  T* rr = residual + blockIdx.x * r_stride;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_f32(xr[i]) + to_f32(rr[i]);
    ss += v * v;
    rr[i] = from_f32<T>(v);
  }
  ss = block_sum(ss);  // (its barrier also orders the residual stores before the reads below)
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    xr[i] = from_f32<T>(to_f32(rr[i]) * inv * to_f32(w[i]));
}

// ---- rotary ----
// Bit-identical to csrc/rotary.cpp in f32 (explicit roundings: no FMA contraction).
template <typename T>
__device__ __forceinline__ void rotate_pair(T* x, int64_t ia, int64_t ib, float c, float s) {
  const float a = to_f32(x[ia]), b = to_f32(x[ib]);
  x[ia] = from_f32<T>(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
  x[ib] = from_f32<T>(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}

template <typename T>
__global__ void rotary_kernel(const int32_t* positions, T* q, T* k, const float* cache,
                              int64_t max_pos, int64_t rot_dim, int64_t head_size, int64_t nq,
                              int64_t nk, int64_t q_stride, int64_t k_stride, bool is_neox) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int32_t pos = positions[t];
  if (pos < 0 || pos >= max_pos) return;
  const int64_t half = rot_dim / 2;
  const float* cos = cache + pos * rot_dim;
  const float* sin = cos + half;
  const int64_t work = (nq + nk) * half;
  for (int64_t j = threadIdx.x; j < work; j += blockDim.x) {
    const int64_t h = j / half, i = j % half;
    T* x = h < nq ? q + t * q_stride + h * head_size : k + t * k_stride + (h - nq) * head_size;
    if (is_neox)
      rotate_pair(x, i, i + half, cos[i], sin[i]);
    else
      rotate_pair(x, 2 * i, 2 * i + 1, cos[i], sin[i]);
  }
}

// ---- gated activations ----
enum class Act { kSilu, kGeluErf, kGeluTanh };

template <Act kAct>
__device__ __forceinline__ float activate(float g) {
  if constexpr (kAct == Act::kSilu) {
    return g / (1.0f + expf(-g));
  } else if constexpr (kAct == Act::kGeluErf) {
    return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
  } else {
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  }
}

template <typename T, Act kAct>
__global__ void act_and_mul_kernel(T* out, const T* x, int64_t rows, int64_t d, int64_t x_stride,
                                   int64_t out_stride) {
  pdl_begin();
  const int64_t n = rows * d;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, i = e % d;
    const T* xr = x + r * x_stride;
    out[r * out_stride + i] = from_f32<T>(activate<kAct>(to_f32(xr[i])) * to_f32(xr[i + d]));
  }
}

// ---- write_kv_cache ----
template <typename TA, typename TC>
__global__ void write_kv_cache_kernel(const TA* key, const TA* value, TC* key_cache,
                                      TC* value_cache, const int32_t* slots, int64_t row,
                                      int64_t num_slots, int64_t k_stride, int64_t v_stride) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int64_t s = slots[t];
  if (s < 0 || s >= num_slots) return;
  const TA* kr = key + t * k_stride;
  const TA* vr = value + t * v_stride;
  TC* kc = key_cache + s * row;
  TC* vc = value_cache + s * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kc[i] = from_f32<TC>(to_f32(kr[i]));
    vc[i] = from_f32<TC>(to_f32(vr[i]));
  }
}

int threads_for(int64_t n) {
  int t = 32;
  while (t < kThreads * 4 && t < n) t *= 2;
  return t;
}

void check_2d_like(const Tensor& out, const Tensor& x, const char* op) {
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == x.shape[0] && out.shape[1] == x.shape[1], op,
        "out " + out.str() + " does not match x " + x.str());
}

}  // namespace

void embedding(const Tensor& out, const Tensor& ids, const Tensor& table) {
  const char* op = "cuda.embedding";
  check_rows(out, op, "out");
  check_on_device(ids, op, "ids");
  check_on_device(table, op, "table");
  check_act(out, op, "out");
  check_dtype(ids, DType::I32, op, "ids");
  check_ndim(ids, 1, op, "ids");
  check_ndim(table, 2, op, "table");
  const int64_t t = ids.shape[0], vocab = table.shape[0], hidden = table.shape[1];
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == t && out.shape[1] == hidden &&
            (t == 0 || out.stride[0] == hidden),
        op, "out " + out.str() + " must be contiguous [" + std::to_string(t) + ", " +
                std::to_string(hidden) + "] for table " + table.str());
  if (t == 0) return;
  const DType td = table.dtype;
  dispatch_float(out.dtype, op, [&](auto o) {
    using To = decltype(o);
    To* op_ = out.ptr<To>();
    if (is_float_act(td)) {
      VLLMX_CHECK(table.stride[1] == 1, op, "table " + table.str() + " must be row-major");
      dispatch_float(td, op, [&](auto w) {
        using Tt = decltype(w);
        launch(embedding_dense_kernel<To, Tt>, t, kThreads, 0, stream(),
            op_, ids.ptr<int32_t>(), table.ptr<Tt>(), vocab, hidden, table.stride[0]);
      });
    } else {
      const int64_t rb = table.stride[0];  // bytes per row of blocks
      VLLMX_CHECK(rb >= row_bytes(td, hidden), op, "table " + table.str() + " rows are too short");
      const uint8_t* tp = table.ptr<uint8_t>();
      const int32_t* ip = ids.ptr<int32_t>();
      switch (td) {
        case DType::Q8_0:
          launch(embedding_quant_kernel<To, static_cast<int>(DType::Q8_0)>, t, kThreads, 0,
                 stream(), op_, ip, tp, vocab, hidden, rb);
          break;
        case DType::Q4_0:
          launch(embedding_quant_kernel<To, static_cast<int>(DType::Q4_0)>, t, kThreads, 0,
                 stream(), op_, ip, tp, vocab, hidden, rb);
          break;
        case DType::Q4_1:
          launch(embedding_quant_kernel<To, static_cast<int>(DType::Q4_1)>, t, kThreads, 0,
                 stream(), op_, ip, tp, vocab, hidden, rb);
          break;
        default:
          fail(op, std::string("table dtype ") + dtype_name(td) +
                       " is not supported on the GPU (f32, f16, bf16, Q8_0, Q4_0, Q4_1)");
      }
    }
  });
  check_launch("embedding kernel");
}

namespace {
template <bool kFused>
void norm_impl(const char* op, const Tensor& out_or_res, const Tensor& x, const Tensor& w,
               float eps) {
  check_rows(x, op, "x");
  check_rows(out_or_res, op, kFused ? "residual" : "out");
  check_on_device(w, op, "weight");
  check_act(x, op, "x");
  check_ndim(x, 2, op, "x");
  check_ndim(w, 1, op, "weight");
  VLLMX_CHECK(w.shape[0] == x.shape[1], op, "weight " + w.str() + " does not match x " + x.str());
  VLLMX_CHECK(out_or_res.dtype == x.dtype, op,
        std::string(kFused ? "residual " : "out ") + out_or_res.str() + " must have x's dtype " +
            x.str());
  check_2d_like(out_or_res, x, op);
  VLLMX_CHECK(w.dtype == DType::F32 || w.dtype == x.dtype, op,
        "weight " + w.str() + " must be f32 or x's dtype");
  const int64_t rows = x.shape[0], n = x.shape[1];
  if (rows == 0 || n == 0) return;
  const int threads = threads_for(n / 4);
  dispatch_float(x.dtype, op, [&](auto xv) {
    using T = decltype(xv);
    auto run = [&](auto wv) {
      using W = decltype(wv);
      if constexpr (kFused)
        launch(fused_add_rms_norm_kernel<T, W>, rows, threads, 0, stream(), x.ptr<T>(),
               out_or_res.ptr<T>(), w.ptr<W>(), n, x.stride[0], out_or_res.stride[0], eps);
      else
        launch(rms_norm_kernel<T, W>, rows, threads, 0, stream(), out_or_res.ptr<T>(), x.ptr<T>(),
               w.ptr<W>(), n, x.stride[0], out_or_res.stride[0], eps);
    };
    if (w.dtype == DType::F32)
      run(float{});
    else
      run(T{});
  });
  check_launch(kFused ? "fused_add_rms_norm kernel" : "rms_norm kernel");
}
}  // namespace

void rms_norm(const Tensor& out, const Tensor& x, const Tensor& w, float eps) {
  norm_impl<false>("cuda.rms_norm", out, x, w, eps);
}

void fused_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) {
  norm_impl<true>("cuda.fused_add_rms_norm", residual, x, w, eps);
}

void rotary(const Tensor& positions, const Tensor& q, const Tensor& k, const Tensor& cos_sin_cache,
            int64_t head_size, bool is_neox) {
  const char* op = "cuda.rotary";
  check_on_device(positions, op, "positions");
  check_rows(q, op, "q");
  check_rows(k, op, "k");
  check_on_device(cos_sin_cache, op, "cos_sin_cache");
  check_dtype(positions, DType::I32, op, "positions");
  check_act(q, op, "q");
  check_dtype(cos_sin_cache, DType::F32, op, "cos_sin_cache");
  check_ndim(positions, 1, op, "positions");
  check_ndim(q, 2, op, "q");
  check_ndim(cos_sin_cache, 2, op, "cos_sin_cache");
  const int64_t t = positions.shape[0], rot_dim = cos_sin_cache.shape[1];
  const int64_t max_pos = cos_sin_cache.shape[0];
  VLLMX_CHECK(head_size > 0 && q.shape[1] % head_size == 0, op,
        "q " + q.str() + " is not a whole number of heads of " + std::to_string(head_size));
  VLLMX_CHECK(q.shape[0] == t, op, "q " + q.str() + " and positions " + positions.str() + " disagree");
  VLLMX_CHECK(rot_dim % 2 == 0 && rot_dim <= head_size, op,
        "cos_sin_cache " + cos_sin_cache.str() + " rotary dim must be even and <= head_size");
  VLLMX_CHECK(cos_sin_cache.stride[0] == rot_dim, op, "cos_sin_cache must be contiguous");
  if (k.defined()) {
    VLLMX_CHECK(k.dtype == q.dtype, op, "k " + k.str() + " must have q's dtype " + q.str());
    VLLMX_CHECK(k.ndim == 2 && k.shape[0] == t && k.shape[1] % head_size == 0, op,
          "k " + k.str() + " must be [T, nk * head_size]");
  }
  if (t == 0 || rot_dim == 0) return;
  const int64_t nq = q.shape[1] / head_size, nk = k.defined() ? k.shape[1] / head_size : 0;
  const int threads = threads_for((nq + nk) * rot_dim / 2);
  dispatch_float(q.dtype, op, [&](auto v) {
    using T = decltype(v);
    launch(rotary_kernel<T>, t, threads, 0, stream(),
        positions.ptr<int32_t>(), q.ptr<T>(), k.defined() ? k.ptr<T>() : nullptr,
        cos_sin_cache.ptr<float>(), max_pos, rot_dim, head_size, nq, nk, q.stride[0],
        k.defined() ? k.stride[0] : 0, is_neox);
  });
  check_launch("rotary kernel");
}

namespace {
template <Act kAct>
void act_impl(const char* op, const Tensor& out, const Tensor& x) {
  check_rows(out, op, "out");
  check_rows(x, op, "x");
  check_act(x, op, "x");
  VLLMX_CHECK(out.dtype == x.dtype, op, "out " + out.str() + " must have x's dtype " + x.str());
  check_ndim(x, 2, op, "x");
  check_ndim(out, 2, op, "out");
  const int64_t rows = x.shape[0], d = out.shape[1];
  VLLMX_CHECK(out.shape[0] == rows && x.shape[1] == 2 * d, op,
        "x " + x.str() + " must be [T, 2 * I] for out " + out.str());
  if (rows * d == 0) return;
  dispatch_float(x.dtype, op, [&](auto v) {
    using T = decltype(v);
    launch(act_and_mul_kernel<T, kAct>, blocks_for(rows * d, kThreads), kThreads, 0, stream(),
        out.ptr<T>(), x.ptr<T>(), rows, d, x.stride[0], out.stride[0]);
  });
  check_launch(op);
}
}  // namespace

void silu_and_mul(const Tensor& out, const Tensor& x) {
  act_impl<Act::kSilu>("cuda.silu_and_mul", out, x);
}

void gelu_and_mul(const Tensor& out, const Tensor& x, bool approximate_tanh) {
  if (approximate_tanh)
    act_impl<Act::kGeluTanh>("cuda.gelu_and_mul", out, x);
  else
    act_impl<Act::kGeluErf>("cuda.gelu_and_mul", out, x);
}

void write_kv_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                    const Tensor& value_cache, const Tensor& slot_mapping) {
  const char* op = "cuda.write_kv_cache";
  check_rows(key, op, "key");
  check_rows(value, op, "value");
  check_on_device(key_cache, op, "key_cache");
  check_on_device(value_cache, op, "value_cache");
  check_on_device(slot_mapping, op, "slot_mapping");
  check_act(key, op, "key");
  VLLMX_CHECK(value.dtype == key.dtype, op, "value " + value.str() + " must have key's dtype");
  check_ndim(key, 2, op, "key");
  check_ndim(value, 2, op, "value");
  check_ndim(key_cache, 4, op, "key_cache");
  check_ndim(value_cache, 4, op, "value_cache");
  check_dtype(slot_mapping, DType::I32, op, "slot_mapping");
  check_ndim(slot_mapping, 1, op, "slot_mapping");
  const DType dt = key_cache.dtype;
  VLLMX_CHECK(is_float_act(dt), op,
        "cache dtype must be f16, bf16 or f32, got key_cache " + key_cache.str());
  VLLMX_CHECK(value_cache.dtype == dt, op,
        "value_cache " + value_cache.str() + " does not match key_cache " + key_cache.str());
  for (int d = 0; d < 4; ++d)
    VLLMX_CHECK(value_cache.shape[d] == key_cache.shape[d], op,
          "value_cache " + value_cache.str() + " does not match key_cache " + key_cache.str());
  const int64_t num_slots = key_cache.shape[0] * key_cache.shape[1];
  const int64_t row = key_cache.shape[2] * key_cache.shape[3];
  const int64_t T = key.shape[0];
  VLLMX_CHECK(key.shape[1] == row && value.shape[0] == T && value.shape[1] == row, op,
        "key " + key.str() + " / value " + value.str() + " do not match the cache rows of " +
            key_cache.str() + " (expected [T, " + std::to_string(row) + "])");
  VLLMX_CHECK(slot_mapping.shape[0] == T, op,
        "slot_mapping " + slot_mapping.str() + " does not match key " + key.str());
  if (T == 0 || row == 0) return;
  VLLMX_CHECK(key_cache.data != value_cache.data, op, "key_cache and value_cache must be distinct");
  const int threads = threads_for(row / 2);
  dispatch_float(key.dtype, op, [&](auto a) {
    using TA = decltype(a);
    dispatch_float(dt, op, [&](auto c) {
      using TC = decltype(c);
      launch(write_kv_cache_kernel<TA, TC>, T, threads, 0, stream(),
          key.ptr<TA>(), value.ptr<TA>(), key_cache.ptr<TC>(), value_cache.ptr<TC>(),
          slot_mapping.ptr<int32_t>(), row, num_slots, key.stride[0], value.stride[0]);
    });
  });
  check_launch("write_kv_cache kernel");
}

}  // namespace vllmx::cuda
