// GGUF block types (llama.cpp layouts) and the per-type kernel table.
//
// A weight row of a block type is a run of blocks; dot products with activations go through an
// 8-bit activation type (Q8_0 / Q8_1) like ggml's `vec_dot_type`: the activation row is
// quantized once, then each weight row is dotted against it with integer arithmetic. New types
// (k-quants, i-quants) slot in by adding their block struct and a QuantTraits entry.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace vllmx {

constexpr int64_t QK4_0 = 32;
constexpr int64_t QK4_1 = 32;
constexpr int64_t QK5_0 = 32;
constexpr int64_t QK5_1 = 32;
constexpr int64_t QK8_0 = 32;
constexpr int64_t QK8_1 = 32;

// f16 values are stored as raw IEEE half bits.
struct block_q4_0 {  // x = (q - 8) * d; qs[j] low nibble: element j, high nibble: element j+16
  uint16_t d;
  uint8_t qs[QK4_0 / 2];
};
struct block_q4_1 {  // x = q * d + m
  uint16_t d, m;
  uint8_t qs[QK4_1 / 2];
};
struct block_q5_0 {  // x = (q - 16) * d; bit e of qh (little-endian u32) is bit 4 of element e
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[QK5_0 / 2];
};
struct block_q5_1 {  // x = q * d + m
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[QK5_1 / 2];
};
struct block_q8_0 {  // x = q * d
  uint16_t d;
  int8_t qs[QK8_0];
};
struct block_q8_1 {  // x = q * d; s = d * sum(qs) (activation format of the *_1 types)
  uint16_t d, s;
  int8_t qs[QK8_1];
};
static_assert(sizeof(block_q4_0) == 18, "Q4_0 block");
static_assert(sizeof(block_q4_1) == 20, "Q4_1 block");
static_assert(sizeof(block_q5_0) == 22, "Q5_0 block");
static_assert(sizeof(block_q5_1) == 24, "Q5_1 block");
static_assert(sizeof(block_q8_0) == 34, "Q8_0 block");
static_assert(sizeof(block_q8_1) == 36, "Q8_1 block");

// A little-endian u32 field of a block (qh of Q5_0 / Q5_1, the packed words of the i-quants).
inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// n elements of a row of `src` (blocks) -> f32.
using ToFloatFn = void (*)(const void* src, float* dst, int64_t n);
// n f32 -> a row of blocks (activation types).
using FromFloatFn = void (*)(const float* src, void* dst, int64_t n);
// Dot product of n elements: a weight row (blocks) with an activation row of vec_dot_type.
using VecDotFn = float (*)(int64_t n, const void* w, const void* x);

// One weight row against nrows (1..kDotRows) activation rows x_stride bytes apart:
// out[r * out_stride] = vec_dot(n, w, x + r * x_stride). Bit-identical to vec_dot per row.
constexpr int kDotRows = 4;
using VecDotRowsFn = void (*)(int64_t n, const void* w, const void* x, int64_t x_stride,
                              int nrows, float* out, int64_t out_stride);

struct QuantTraits {
  ToFloatFn to_float = nullptr;        // bit-exact with gguf.quants.dequantize
  FromFloatFn from_float = nullptr;    // fastest path (bit-equal to from_float_ref)
  FromFloatFn from_float_ref = nullptr;  // llama.cpp's scalar reference
  VecDotFn vec_dot = nullptr;          // fastest path the CPU supports (picked once)
  VecDotFn vec_dot_ref = nullptr;      // plain scalar twin
  VecDotRowsFn vec_dot_rows = nullptr;  // multi-row form of vec_dot, where a SIMD path has one
  DType vec_dot_type = DType::F32;     // activation type the weight pairs with
};

// F8_E4M3_B128's dequantization into the table (csrc/quant/fp8.cpp).
void register_quant_fp8(QuantTraits* table);

// The table entry of a block type, or nullptr where vllmx has no kernels for it.
const QuantTraits* quant_traits(DType t);

// Dequantizes n elements of one row: F32/F16/BF16 or any supported block type. Throws
// std::invalid_argument for an unsupported type or n not a multiple of the block size.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// llama.cpp's quantize_row_q8_0/_q8_1 (reference): d = amax / 127, q = roundf(x / d).
void quantize_row_q8_0_ref(const float* x, void* y, int64_t n);
void quantize_row_q8_1_ref(const float* x, void* y, int64_t n);
// Same results, SIMD where the CPU has it.
void quantize_row_q8_0(const float* x, void* y, int64_t n);
void quantize_row_q8_1(const float* x, void* y, int64_t n);

// Scalar and SIMD vec_dot kernels (quant_dot.cpp).
float vec_dot_q4_0_q8_0_ref(int64_t n, const void* w, const void* x);
float vec_dot_q4_1_q8_1_ref(int64_t n, const void* w, const void* x);
float vec_dot_q5_0_q8_0_ref(int64_t n, const void* w, const void* x);
float vec_dot_q5_1_q8_1_ref(int64_t n, const void* w, const void* x);
float vec_dot_q8_0_q8_0_ref(int64_t n, const void* w, const void* x);
// The fastest kernel for a weight type on this CPU (nullptr if none).
VecDotFn select_vec_dot(DType t);
VecDotRowsFn select_vec_dot_rows(DType t);  // nullptr where there is none

}  // namespace vllmx
