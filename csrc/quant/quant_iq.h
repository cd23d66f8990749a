// GGUF i-quants of the IQ1/IQ2/IQ3 families (llama.cpp layouts): 256-value super-blocks whose
// weights are points of a fixed lattice (iq1_grids.h, iq2_grids.h, iq3_grids.h), 8 (IQ1/IQ2)
// or 4 (IQ3) weights per grid index, with explicit sign bits (IQ2/IQ3) or a +-1/8 shift (IQ1)
// and 3- or 4-bit sub-block scales. Like the k-quants they stay in block form and pair with
// Q8_K activations.
//
// Every weight is an integer times a per-block f32 factor: w = d * kFactor * scale[g] * q with
// small integers scale (per 16 weights) and q (grid value * sign, or 8 * grid +- 1 for IQ1), so a
// super-block's dot product with Q8_K is one exact int32 (quant_iq_kernel.h).
#pragma once
#include <cstdint>

#include "quant/quant_k.h"

namespace vllmx {

// f16 values are stored as raw IEEE half bits.
struct block_iq2_xxs {  // per 32: u32 of 4 grid bytes, u32 of 4 x 7 sign bits + 4-bit scale
  uint16_t d;
  uint16_t qs[QK_K / 8];
};
struct block_iq2_xs {  // per 8: u16 = 9-bit grid index | 7 sign bits << 9; 4-bit scale per 16
  uint16_t d;
  uint16_t qs[QK_K / 8];
  uint8_t scales[QK_K / 32];
};
struct block_iq2_s {  // per 8: 10-bit grid index (qs + 2 bits of qh), a byte of signs
  uint16_t d;
  uint8_t qs[QK_K / 8];     // llama.cpp's qs[QK_K / 4] holds these and then `signs`
  uint8_t signs[QK_K / 8];  // bit e % 8 of byte e / 8: weight e is negative
  uint8_t qh[QK_K / 32];
  uint8_t scales[QK_K / 32];
};
struct block_iq3_xxs {  // per 4: grid byte; per 32: u32 of 4 x 7 sign bits + 4-bit scale
  uint16_t d;
  uint8_t qs[QK_K / 4];
  uint8_t scales_signs[QK_K / 8];  // llama.cpp keeps these in qs[QK_K / 4 ..]
};
struct block_iq3_s {  // per 4: 9-bit grid index (qs + a bit of qh); sign bits; 4-bit scale per 32
  uint16_t d;
  uint8_t qs[QK_K / 4];
  uint8_t qh[QK_K / 32];
  uint8_t signs[QK_K / 8];
  uint8_t scales[QK_K / 64];
};
struct block_iq1_s {  // per 8: 11-bit grid index; per 32: u16 qh = 4 x 3 index bits, scale, sign
  uint16_t d;
  uint8_t qs[QK_K / 8];
  uint16_t qh[QK_K / 32];
};
struct block_iq1_m {  // per 8: 11-bit index + delta sign (qh nibble); 3-bit scale per 16
  uint8_t qs[QK_K / 8];
  uint8_t qh[QK_K / 16];
  uint8_t scales[QK_K / 32];  // 4 u16: 12 bits of scales each, the top nibbles make d (f16)
};
static_assert(sizeof(block_iq2_xxs) == 66, "IQ2_XXS block");
static_assert(sizeof(block_iq2_xs) == 74, "IQ2_XS block");
static_assert(sizeof(block_iq2_s) == 82, "IQ2_S block");
static_assert(sizeof(block_iq3_xxs) == 98, "IQ3_XXS block");
static_assert(sizeof(block_iq3_s) == 110, "IQ3_S block");
static_assert(sizeof(block_iq1_s) == 50, "IQ1_S block");
static_assert(sizeof(block_iq1_m) == 56, "IQ1_M block");

// The kernels of one i-quant type (all pair with Q8_K activations).
struct IqKernels {
  ToFloatFn to_float = nullptr;  // bit-exact with gguf.quants.dequantize
  VecDotFn vec_dot = nullptr;    // fastest path the CPU supports (picked once)
  VecDotFn vec_dot_ref = nullptr;  // plain scalar twin
  VecDotRowsFn vec_dot_rows = nullptr;  // nullptr where there is no SIMD path
};

// quant_iq2.cpp, quant_iq3.cpp, quant_iq1.cpp. Each returns false for a type not of its family.
bool iq2_kernels(DType t, IqKernels* k);
bool iq3_kernels(DType t, IqKernels* k);
bool iq1_kernels(DType t, IqKernels* k);

}  // namespace vllmx
