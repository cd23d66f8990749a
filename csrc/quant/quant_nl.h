// GGUF block types whose 4-bit codes index a 16-entry table of int8 values (llama.cpp layouts):
//   IQ4_NL  32 values, one f16 scale                    x = d * kvalues_iq4nl[code]
//   IQ4_XS  256 values, f16 d and a 6-bit scale per 32  x = d * (ls - 32) * kvalues_iq4nl[code]
//   MXFP4   32 values, one E8M0 scale                   x = 2^(e-128) * kvalues_mxfp4[code]
// In a 32-value (sub-)block, byte j of qs holds value j in its low nibble and value j + 16 in its
// high nibble. The table values are integers, so dot products with 8-bit activations stay
// integer per block: IQ4_NL and MXFP4 pair with Q8_0, IQ4_XS with Q8_K (as in llama.cpp).
#pragma once
#include <cstdint>

#include "core/half.h"
#include "quant/quant.h"

namespace vllmx {

constexpr int64_t QK4_NL = 32;
constexpr int64_t QK_MXFP4 = 32;

// IQ4_NL's non-linear grid; MXFP4's is E2M1 doubled (0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6 times 2),
// which the E8M0 scale halves back (e8m0_to_f32_half).
inline constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

struct block_iq4_nl {
  uint16_t d;  // f16
  uint8_t qs[QK4_NL / 2];
};
struct block_iq4_xs {
  uint16_t d;         // f16
  uint16_t scales_h;  // bits 2ib, 2ib+1: high 2 bits of sub-block ib's scale
  uint8_t scales_l[4];  // nibble ib % 2 of byte ib / 2: low 4 bits of sub-block ib's scale
  uint8_t qs[128];      // 16 bytes per 32-value sub-block
};
struct block_mxfp4 {
  uint8_t e;  // E8M0 exponent
  uint8_t qs[QK_MXFP4 / 2];
};
static_assert(sizeof(block_iq4_nl) == 18, "IQ4_NL block");
static_assert(sizeof(block_iq4_xs) == 136, "IQ4_XS block");
static_assert(sizeof(block_mxfp4) == 17, "MXFP4 block");

// 2^(e - 128): the E8M0 scale times 1/2, undoing the doubled table (ggml's
// GGML_E8M0_TO_FP32_HALF; e < 2 gives the subnormals 2^-129 and 2^-128).
inline float e8m0_to_f32_half(uint8_t e) {
  return bits_to_f32(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

// The 6-bit scale of IQ4_XS sub-block ib, minus 32.
inline int iq4_xs_scale(const block_iq4_xs& b, int ib) {
  const int lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
  const int hi = (b.scales_h >> (2 * ib)) & 3;
  return (lo | (hi << 4)) - 32;
}

// Block scales as f32 (exact).
inline float nl_scale(const block_iq4_nl& b) { return f16_to_f32(b.d); }
inline float nl_scale(const block_mxfp4& b) { return e8m0_to_f32_half(b.e); }
inline const int8_t* nl_table(const block_iq4_nl*) { return kvalues_iq4nl; }
inline const int8_t* nl_table(const block_mxfp4*) { return kvalues_mxfp4; }

// The f32 part of every IQ4_NL / MXFP4 dot, on every path: 16 lanes; block i adds its int32
// partial sums p[k] (products 4k..4k+3, k < 8) times d_w * d_x to lanes 8 (i % 2) + k (AVX-512's
// two blocks per register, AVX2's two accumulators), then this fixed pairwise reduction. So the
// scalar twin and each SIMD level agree bit for bit.
inline float reduce_lanes16(const float* a) {
  float s8[8];
  for (int k = 0; k < 8; ++k) s8[k] = a[k] + a[k + 8];
  const float s4[4] = {s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]};
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// Dequantization, bit-exact with gguf.quants (quant_nl.cpp).
void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n);
void dequantize_row_mxfp4(const void* src, float* dst, int64_t n);

// Scalar twins (quant_nl.cpp). Every SIMD path (arch/x86/quant_nl_dot.cpp) returns the same
// bits: the integer sums are exact, and the f32 part is reduce_lanes16 (IQ4_NL, MXFP4) or
// accumulate_q8_K (IQ4_XS, quant_k.h).
float vec_dot_iq4_nl_q8_0_ref(int64_t n, const void* w, const void* x);
float vec_dot_mxfp4_q8_0_ref(int64_t n, const void* w, const void* x);
float vec_dot_iq4_xs_q8_K_ref(int64_t n, const void* w, const void* x);

// Fills the QuantTraits entries of IQ4_NL, IQ4_XS and MXFP4 (called by quant.cpp's table).
void register_quant_nl(QuantTraits* table);

}  // namespace vllmx
