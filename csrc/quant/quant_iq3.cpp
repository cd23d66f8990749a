// IQ3_XXS, IQ3_S: 4 weights per grid entry, explicit signs, a 4-bit scale s per 32 weights.
//   IQ3_XXS: w = d * (0.5 + s) / 2 * grid * sign = d / 4 * (2 s + 1) * (grid * sign)
//   IQ3_S:   w = d * (1 + 2 s) * grid * sign
// Dequantization rounds each weight exactly as gguf.quants does, (db * grid) * sign in f32; the
// dot products use the integer form (quant_iq3.h, quant_iq_kernel.h; the SIMD ones are in
// arch/x86/quant_iq.cpp).
#include "core/kernel_pragmas.h"

#include "quant/quant_iq3.h"

namespace vllmx {

namespace iq3 {
namespace {

// 4 weights of one grid entry, dequantized; signs bit j belongs to weight j.
inline void put4(float db, uint32_t g, uint32_t signs, float* y) {
  for (int j = 0; j < 4; ++j)
    y[j] = db * static_cast<float>(grid_byte(g, j)) * ((signs >> j) & 1 ? -1.0f : 1.0f);
}

// ---- dequantization ----

void dequantize_row_iq3_xxs(const void* src, float* y, int64_t n) {
  const block_iq3_xxs* b = static_cast<const block_iq3_xxs*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t a = Iq3xxs::aux(b[i], ib);
      const float db = d * (0.5f + static_cast<float>(a >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint32_t s = Iq3xxs::signs(a, l);
        put4(db, iq3xxs_grid[b[i].qs[8 * ib + 2 * l]], s, y);
        put4(db, iq3xxs_grid[b[i].qs[8 * ib + 2 * l + 1]], s >> 4, y + 4);
      }
    }
  }
}

void dequantize_row_iq3_s(const void* src, float* y, int64_t n) {
  const block_iq3_s* b = static_cast<const block_iq3_s*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int k = 0; k < 64; ++k, y += 4) {
      const float db = d * static_cast<float>(Iq3s::scale(b[i], k / 8));
      put4(db, iq3s_grid[Iq3s::index(b[i], k)], b[i].signs[k / 2] >> (4 * (k % 2)), y);
    }
  }
}

}  // namespace
}  // namespace iq3

bool iq3_kernels(DType t, IqKernels* k) {
  switch (t) {
    case DType::IQ3_XXS: *k = iq::kernels<iq3::Iq3xxs>(t, iq3::dequantize_row_iq3_xxs); return true;
    case DType::IQ3_S: *k = iq::kernels<iq3::Iq3s>(t, iq3::dequantize_row_iq3_s); return true;
    default: return false;
  }
}

}  // namespace vllmx
