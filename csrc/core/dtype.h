// dtypes: dense element types and GGUF block types share one id space, GGML's, so a GGUF
// tensor's type id is its vllmx dtype. Later quant types slot into kTypeTraits by id.
#pragma once
#include <cstdint>

namespace vllmx {

enum class DType : int32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,  // activations only (for the *_1 weight types)
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,  // 4-bit codes through a 16-entry non-linear table (quant_nl.h)
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,  // ternary (quant_tq.h)
  TQ2_0 = 35,
  MXFP4 = 39,  // OCP microscaling FP4: E2M1 codes, one E8M0 scale per 32 (quant_nl.h)
  // Block weights repacked into panels of 16 rows for the CPU kernels (repack.h); not GGML ids.
  Q4_0_X16 = 64,
  Q4_1_X16 = 65,
  Q5_0_X16 = 66,
  Q5_1_X16 = 67,
  Q8_0_X16 = 68,
  Q4_K_X16 = 69,
  Q5_K_X16 = 70,
  Q6_K_X16 = 71,
  F32_X16 = 72,  // dense weights in panels of 16 rows: for each k, the 16 rows' k-th elements
  F16_X16 = 73,
  BF16_X16 = 74,
  // fp8 e4m3 (OCP E4M3FN: no infinities, NaN 0x7f / 0xff, largest 448): scaled_mm's operands.
  F8_E4M3 = 80,
  // fp8 weights for the GPU's scaled_mm, a row's K in blocks of one f32 scale and 128 e4m3
  // codes (a checkpoint's tensor, channel or 128 x 128 block scales written out per row);
  // uploaded as codes [N, K] beside scales [K / 128, N] (layers/placement.py).
  F8_E4M3_B128 = 81,
  U8 = 100,  // raw bytes (not a GGML type)
  U64 = 101,
};

struct TypeTraits {
  const char* name;
  int64_t block_size;  // elements per block (1 for dense types)
  int64_t type_size;   // bytes per block
  bool quantized;
  bool supported;      // vllmx has kernels for it
};

constexpr int kMaxDType = 128;
const TypeTraits& type_traits(DType t);
inline const char* dtype_name(DType t) { return type_traits(t).name; }
inline bool is_quantized(DType t) { return type_traits(t).quantized; }
// Bytes in a row of n elements (n must be a multiple of the block size).
inline int64_t row_bytes(DType t, int64_t n) {
  const TypeTraits& tt = type_traits(t);
  return n / tt.block_size * tt.type_size;
}

}  // namespace vllmx
