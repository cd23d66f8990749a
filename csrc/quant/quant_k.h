// GGUF k-quant block types (llama.cpp layouts): 256-element super-blocks split into 16- or
// 32-element sub-blocks with their own 4-, 6- or 8-bit scales. Weights pair with Q8_K
// activations (one f32 scale per 256 values plus the 16 sums of each 16-value group, which
// fold the Q2_K/Q4_K/Q5_K minimums into one integer dot).
#pragma once
#include <cstdint>

#include "core/half.h"
#include "quant/quant.h"

namespace vllmx {

constexpr int64_t QK_K = 256;
constexpr int K_SCALE_SIZE = 12;

// f16 values are stored as raw IEEE half bits.
struct block_q2_K {  // x = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4); 16 groups of 16
  uint8_t scales[QK_K / 16];
  uint8_t qs[QK_K / 4];  // 2-bit quants: byte j of a 32-byte half, shifts 0,2,4,6
  uint16_t d, dmin;
};
struct block_q3_K {  // x = d * (scale6[s] - 32) * (q2 - (hmask bit ? 0 : 4)); 16 groups of 16
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[12];  // 16 6-bit scales, packed
  uint16_t d;
};
struct block_q4_K {  // x = d * sc[s] * q - dmin * m[s]; 8 groups of 32, 6-bit sc/m packed
  uint16_t d, dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qs[QK_K / 2];
};
struct block_q5_K {  // like Q4_K with a fifth bit in qh
  uint16_t d, dmin;
  uint8_t scales[K_SCALE_SIZE];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
struct block_q6_K {  // x = d * scales[s] * (q - 32); 16 groups of 16
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  uint16_t d;
};
struct block_q8_K {  // activation type: x = q * d; bsums[g] = sum of qs[16g .. 16g+15]
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};
static_assert(sizeof(block_q2_K) == 84, "Q2_K block");
static_assert(sizeof(block_q3_K) == 110, "Q3_K block");
static_assert(sizeof(block_q4_K) == 144, "Q4_K block");
static_assert(sizeof(block_q5_K) == 176, "Q5_K block");
static_assert(sizeof(block_q6_K) == 210, "Q6_K block");
static_assert(sizeof(block_q8_K) == 292, "Q8_K block");

// Sub-block j (0..7) scale and min of a Q4_K/Q5_K `scales` field (llama.cpp's get_scale_min_k4).
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// The f32 part of a k-quant super-block's dot with Q8_K, from its exact integer sums isum and
// imin: one expression for every path (the scalar twin and each SIMD level), so all agree bit
// for bit.
template <bool kHasMin, class W>
inline float combine_k(float sumf, const W& w, float dx, int isum, int imin) {
  sumf += (f16_to_f32(w.d) * dx) * static_cast<float>(isum);
  if constexpr (kHasMin) sumf -= (f16_to_f32(w.dmin) * dx) * static_cast<float>(imin);
  return sumf;
}

// The same for the types whose super-block dot is one exact int32 (IQ4_XS, TQ1_0, TQ2_0).
inline float accumulate_q8_K(float sumf, float dw, float dx, int isum) {
  return sumf + (dw * dx) * static_cast<float>(isum);
}

// quant_k.cpp: dequantization (bit-exact with gguf.quants) and Q8_K activation quantization.
void dequantize_row_q2_K(const void* src, float* dst, int64_t n);
void dequantize_row_q3_K(const void* src, float* dst, int64_t n);
void dequantize_row_q4_K(const void* src, float* dst, int64_t n);
void dequantize_row_q5_K(const void* src, float* dst, int64_t n);
void dequantize_row_q6_K(const void* src, float* dst, int64_t n);
void dequantize_row_q8_K(const void* src, float* dst, int64_t n);
// llama.cpp's quantize_row_q8_K_ref: d = max / -127 (signed max-magnitude value),
// q = min(127, nearest_int(x / d)).
void quantize_row_q8_K_ref(const float* x, void* y, int64_t n);
void quantize_row_q8_K(const float* x, void* y, int64_t n);  // same bits, SIMD where present

// quant_k_dot.cpp: scalar twins and the run-time pick (arch/x86/quant_k_dot.cpp: the SIMD ones).
float vec_dot_q2_K_q8_K_ref(int64_t n, const void* w, const void* x);
float vec_dot_q3_K_q8_K_ref(int64_t n, const void* w, const void* x);
float vec_dot_q4_K_q8_K_ref(int64_t n, const void* w, const void* x);
float vec_dot_q5_K_q8_K_ref(int64_t n, const void* w, const void* x);
float vec_dot_q6_K_q8_K_ref(int64_t n, const void* w, const void* x);
VecDotFn select_vec_dot_k(DType t);  // nullptr for a non-k-quant type
VecDotRowsFn select_vec_dot_rows_k(DType t);  // nullptr where there is none

}  // namespace vllmx
