// GGUF ternary block types (llama.cpp layouts; BitNet b1.58-style weights), 256 values per block,
// one f16 scale, x = d * (t - 1) with a code t in {0, 1, 2} (TQ2_0's 2-bit field can also hold 3):
//   TQ1_0  five trits per byte, base 3 as a fixed-point fraction: trit n of byte b is
//          floor(3 * (b * 3^n mod 256) / 256). qs[0..31] carry values 32n + j, qs[32..47]
//          values 160 + 16n + j, qh[0..3] values 240 + 4n + j (n = 0..3).
//   TQ2_0  2 bits per value: value 128c + 32l + j in bits 2l of qs[32c + j].
// Both pair with Q8_K: sum (t - 1) y = sum t y - sum y, and Q8_K carries sum y (bsums).
#pragma once
#include <cstdint>

#include "quant/quant.h"

namespace vllmx {

struct block_tq1_0 {
  uint8_t qs[48];
  uint8_t qh[4];
  uint16_t d;  // f16
};
struct block_tq2_0 {
  uint8_t qs[64];
  uint16_t d;  // f16
};
static_assert(sizeof(block_tq1_0) == 54, "TQ1_0 block");
static_assert(sizeof(block_tq2_0) == 66, "TQ2_0 block");

// Dequantization, bit-exact with gguf.quants.
void dequantize_row_tq1_0(const void* src, float* dst, int64_t n);
void dequantize_row_tq2_0(const void* src, float* dst, int64_t n);

// Scalar twins; the SIMD paths (arch/x86/quant_tq.cpp) return the same bits (exact int32 per
// block, one f32 accumulate_q8_K).
float vec_dot_tq1_0_q8_K_ref(int64_t n, const void* w, const void* x);
float vec_dot_tq2_0_q8_K_ref(int64_t n, const void* w, const void* x);

// Fills the QuantTraits entries of TQ1_0 and TQ2_0 (called by quant.cpp's table).
void register_quant_tq(QuantTraits* table);

}  // namespace vllmx
