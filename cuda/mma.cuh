// Device helpers shared by the tensor-core kernels (linear.cu, attention.cu): cp.async,
// ldmatrix, mma.sync m16n8k16 (f16/bf16 in, f32 accumulate; sm_80+), 16-bit conversions chosen
// at run time, and two host-side launch helpers. Plain sm_80 PTX, so the same code runs on
// Ampere and Hopper.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "cuda_util.cuh"  // warp_sum

namespace vllmx::cuda::detail {

// ------------------------------------------------------------------ host side

// Multiprocessor count of the current device (read once per process; one device for now).
inline int num_sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
      v = 132;  // an H100/H200; only a launch-shape hint
    return v;
  }();
  return n;
}

// The shared memory a block may opt into on the current device (read once per process): 227 KB
// on Hopper, 163 KB on an A100, 99 KB on other Ampere / Ada parts.
inline int max_smem_optin() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      v = 0;
    return v;
  }();
  return n;
}

// Whether the sm_90a kernels (the CUTLASS GEMM, the wgmma prefill attention) run: compute
// capability 9.0 exactly, the only one their cubins run on, unless the environment variable
// VLLMX_CUDA_SM90=0 keeps the sm_80 kernels (so the tests run both families on one Hopper GPU,
// as VLLMX_ISA does for the CPU's SIMD levels). Read once per process; one device for now.
inline bool sm90_kernels() {
  static const bool v = [] {
    const char* env = std::getenv("VLLMX_CUDA_SM90");
    if (env != nullptr && env[0] == '0' && env[1] == '\0') return false;
    int dev = 0, major = 0, minor = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
           major == 9 && minor == 0;
  }();
  return v;
}

// Raises a kernel's dynamic shared-memory limit once: needed where the dynamic and the
// kernel's static shared memory together pass 48 KB (the quantized skinny GEMM's Q5_K stages
// came to exactly 48 KB beside a 16-byte static flag: launched without it, they failed with
// cudaErrorInvalidValue).
template <typename Kernel>
inline void allow_smem(Kernel kernel, int bytes) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess ||
      bytes + attr.sharedSizeBytes > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// ------------------------------------------------------------------ 16-bit element types

template <typename T>
struct F16Ops;
template <>
struct F16Ops<__half> {
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ uint32_t pack2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <>
struct F16Ops<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ uint32_t pack2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// Raw 16-bit patterns <-> f32, the type chosen at run time (is_bf16).
__device__ __forceinline__ float bits_to_float(uint16_t v, bool is_bf16) {
  return is_bf16 ? __uint_as_float(static_cast<uint32_t>(v) << 16)
                 : __half2float(__ushort_as_half(v));
}
__device__ __forceinline__ uint16_t float_to_bits(float v, bool is_bf16) {
  return is_bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v))
                 : __half_as_ushort(__float2half_rn(v));
}
// Two raw halves of a 32-bit word -> f32.
__device__ __forceinline__ void unpack2(uint32_t w, bool is_bf16, float& a, float& b) {
  a = bits_to_float(static_cast<uint16_t>(w & 0xffff), is_bf16);
  b = bits_to_float(static_cast<uint16_t>(w >> 16), is_bf16);
}
__device__ __forceinline__ uint32_t pack2_bits(float a, float b, bool is_bf16) {
  return static_cast<uint32_t>(float_to_bits(a, is_bf16)) |
         (static_cast<uint32_t>(float_to_bits(b, is_bf16)) << 16);
}
// 8 raw halves (one 16-byte vector) -> f32.
__device__ __forceinline__ void unpack8(const uint4& v, bool is_bf16, float (&f)[8]) {
  unpack2(v.x, is_bf16, f[0], f[1]);
  unpack2(v.y, is_bf16, f[2], f[3]);
  unpack2(v.z, is_bf16, f[4], f[5]);
  unpack2(v.w, is_bf16, f[6], f[7]);
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8], bool is_bf16) {
  return make_uint4(pack2_bits(f[0], f[1], is_bf16), pack2_bits(f[2], f[3], is_bf16),
                    pack2_bits(f[4], f[5], is_bf16), pack2_bits(f[6], f[7], is_bf16));
}

// ------------------------------------------------------------------ async copies, ldmatrix, mma

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; when !pred the destination is zero-filled and src is not read
// (it must still be a valid address).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(n));
}
// 4 bytes global -> shared, zero-filled when !pred (src still a valid address).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool pred) {
  const int n = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Two 8x8 matrices, transposed: lanes 0-15 give the rows' addresses (16-31 are ignored).
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}

// c[16x8] += a[16x16] (row) * b[16x8] (col); fragments as in the PTX ISA's m16n8k16 layout.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// f32 -> TF32 (round to nearest, ties away), the m16n8k8 TF32 mma's operand.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// c[16x8] += a[16x8] (row) * b[8x8] (col) in TF32 with f32 accumulation; fragments as in the
// PTX ISA's m16n8k8 .tf32 layout (a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4);
// b0 (t, g), b1 (t + 4, g); c as m16n8k16's), g = lane / 4, t = lane % 4.
__device__ __forceinline__ void mma1688_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma16816 into a zero accumulator (c's old values not read): one instruction whose C is RZ.
template <typename T>
__device__ __forceinline__ void mma16816_zero(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  constexpr bool kBf = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (kBf)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace vllmx::cuda::detail
