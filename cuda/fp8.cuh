// One warp's 128-wide group of values to fp8 e4m3, vLLM's per_token_group_quant_fp8 rule: the
// group's |max| by shuffles, the scale max(amax, 1e-10) / 448, each value divided by it,
// saturated and rounded to nearest even (cvt.rn.satfinite); the CPU twin, csrc/quant/fp8.cpp,
// gives the same codes bit for bit. Shared by cuda/fp8.cu and fused_experts' fp8 experts.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

namespace vllmx::cuda {

constexpr int kFp8GroupValues = 128;  // a warp's four values a lane

// vLLM's scale of a group whose largest magnitude is amax, and a value's code under it.
__device__ __forceinline__ float fp8_group_scale(float amax) {
  return fmaxf(amax, 1e-10f) / 448.f;
}
__device__ __forceinline__ uint32_t fp8_code(float v, float scale) {
  // A zero dividend sends the IEEE division down its slow path (FCHK: a subnormal-like
  // exponent), and zeros are common (padding rows, relu): divide 1 instead and keep the zero,
  // whose code is that of 0 / scale (the sign kept). fp8_linear's decode kernel ran 3x slower
  // at one token than at eight before this (the 7 empty token columns of its mma tile).
  const float q = (v == 0.f ? 1.f : v) / scale;
  const float c = fminf(fmaxf(v == 0.f ? v : q, -448.f), 448.f);
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(c, __NV_SATFINITE, __NV_E4M3));
}

// v: this lane's four values of the group. Returns their codes packed (the first in the low
// byte); *scale: the group's scale, on every lane.
__device__ __forceinline__ uint32_t warp_quant_fp8_group(const float (&v)[4], float* scale) {
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = fp8_group_scale(amax);
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) packed |= fp8_code(v[i], s) << (8 * i);
  *scale = s;
  return packed;
}

}  // namespace vllmx::cuda
