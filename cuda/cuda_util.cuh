// Shared by the .cu files: error checks, the op stream, dtype conversion and dispatch, and the
// argument checks every CUDA op repeats (device, dtype, row-major rows).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "runtime.h"
#include "core/tensor.h"

namespace vllmx::cuda {

// A failed CUDA call becomes std::runtime_error naming the call and CUDA's error string.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e) +
                             " (" + cudaGetErrorName(e) + ")");
}
// After a kernel launch: a bad configuration shows up here (execution errors surface later).
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

inline cudaStream_t stream() { return static_cast<cudaStream_t>(current_stream()); }

// Whether p is a multiple of `bytes` (vector loads, cp.async, TMA).
inline bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// ---- programmatic dependent launch (Hopper) ----
// A decode step is ~15 short dependent kernels per layer; between two of them the GPU drains
// one grid and only then launches the next. Launched by launch() on sm_90, a kernel may be set
// up while its predecessor drains: pdl_begin(), its first statement, waits until the
// predecessor has finished and its writes are visible (so nothing is read or written early),
// then lets the successor start launching. Elsewhere both are no-ops and launch() is <<<>>>.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

bool pdl_supported();  // the current device is compute capability 9.0 or newer (runtime.cu)

template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_supported() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
  // A refused launch also sets the thread's last error: cleared here, where it is reported, or
  // the next op's check_launch would fail on it too (a Q5_K launch without its shared-memory
  // opt-in once failed the Q6_K test run after it).
  if (e != cudaSuccess) (void)cudaGetLastError();
  check_cuda(e, "cudaLaunchKernelEx");
}

inline void check_on_device(const Tensor& t, const char* op, const char* name) {
  if (t.defined() && t.device != kCUDA)
    fail(op, std::string(name) + " " + t.str() + " is not on the GPU");
}
// Dense rows: the last dim contiguous (rows may be strided, like vLLM's q/k/v views).
inline void check_rows(const Tensor& t, const char* op, const char* name) {
  check_on_device(t, op, name);
  if (t.ndim >= 1 && t.stride[t.ndim - 1] != 1 && t.shape[t.ndim - 1] > 1)
    fail(op, std::string(name) + " " + t.str() + " must be contiguous in its last dim");
}
inline bool is_float_act(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }
inline void check_act(const Tensor& t, const char* op, const char* name) {
  if (!is_float_act(t.dtype))
    fail(op, std::string(name) + " must be f32, f16 or bf16, got " + t.str());
}

// ---- element conversion (f32 math; stores round to nearest even) ----
template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// V consecutive elements of T in one access (16 bytes at most each: V * sizeof(T) of 32 takes
// two), the pointer aligned to min(16, V * sizeof(T)) bytes.
template <typename T, int V>
struct alignas(V * sizeof(T) < 16 ? V * sizeof(T) : 16) RegRow {
  T e[V];
  __device__ __forceinline__ static void load(const T* p, float* f) {
    const RegRow r = *reinterpret_cast<const RegRow*>(p);
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = to_f32(r.e[j]);
  }
  __device__ __forceinline__ static void store(T* p, const float* f) {
    RegRow r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.e[j] = from_f32<T>(f[j]);
    *reinterpret_cast<RegRow*>(p) = r;
  }
};

// 16 bytes of T (8 halves or 4 floats) in f32: one vector load or store for the memory-bound
// kernels, which otherwise issue a 2-byte access per element and stay far below HBM bandwidth.
template <typename T>
struct Vec16 {
  static constexpr int N = 16 / sizeof(T);
  float f[N];
  __device__ __forceinline__ void load(const T* p) { RegRow<T, N>::load(p, f); }
  __device__ __forceinline__ void store(T* p) const { RegRow<T, N>::store(p, f); }
};
// f(r, i) for each Vec16<T> of a rows x d matrix (d a multiple of Vec16<T>::N; i the vector's
// first column), over the grid's threads.
template <typename T, typename F>
__device__ __forceinline__ void for_vec16(int64_t rows, int64_t d, F&& f) {
  constexpr int V = Vec16<T>::N;
  const int64_t dv = d / V, n = rows * dv;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(e / dv, e % dv * V);
}
// Whether rows of T at p with this stride (elements) take Vec16 accesses at every multiple of
// Vec16<T>::N.
template <typename T>
inline bool vec16_ok(const void* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % Vec16<T>::N == 0;
}

// Calls f(T{}) with T the element type of a float dtype (f32 / f16 / bf16).
template <typename F>
void dispatch_float(DType d, const char* op, F&& f) {
  switch (d) {
    case DType::F32: f(float{}); break;
    case DType::F16: f(__half{}); break;
    case DType::BF16: f(__nv_bfloat16{}); break;
    default: fail(op, std::string("unsupported dtype ") + dtype_name(d));
  }
}

// Calls f(ST{}) with ST a hybrid mixer's state element type: f32, or the activations' T (the
// ops' contract, check_state_args in csrc/ops.cpp, allows no other).
template <typename T, typename F>
void dispatch_state(DType state, F&& f) {
  if (state == DType::F32)
    f(float{});
  else if constexpr (!std::is_same_v<T, float>)
    f(T{});
}

// softplus(x) = log(1 + e^x), x itself past 20 (torch's threshold): the hybrid mixers' dt.
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// ---- gated activations: act(gate) * up (silu_and_mul, gelu_and_mul, the gated GEMV) ----
enum class Act : int { kSilu = 0, kGeluErf = 1, kGeluTanh = 2 };

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

// gpt-oss's clamped SwiGLU (vLLM's swigluoai_and_mul) of a gate and an up value, and squared
// ReLU (Nemotron-H): the elementwise ops and fused_experts' activation share them.
__device__ __forceinline__ float swigluoai(float g, float u, float alpha, float limit) {
  g = fminf(g, limit);
  u = fminf(fmaxf(u, -limit), limit);
  return g / (1.f + expf(-alpha * g)) * (u + 1.f);
}
__device__ __forceinline__ float squared_relu(float x) {
  x = fmaxf(x, 0.f);
  return x * x;
}

namespace detail {
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ inline float block_sum(float v) {
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
}  // namespace detail

// Threads for a block walking n items a row: a power of two from 32 to 1024.
inline int threads_for(int64_t n) {
  int t = 32;
  while (t < 1024 && t < n) t *= 2;
  return t;
}

// ---- block reductions (every thread of the block calls them; all get the block's result) ----
// A value of any 4-byte-multiple type exchanged across lanes word by word (an index, a
// (value, id) pair).
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask) {
  static_assert(sizeof(T) % 4 == 0, "shfl_xor moves 32-bit words");
  int w[sizeof(T) / 4];
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 4); ++i)
    w[i] = __shfl_xor_sync(0xffffffffu, w[i], lane_mask);
  memcpy(&v, w, sizeof(T));
  return v;
}

// op over the block's kThreads values: a butterfly in each warp, then the warps' results in
// warp order, so the result's bits do not depend on timing. op must be associative.
template <int kThreads, typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  static_assert(kThreads % 32 == 0, "whole warps");
  __shared__ T part[kThreads / 32];
  __syncthreads();  // the previous call's readers are done with part
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = part[0];
  for (int w = 1; w < kThreads / 32; ++w) r = op(r, part[w]);
  return r;
}
struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

inline unsigned int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned int>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

}  // namespace vllmx::cuda
