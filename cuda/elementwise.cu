// The memory-bound ops (embedding: embedding.cu; the norms: norm.cu): rotary, gelu,
// silu/gelu-and-mul, sigmoid_gate, softcap, the KV-cache write and the fused attention
// prologue. Activations are f32, f16 or bf16; math is f32 and stores round to nearest even. Each op checks shapes and dtypes on the
// host like its CPU twin; values that live on the GPU (token ids, positions, slots) cannot be
// checked without a host sync, so the kernels skip out-of-range entries instead: an embedding
// row of zeros (embedding.cu), a token left unrotated, a KV slot not written.
#include <algorithm>
#include <cmath>

#include "core/op_table.h"
#include "sampling/rng.h"
#include "cuda_util.cuh"

namespace vllmx::cuda {

namespace {

constexpr int kThreads = 256;

using detail::warp_sum;

// ---- rotary ----
// Bit-identical to csrc/layers/rotary.cpp in f32 (explicit roundings: no FMA contraction).
// (a, b) rotated by the angle whose cosine and sine are c, s (f32, before rounding to T).
__device__ __forceinline__ float2 rope(float a, float b, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)),
                     __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}

template <typename T>
__device__ __forceinline__ void rotate_pair(T* x, int64_t ia, int64_t ib, float c, float s) {
  const float2 r = rope(to_f32(x[ia]), to_f32(x[ib]), c, s);
  x[ia] = from_f32<T>(r.x);
  x[ib] = from_f32<T>(r.y);
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

// ---- q/k norm + rope + KV-cache write, fused (the decode step's attention prologue) ----
// One warp per head of a token's qkv row [q heads | k heads | v heads]: q and k heads are
// rms-normed (when weights are given) and rotated, q heads go to q_out, k and v heads to their
// cache slot. Each stage rounds to T exactly where the separate ops (rms_norm, rotary,
// write_kv_cache) store, so the result matches them up to the order of the norm's f32 sum.

// The head's rms_norm scale from its lanes' partial sums of squares.
__device__ __forceinline__ float head_rms_inv(float ss, int D, float eps) {
  return 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
}
// One normed element, rounded where rms_norm stores.
template <typename T, typename W>
__device__ __forceinline__ float head_normed(float x, float inv, W w) {
  return to_f32(from_f32<T>(x * inv * to_f32(w)));
}

// Any head size: the warp's lanes stride over the head, rotary pairs meet in shared memory.
template <typename T, typename TC, typename W>
__global__ void qk_norm_rope_cache_kernel(T* q_out, const T* qkv, const int32_t* positions,
                                          const float* cache, int64_t max_pos, int rot_dim,
                                          const W* q_w, const W* k_w, float eps, TC* key_cache,
                                          TC* value_cache, const int32_t* slots,
                                          int64_t num_slots, int nq, int nkv, int D,
                                          int64_t qkv_stride, int64_t q_stride, bool is_neox) {
  pdl_begin();
  extern __shared__ float qk_rows[];  // [warps][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.y * (blockDim.x / 32) + warp;
  if (h >= nq + 2 * nkv) return;
  const int64_t t = blockIdx.x;
  const T* x = qkv + t * qkv_stride + static_cast<int64_t>(h) * D;
  float* row = qk_rows + warp * D;
  const bool is_v = h >= nq + nkv;
  if (!is_v) {
    const W* w = h < nq ? q_w : k_w;
    float inv = 1.f;
    if (w != nullptr) {
      float ss = 0.f;
      for (int i = lane; i < D; i += 32) {
        const float v = to_f32(x[i]);
        ss += v * v;
      }
      inv = head_rms_inv(ss, D, eps);
    }
    for (int i = lane; i < D; i += 32)
      row[i] = w != nullptr ? head_normed<T>(to_f32(x[i]), inv, w[i]) : to_f32(x[i]);
    __syncwarp();
    const int32_t pos = positions[t];
    if (pos >= 0 && pos < max_pos) {
      const int half = rot_dim / 2;
      const float* cos = cache + static_cast<int64_t>(pos) * rot_dim;
      for (int i = lane; i < half; i += 32) {
        const int ia = is_neox ? i : 2 * i, ib = is_neox ? i + half : 2 * i + 1;
        const float2 r = rope(row[ia], row[ib], cos[i], cos[half + i]);
        row[ia] = to_f32(from_f32<T>(r.x));
        row[ib] = to_f32(from_f32<T>(r.y));
      }
      __syncwarp();
    }
    if (h < nq) {
      T* o = q_out + t * q_stride + static_cast<int64_t>(h) * D;
      for (int i = lane; i < D; i += 32) o[i] = from_f32<T>(row[i]);
      return;
    }
  }
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;
  const int kv = is_v ? h - nq - nkv : h - nq;
  TC* dst = (is_v ? value_cache : key_cache) + (slot * nkv + kv) * D;
  for (int i = lane; i < D; i += 32) dst[i] = from_f32<TC>(is_v ? to_f32(x[i]) : row[i]);
}

// Head size 32 * V: each lane holds V consecutive elements in registers, read and written in
// one access; a neox pair's other element sits half / V lanes away (half a multiple of V, the
// host checks), a GPT-J pair in the lane itself. A warp takes kRopeHeadsPerWarp consecutive
// heads of a token, all loaded before any is worked on, with the token's angles read once: on an
// H100 (Llama-3-8B's 32 / 8 heads of 128, bf16) 8192 tokens 110.9 -> 82.1 us (1.82 -> 2.45
// TB/s), 256 tokens 7.0-8.2 -> 5.1 us, against one head a warp (.gpu/rope_bench.py, 2026-12-07).
// The same roundings as the kernel above, so the results are identical.
constexpr int kRopeHeadsPerWarp = 4;
template <typename T, typename TC, typename W, int V>
__global__ void qk_norm_rope_cache_vec_kernel(T* q_out, const T* qkv, const int32_t* positions,
                                              const float* cache, int64_t max_pos, int rot_dim,
                                              const W* q_w, const W* k_w, float eps,
                                              TC* key_cache, TC* value_cache,
                                              const int32_t* slots, int64_t num_slots, int nq,
                                              int nkv, int /*D: 32 * V*/, int64_t qkv_stride,
                                              int64_t q_stride, bool is_neox) {
  pdl_begin();
  constexpr int D = 32 * V, H = kRopeHeadsPerWarp;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, first = lane * V;
  const int h0 = (blockIdx.y * (blockDim.x / 32) + warp) * H, heads = nq + 2 * nkv;
  if (h0 >= heads) return;
  const int64_t t = blockIdx.x;
  float v[H][V];
#pragma unroll
  for (int k = 0; k < H; ++k)
    if (h0 + k < heads)
      RegRow<T, V>::load(qkv + t * qkv_stride + static_cast<int64_t>(h0 + k) * D + first, v[k]);
  // This lane's rotary pairs: cos[j], sin[j] of its element j (rotated: lo / hi for neox, the
  // pair's first element for GPT-J); none where the position is out of range.
  const int32_t pos = positions[t];
  const bool rotate = h0 < nq + nkv && pos >= 0 && pos < max_pos;
  const int half = rot_dim / 2, off = half / V;  // (neox: lanes between a pair's elements)
  const bool lo = is_neox && lane < off, hi = is_neox && !lo && lane < 2 * off;
  float cs[V], sn[V];
  const float* c = cache + static_cast<int64_t>(pos) * rot_dim;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int i = is_neox ? first + j - (hi ? half : 0) : (first + (j & ~1)) / 2;
    const bool used = is_neox ? lo || hi : i < half;
    cs[j] = rotate && used ? c[i] : 0.f;
    sn[j] = rotate && used ? c[half + i] : 0.f;
  }
#pragma unroll
  for (int k = 0; k < H; ++k) {
    const int h = h0 + k;
    if (h >= heads) break;
    const bool is_v = h >= nq + nkv;
    if (!is_v) {
      const W* w = h < nq ? q_w : k_w;
      if (w != nullptr) {
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < V; ++j) ss += v[k][j] * v[k][j];
        const float inv = head_rms_inv(ss, D, eps);
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = head_normed<T>(v[k][j], inv, w[first + j]);
      }
      if (rotate) {  // (a q or k head: h0 <= h < nq + nkv)
        if (is_neox) {
          const int src = lo ? lane + off : hi ? lane - off : lane;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const float p = __shfl_sync(0xffffffffu, v[k][j], src);
            if (lo) v[k][j] = to_f32(from_f32<T>(rope(v[k][j], p, cs[j], sn[j]).x));
            if (hi) v[k][j] = to_f32(from_f32<T>(rope(p, v[k][j], cs[j], sn[j]).y));
          }
        } else {
#pragma unroll
          for (int j = 0; j < V; j += 2) {
            if ((first + j) / 2 >= half) break;
            const float2 r = rope(v[k][j], v[k][j + 1], cs[j], sn[j]);
            v[k][j] = to_f32(from_f32<T>(r.x));
            v[k][j + 1] = to_f32(from_f32<T>(r.y));
          }
        }
      }
      if (h < nq) {
        RegRow<T, V>::store(q_out + t * q_stride + static_cast<int64_t>(h) * D + first, v[k]);
        continue;
      }
    }
    const int64_t slot = slots[t];
    if (slot < 0 || slot >= num_slots) continue;
    const int kv = is_v ? h - nq - nkv : h - nq;
    RegRow<TC, V>::store((is_v ? value_cache : key_cache) + (slot * nkv + kv) * D + first, v[k]);
  }
}

// ---- gated activations (activate(): cuda_util.cuh) ----
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

// act_and_mul_kernel in 16-byte vectors (d and the row strides multiples of Vec16<T>::N).
template <typename T, Act kAct>
__global__ void act_and_mul_vec_kernel(T* out, const T* x, int64_t rows, int64_t d,
                                       int64_t x_stride, int64_t out_stride) {
  pdl_begin();
  for_vec16<T>(rows, d, [&](int64_t r, int64_t i) {
    const T* xr = x + r * x_stride + i;
    Vec16<T> g, u;
    g.load(xr);
    u.load(xr + d);
#pragma unroll
    for (int j = 0; j < Vec16<T>::N; ++j) g.f[j] = activate<kAct>(g.f[j]) * u.f[j];
    g.store(out + r * out_stride + i);
  });
}

// act(x) elementwise, no gate (gelu).
template <typename T, Act kAct>
__global__ void act_kernel(T* out, const T* x, int64_t rows, int64_t d, int64_t x_stride,
                           int64_t out_stride) {
  pdl_begin();
  const int64_t n = rows * d;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, i = e % d;
    out[r * out_stride + i] = from_f32<T>(activate<kAct>(to_f32(x[r * x_stride + i])));
  }
}

// gpt-oss's clamped SwiGLU over rows [gate; up] (swigluoai_and_mul).
template <typename T>
__global__ void swigluoai_and_mul_kernel(T* out, const T* x, int64_t rows, int64_t d,
                                         int64_t x_stride, int64_t out_stride, float alpha,
                                         float limit) {
  pdl_begin();
  const int64_t n = rows * d;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, i = e % d;
    const T* xr = x + r * x_stride;
    out[r * out_stride + i] =
        from_f32<T>(swigluoai(to_f32(xr[i]), to_f32(xr[i + d]), alpha, limit));
  }
}

// Squared ReLU elementwise (relu2).
template <typename T>
__global__ void relu2_kernel(T* out, const T* x, int64_t rows, int64_t d, int64_t x_stride,
                             int64_t out_stride) {
  pdl_begin();
  const int64_t n = rows * d;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, i = e % d;
    out[r * out_stride + i] = from_f32<T>(squared_relu(to_f32(x[r * x_stride + i])));
  }
}

// ---- fill_uniform (the same hash as the CPU kernel: sampling/rng.h) ----
template <typename T>
__global__ void fill_uniform_kernel(T* out, int64_t n, uint64_t seed, float low, float span) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(rng::hashed_uniform(seed, static_cast<uint64_t>(i), low, span));
}

// ---- scale ----
template <typename T>
__global__ void scale_kernel(T* out, const T* x, int64_t n, float s) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(__fmul_rn(to_f32(x[i]), s));
}

// ---- scatter_tokens ----
__global__ void scatter_tokens_kernel(int32_t* out, int64_t n_out, const int32_t* dst,
                                      const int32_t* tokens, int64_t n_tok, const int32_t* src,
                                      int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t d = dst[i], s = src[i];
    if (d >= 0 && d < n_out && s >= 0 && s < n_tok) out[d] = tokens[s];
  }
}

// copy_columns over heads: piece (row r, head h) of n / sizeof(V) units, flattened, in units of
// V (the widest of 16, 8, 4, 2 bytes that every offset, stride and n is a multiple of).
template <typename V>
__global__ void copy_heads_kernel(V* out, int64_t out_stride, int64_t out_head_stride,
                                  const V* x, int64_t x_stride, int64_t x_head_stride, int64_t nv,
                                  int64_t heads, int64_t total) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = i % nv, piece = i / nv, h = piece % heads, r = piece / heads;
    out[r * out_stride + h * out_head_stride + v] = x[r * x_stride + h * x_head_stride + v];
  }
}

// ---- softcap ----
template <typename T>
__global__ void softcap_kernel(T* x, int64_t rows, int64_t d, int64_t stride, float cap) {
  pdl_begin();
  const int64_t n = rows * d;
  const float inv = 1.0f / cap;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T* v = x + (e / d) * stride + e % d;
    *v = from_f32<T>(cap * tanhf(to_f32(*v) * inv));
  }
}

// ---- sigmoid_gate: x *= sigmoid(gate), gate per element or one per row ----
template <typename T>
__global__ void sigmoid_gate_kernel(T* x, const T* gate, int64_t rows, int64_t d,
                                    int64_t x_stride, int64_t g_stride, bool per_row) {
  pdl_begin();
  const int64_t n = rows * d;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, c = e % d;
    T* v = x + r * x_stride + c;
    const float g = to_f32(gate[r * g_stride + (per_row ? 0 : c)]);
    *v = from_f32<T>(to_f32(*v) / (1.0f + expf(-g)));
  }
}

// sigmoid_gate_kernel in 16-byte vectors (d and x's row stride multiples of Vec16<T>::N, an
// elementwise gate's too): a thread a value took 97 us for Qwen3.5's 8,192 x 4,096 attention
// gate on an H100, 1.5x its bytes' time. Same arithmetic.
template <typename T>
__global__ void sigmoid_gate_vec_kernel(T* x, const T* gate, int64_t rows, int64_t d,
                                        int64_t x_stride, int64_t g_stride, bool per_row) {
  constexpr int V = Vec16<T>::N;
  pdl_begin();
  for_vec16<T>(rows, d, [&](int64_t r, int64_t i) {
    T* xr = x + r * x_stride + i;
    Vec16<T> v, g;
    v.load(xr);
    if (per_row) {
      const float gr = to_f32(gate[r * g_stride]);
#pragma unroll
      for (int j = 0; j < V; ++j) g.f[j] = gr;
    } else {
      g.load(gate + r * g_stride + i);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) v.f[j] = v.f[j] / (1.0f + expf(-g.f[j]));
    v.store(xr);
  });
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



}  // namespace



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
    constexpr int V = Vec16<T>::N;
    if (d % V == 0 && vec16_ok<T>(x.data, x.stride[0]) && vec16_ok<T>(out.data, out.stride[0]))
      launch(act_and_mul_vec_kernel<T, kAct>, blocks_for(rows * d / V, kThreads), kThreads, 0,
             stream(), out.ptr<T>(), x.ptr<T>(), rows, d, x.stride[0], out.stride[0]);
    else
      launch(act_and_mul_kernel<T, kAct>, blocks_for(rows * d, kThreads), kThreads, 0,
             stream(), out.ptr<T>(), x.ptr<T>(), rows, d, x.stride[0], out.stride[0]);
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

void swigluoai_and_mul(const Tensor& out, const Tensor& x, float alpha, float limit) {
  const char* op = "cuda.swigluoai_and_mul";
  check_rows(out, op, "out");
  check_rows(x, op, "x");
  check_act(x, op, "x");
  VLLMX_CHECK(out.dtype == x.dtype, op, "out " + out.str() + " must have x's dtype " + x.str());
  const int64_t rows = x.shape[0], d = out.shape[1];
  VLLMX_CHECK(out.shape[0] == rows && x.shape[1] == 2 * d, op,
              "x " + x.str() + " must be [T, 2 * I] for out " + out.str());
  if (rows * d == 0) return;
  dispatch_float(x.dtype, op, [&](auto v) {
    using T = decltype(v);
    launch(swigluoai_and_mul_kernel<T>, blocks_for(rows * d, kThreads), kThreads, 0, stream(),
           out.ptr<T>(), x.ptr<T>(), rows, d, x.stride[0], out.stride[0], alpha, limit);
  });
  check_launch(op);
}

void relu2(const Tensor& out, const Tensor& x) {
  const char* op = "cuda.relu2";
  check_rows(out, op, "out");
  check_rows(x, op, "x");
  check_act(x, op, "x");
  VLLMX_CHECK(out.dtype == x.dtype && out.shape[0] == x.shape[0] && out.shape[1] == x.shape[1],
              op, "out " + out.str() + " must be x's shape and dtype " + x.str());
  const int64_t rows = x.shape[0], d = x.shape[1];
  if (rows * d == 0) return;
  dispatch_float(x.dtype, op, [&](auto v) {
    using T = decltype(v);
    launch(relu2_kernel<T>, blocks_for(rows * d, kThreads), kThreads, 0, stream(), out.ptr<T>(),
           x.ptr<T>(), rows, d, x.stride[0], out.stride[0]);
  });
  check_launch(op);
}

void gelu(const Tensor& out, const Tensor& x, bool approximate_tanh) {
  // The shapes and out's dtype are the op's contract (csrc/ops.cpp).
  const char* op = "cuda.gelu";
  check_rows(out, op, "out");
  check_rows(x, op, "x");
  check_act(x, op, "x");
  const int64_t rows = x.shape[0], d = x.shape[1];
  if (rows * d == 0) return;
  dispatch_float(x.dtype, op, [&](auto v) {
    using T = decltype(v);
    const auto run = [&](auto kernel) {
      launch(kernel, blocks_for(rows * d, kThreads), kThreads, 0, stream(), out.ptr<T>(),
             x.ptr<T>(), rows, d, x.stride[0], out.stride[0]);
    };
    if (approximate_tanh)
      run(act_kernel<T, Act::kGeluTanh>);
    else
      run(act_kernel<T, Act::kGeluErf>);
  });
  check_launch(op);
}

void fill_uniform(const Tensor& out, int64_t seed, float low, float high) {
  // The bounds, out's dtype and contiguity are the op's contract (csrc/ops.cpp).
  const char* op = "cuda.fill_uniform";
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float(out.dtype, op, [&](auto v) {
    using T = decltype(v);
    launch(fill_uniform_kernel<T>, blocks_for(n, kThreads), kThreads, 0, stream(), out.ptr<T>(),
        n, static_cast<uint64_t>(seed), low, high - low);
  });
  check_launch(op);
}

void scale(const Tensor& out, const Tensor& x, float s) {
  // The dtype match and the sizes are the op's contract (csrc/ops.cpp).
  const char* op = "cuda.scale";
  check_act(x, op, "x");
  VLLMX_CHECK(out.is_contiguous() && x.is_contiguous(), op, "out and x must be contiguous");
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype, op, [&](auto v) {
    using T = decltype(v);
    launch(scale_kernel<T>, blocks_for(n, kThreads), kThreads, 0, stream(), out.ptr<T>(),
        x.ptr<T>(), n, s);
  });
  check_launch(op);
}

void sigmoid_gate(const Tensor& x, const Tensor& gate) {
  // The shapes are the op's contract (csrc/ops.cpp).
  const char* op = "cuda.sigmoid_gate";
  check_rows(x, op, "x");
  check_act(x, op, "x");
  check_on_device(gate, op, "gate");
  VLLMX_CHECK(gate.dtype == x.dtype && (gate.shape[1] == 1 || gate.stride[1] == 1), op,
              "gate " + gate.str() + " must have x's dtype " + x.str());
  const int64_t rows = x.shape[0], d = x.shape[1];
  if (rows * d == 0) return;
  const bool per_row = gate.shape[1] == 1;
  dispatch_float(x.dtype, op, [&](auto v) {
    using T = decltype(v);
    constexpr int V = Vec16<T>::N;
    if (d % V == 0 && vec16_ok<T>(x.data, x.stride[0]) &&
        (per_row || vec16_ok<T>(gate.data, gate.stride[0])))
      launch(sigmoid_gate_vec_kernel<T>, blocks_for(rows * d / V, kThreads), kThreads, 0,
             stream(), x.ptr<T>(), gate.ptr<T>(), rows, d, x.stride[0], gate.stride[0],
             per_row);
    else
      launch(sigmoid_gate_kernel<T>, blocks_for(rows * d, kThreads), kThreads, 0, stream(),
             x.ptr<T>(), gate.ptr<T>(), rows, d, x.stride[0], gate.stride[0], per_row);
  });
  check_launch(op);
}

void softcap(const Tensor& x, float cap) {
  // x's shape and cap are the op's contract (csrc/ops.cpp).
  const char* op = "cuda.softcap";
  check_rows(x, op, "x");
  check_act(x, op, "x");
  const int64_t rows = x.shape[0], d = x.shape[1];
  if (rows * d == 0) return;
  dispatch_float(x.dtype, op, [&](auto v) {
    using T = decltype(v);
    launch(softcap_kernel<T>, blocks_for(rows * d, kThreads), kThreads, 0, stream(),
        x.ptr<T>(), rows, d, x.stride[0], cap);
  });
  check_launch(op);
}

void write_kv_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                    const Tensor& value_cache, const Tensor& slot_mapping) {
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs.
  const char* op = "write_kv_cache";
  check_rows(key, op, "key");
  check_rows(value, op, "value");
  check_act(key, op, "key");
  const DType dt = key_cache.dtype;
  const int64_t num_slots = key_cache.shape[0] * key_cache.shape[1];
  const int64_t row = key_cache.shape[2] * key_cache.shape[3];
  const int64_t T = key.shape[0];
  if (T == 0 || row == 0) return;
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

void qk_norm_rope_cache(const Tensor& q_out, const Tensor& qkv, const Tensor& positions,
                        const Tensor& cos_sin_cache, const Tensor& q_norm, const Tensor& k_norm,
                        float eps, const Tensor& key_cache, const Tensor& value_cache,
                        const Tensor& slot_mapping, int64_t num_heads, int64_t num_kv_heads,
                        bool is_neox) {
  const char* op = "cuda.qk_norm_rope_cache";
  check_rows(q_out, op, "q_out");
  check_rows(qkv, op, "qkv");
  check_act(qkv, op, "qkv");
  check_ndim(qkv, 2, op, "qkv");
  check_ndim(q_out, 2, op, "q_out");
  for (const Tensor* t : {&positions, &cos_sin_cache, &key_cache, &value_cache, &slot_mapping})
    check_on_device(*t, op, "an input");
  check_dtype(positions, DType::I32, op, "positions");
  check_dtype(slot_mapping, DType::I32, op, "slot_mapping");
  check_dtype(cos_sin_cache, DType::F32, op, "cos_sin_cache");
  check_ndim(cos_sin_cache, 2, op, "cos_sin_cache");
  check_ndim(key_cache, 4, op, "key_cache");
  check_ndim(value_cache, 4, op, "value_cache");
  const int64_t T = qkv.shape[0], nkv = key_cache.shape[2], D = key_cache.shape[3];
  const int64_t rot_dim = cos_sin_cache.shape[1];
  VLLMX_CHECK(num_kv_heads == nkv && num_heads > 0 && num_heads % nkv == 0, op,
        "num_heads " + std::to_string(num_heads) + " / num_kv_heads " +
            std::to_string(num_kv_heads) + " do not fit key_cache " + key_cache.str());
  VLLMX_CHECK(qkv.shape[1] == (num_heads + 2 * nkv) * D, op,
        "qkv " + qkv.str() + " is not [T, (num_heads + 2 * num_kv_heads) * head_size] for " +
            "the cache " + key_cache.str());
  VLLMX_CHECK(q_out.dtype == qkv.dtype && q_out.shape[0] == T && q_out.shape[1] == num_heads * D,
        op, "q_out " + q_out.str() + " must be [T, num_heads * head_size] of qkv's dtype");
  VLLMX_CHECK(positions.shape[0] == T && slot_mapping.shape[0] == T, op,
        "positions " + positions.str() + " / slot_mapping " + slot_mapping.str() +
            " must have one entry per token of qkv " + qkv.str());
  VLLMX_CHECK(rot_dim % 2 == 0 && rot_dim <= D && cos_sin_cache.stride[0] == rot_dim, op,
        "cos_sin_cache " + cos_sin_cache.str() + ": rotary dim must be even, <= head_size");
  VLLMX_CHECK(is_float_act(key_cache.dtype) && value_cache.dtype == key_cache.dtype &&
            value_cache.shape[0] == key_cache.shape[0] && value_cache.shape[1] ==
            key_cache.shape[1] && value_cache.shape[2] == nkv && value_cache.shape[3] == D &&
            key_cache.data != value_cache.data,
        op, "key_cache " + key_cache.str() + " / value_cache " + value_cache.str() +
            " must be distinct caches of one float dtype and shape");
  VLLMX_CHECK(q_norm.defined() == k_norm.defined(), op, "q_norm and k_norm go together");
  if (q_norm.defined()) {
    check_on_device(q_norm, op, "q_norm");
    check_on_device(k_norm, op, "k_norm");
    VLLMX_CHECK(q_norm.numel() == D && k_norm.numel() == D && q_norm.dtype == k_norm.dtype &&
              (q_norm.dtype == DType::F32 || q_norm.dtype == qkv.dtype),
          op, "q_norm " + q_norm.str() + " / k_norm " + k_norm.str() +
              " must be [head_size] of f32 or qkv's dtype");
  }
  if (T == 0) return;
  const int64_t heads = num_heads + 2 * nkv;
  const int64_t num_slots = key_cache.shape[0] * key_cache.shape[1];
  // Head sizes 64, 128 and 256 in registers (qk_norm_rope_cache_vec_kernel) where the rows
  // allow its accesses, others through shared memory.
  const int64_t V = D % 32 == 0 ? D / 32 : 0;
  auto aligned = [&](const Tensor& a, int64_t stride) {
    const int64_t bytes = std::min<int64_t>(16, row_bytes(a.dtype, V));
    return reinterpret_cast<uintptr_t>(a.data) % bytes == 0 && stride % V == 0;
  };
  const bool vec = (V == 2 || V == 4 || V == 8) && (!is_neox || (rot_dim / 2) % V == 0) &&
                   aligned(qkv, qkv.stride[0]) && aligned(q_out, q_out.stride[0]) &&
                   aligned(key_cache, D) && aligned(value_cache, D);
  const int warps = 4, per_block = vec ? warps * kRopeHeadsPerWarp : warps;
  const dim3 grid(static_cast<unsigned>(T),
                  static_cast<unsigned>((heads + per_block - 1) / per_block));
  dispatch_float(qkv.dtype, op, [&](auto xv) {
    using T_ = decltype(xv);
    dispatch_float(key_cache.dtype, op, [&](auto cv) {
      using TC = decltype(cv);
      auto run = [&](auto wv) {
        using W = decltype(wv);
        const W* qw = q_norm.defined() ? q_norm.ptr<W>() : nullptr;
        const W* kw = k_norm.defined() ? k_norm.ptr<W>() : nullptr;
        auto kernel = qk_norm_rope_cache_kernel<T_, TC, W>;  // (one signature for all four)
        if (vec)
          kernel = V == 2   ? qk_norm_rope_cache_vec_kernel<T_, TC, W, 2>
                   : V == 4 ? qk_norm_rope_cache_vec_kernel<T_, TC, W, 4>
                            : qk_norm_rope_cache_vec_kernel<T_, TC, W, 8>;
        launch(kernel, grid, warps * 32, vec ? 0 : warps * D * sizeof(float), stream(),
               q_out.ptr<T_>(), qkv.ptr<T_>(), positions.ptr<int32_t>(),
               cos_sin_cache.ptr<float>(), cos_sin_cache.shape[0], static_cast<int>(rot_dim),
               qw, kw, eps, key_cache.ptr<TC>(), value_cache.ptr<TC>(),
               slot_mapping.ptr<int32_t>(), num_slots, static_cast<int>(num_heads),
               static_cast<int>(nkv), static_cast<int>(D), qkv.stride[0], q_out.stride[0],
               is_neox);
      };
      if (q_norm.defined() && q_norm.dtype == DType::F32)
        run(float{});
      else
        run(T_{});
    });
  });
  check_launch("qk_norm_rope_cache kernel");
}

void copy_columns(const Tensor& out, int64_t out_col, const Tensor& x, int64_t x_col,
                  int64_t n, int64_t heads, int64_t out_head_stride, int64_t x_head_stride) {
  // The shapes and column ranges are the op's contract (csrc/ops.cpp).
  const int64_t item = type_traits(x.dtype).type_size, rows = x.shape[0];
  if (rows == 0 || n == 0) return;
  char* o = static_cast<char*>(out.data) + out_col * item;
  const char* s = static_cast<const char*>(x.data) + x_col * item;
  if (heads == 1) {
    memcpy_2d_d2d(o, out.stride[0] * item, s, x.stride[0] * item, n * item, rows);
    return;
  }
  // Byte quantities the copy unit must divide: addresses, strides and the piece's length.
  const int64_t bytes[] = {static_cast<int64_t>(reinterpret_cast<uintptr_t>(o) % 16),
                           static_cast<int64_t>(reinterpret_cast<uintptr_t>(s) % 16),
                           out.stride[0] * item, x.stride[0] * item, out_head_stride * item,
                           x_head_stride * item, n * item};
  int64_t unit = 16;
  for (const int64_t b : bytes)
    while (b % unit != 0) unit /= 2;
  auto run = [&](auto v) {
    using V = decltype(v);
    const int64_t u = sizeof(V), nv = n * item / u, total = rows * heads * nv;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
    launch(copy_heads_kernel<V>, blocks, 256, 0, stream(), reinterpret_cast<V*>(o),
           out.stride[0] * item / u, out_head_stride * item / u, reinterpret_cast<const V*>(s),
           x.stride[0] * item / u, x_head_stride * item / u, nv, heads, total);
  };
  if (unit == 16)
    run(uint4{});
  else if (unit == 8)
    run(uint2{});
  else if (unit == 4)
    run(uint32_t{});
  else if (unit == 2)
    run(uint16_t{});
  else
    run(uint8_t{});
  check_launch("copy_columns");
}

void scatter_tokens(const Tensor& out, const Tensor& dst, const Tensor& tokens,
                    const Tensor& src) {
  // dtypes and lengths are the op's contract (csrc/ops.cpp); the indices live on the device and
  // are range-checked by the kernel.
  const int64_t n = dst.shape[0];
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 1024));
  launch(scatter_tokens_kernel, blocks, 256, 0, stream(), out.ptr<int32_t>(), out.shape[0],
         dst.ptr<int32_t>(), tokens.ptr<int32_t>(), tokens.shape[0], src.ptr<int32_t>(), n);
  check_launch("scatter_tokens");
}

VLLMX_KERNEL(rotary, kCUDA, rotary);
VLLMX_KERNEL(silu_and_mul, kCUDA, silu_and_mul);
VLLMX_KERNEL(gelu_and_mul, kCUDA, gelu_and_mul);
VLLMX_KERNEL(gelu, kCUDA, gelu);
VLLMX_KERNEL(swigluoai_and_mul, kCUDA, swigluoai_and_mul);
VLLMX_KERNEL(relu2, kCUDA, relu2);
VLLMX_KERNEL(softcap, kCUDA, softcap);
VLLMX_KERNEL(sigmoid_gate, kCUDA, sigmoid_gate);
VLLMX_KERNEL(scale, kCUDA, scale);
VLLMX_KERNEL(fill_uniform, kCUDA, fill_uniform);
VLLMX_KERNEL(write_kv_cache, kCUDA, write_kv_cache);
VLLMX_KERNEL(qk_norm_rope_cache, kCUDA, qk_norm_rope_cache);
VLLMX_KERNEL(copy_columns, kCUDA, copy_columns);
VLLMX_KERNEL(scatter_tokens, kCUDA, scatter_tokens);

}  // namespace vllmx::cuda
