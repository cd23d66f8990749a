// IQ2_XXS, IQ2_XS, IQ2_S: 8 weights per grid entry (bytes 8, 25 or 43), explicit signs, 4-bit
// scales s with w = d * (0.5 + s) / 4 * grid * sign = d / 8 * (2 s + 1) * (grid * sign).
// Dequantization rounds each weight exactly as gguf.quants does: (db * grid) * sign with
// db = d * (0.5 + s) * 0.25 in f32; the dot products use the integer form (quant_iq2.h,
// quant_iq_kernel.h; the SIMD ones are in arch/x86/quant_iq.cpp).
#include "core/kernel_pragmas.h"

#include "quant/quant_iq2.h"

namespace vllmx {

namespace iq2 {
namespace {

inline float sign_f(uint32_t bits, int j) { return (bits >> j) & 1 ? -1.0f : 1.0f; }
inline float db_iq2(float d, int s) { return d * (0.5f + static_cast<float>(s)) * 0.25f; }

// 8 weights of one grid entry with their sign byte, dequantized.
inline void put8(float db, uint64_t g, uint32_t signs, float* y) {
  for (int j = 0; j < 8; ++j) y[j] = db * static_cast<float>(grid_byte(g, j)) * sign_f(signs, j);
}

// ---- dequantization ----

void dequantize_row_iq2_xxs(const void* src, float* y, int64_t n) {
  const block_iq2_xxs* b = static_cast<const block_iq2_xxs*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t a0, a1;
      Iq2xxs::words(b[i], ib, a0, a1);
      const float db = db_iq2(d, static_cast<int>(a1 >> 28));
      for (int l = 0; l < 4; ++l, y += 8)
        put8(db, iq2xxs_grid[(a0 >> (8 * l)) & 255], Iq2xxs::signs(a1, l), y);
    }
  }
}

void dequantize_row_iq2_xs(const void* src, float* y, int64_t n) {
  const block_iq2_xs* b = static_cast<const block_iq2_xs*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int k = 0; k < 32; ++k, y += 8) {
      const float db = db_iq2(d, nibble(b[i].scales, k / 2));
      put8(db, iq2xs_grid[b[i].qs[k] & 511], ksigns_iq2xs[b[i].qs[k] >> 9], y);
    }
  }
}

void dequantize_row_iq2_s(const void* src, float* y, int64_t n) {
  const block_iq2_s* b = static_cast<const block_iq2_s*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int k = 0; k < 32; ++k, y += 8) {
      const float db = db_iq2(d, nibble(b[i].scales, k / 2));
      put8(db, iq2s_grid[Iq2s::index(b[i], k)], b[i].signs[k], y);
    }
  }
}

}  // namespace
}  // namespace iq2

bool iq2_kernels(DType t, IqKernels* k) {
  switch (t) {
    case DType::IQ2_XXS: *k = iq::kernels<iq2::Iq2xxs>(t, iq2::dequantize_row_iq2_xxs); return true;
    case DType::IQ2_XS: *k = iq::kernels<iq2::Iq2xs>(t, iq2::dequantize_row_iq2_xs); return true;
    case DType::IQ2_S: *k = iq::kernels<iq2::Iq2s>(t, iq2::dequantize_row_iq2_s); return true;
    default: return false;
  }
}

}  // namespace vllmx
