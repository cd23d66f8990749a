// IQ3_XXS, IQ3_S: 4 weights per grid entry, explicit signs, a 4-bit scale s per 32 weights.
//   IQ3_XXS: w = d * (0.5 + s) / 2 * grid * sign = d / 4 * (2 s + 1) * (grid * sign)
//   IQ3_S:   w = d * (1 + 2 s) * grid * sign
// Dequantization rounds each weight exactly as gguf.quants does, (db * grid) * sign in f32; the
// dot products use the integer form (quant_iq_kernel.h).
#include "core/kernel_pragmas.h"

#include "quant/iq3_grids.h"
#include "quant/iq_ksigns.h"
#include "quant/quant_iq_kernel.h"

namespace vllmx {

namespace {
using iq::Decoded;
using iq::load_u32;

inline uint8_t grid_byte(uint32_t g, int j) { return static_cast<uint8_t>(g >> (8 * j)); }

// 4 weights of one grid entry; signs bit j belongs to weight j.
inline void put4(float db, uint32_t g, uint32_t signs, float* y) {
  for (int j = 0; j < 4; ++j)
    y[j] = db * static_cast<float>(grid_byte(g, j)) * ((signs >> j) & 1 ? -1.0f : 1.0f);
}
inline void put4(uint32_t g, uint32_t signs, int8_t* q) {
  for (int j = 0; j < 4; ++j) {
    const int v = grid_byte(g, j);
    q[j] = static_cast<int8_t>((signs >> j) & 1 ? -v : v);
  }
}

// IQ3_XXS: per 32 weights 8 grid bytes in qs and a u32: 4 x 7 sign bits (ksigns) | scale << 28.
struct Iq3xxs {
  using Block = block_iq3_xxs;
  static constexpr float kFactor = 0.25f;
  static float d(const Block& b) { return f16_to_f32(b.d); }
  static uint32_t aux(const Block& b, int ib) { return load_u32(b.scales_signs + 4 * ib); }
  static uint32_t signs(uint32_t a, int l) { return ksigns_iq2xs[(a >> (7 * l)) & 127]; }
  static void decode(const Block& b, Decoded& o) {
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t a = aux(b, ib);
      o.scale[2 * ib] = o.scale[2 * ib + 1] = 2 * static_cast<int>(a >> 28) + 1;
      for (int l = 0; l < 4; ++l) {
        const uint32_t s = signs(a, l);
        int8_t* q = o.q + 32 * ib + 8 * l;
        put4(iq3xxs_grid[b.qs[8 * ib + 2 * l]], s, q);
        put4(iq3xxs_grid[b.qs[8 * ib + 2 * l + 1]], s >> 4, q + 4);
      }
    }
  }
#if VLLMX_X86
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    const uint8_t* q = b.qs + 8 * ib;
    u = _mm256_setr_epi32(
        static_cast<int>(iq3xxs_grid[q[0]]), static_cast<int>(iq3xxs_grid[q[1]]),
        static_cast<int>(iq3xxs_grid[q[2]]), static_cast<int>(iq3xxs_grid[q[3]]),
        static_cast<int>(iq3xxs_grid[q[4]]), static_cast<int>(iq3xxs_grid[q[5]]),
        static_cast<int>(iq3xxs_grid[q[6]]), static_cast<int>(iq3xxs_grid[q[7]]));
    const uint32_t a = aux(b, ib);
    s0 = s1 = 2 * static_cast<int>(a >> 28) + 1;
    return signs(a, 0) | signs(a, 1) << 8 | signs(a, 2) << 16 | signs(a, 3) << 24;
  }
#endif
};

// IQ3_S: per 4 weights a 9-bit grid index (qs byte | a bit of qh); one sign bit per weight.
struct Iq3s {
  using Block = block_iq3_s;
  static constexpr float kFactor = 1.0f;
  static float d(const Block& b) { return f16_to_f32(b.d); }
  static int index(const Block& b, int k) { return b.qs[k] | ((b.qh[k / 8] >> (k % 8)) & 1) << 8; }
  static int scale(const Block& b, int ib) {
    return 1 + 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 15);
  }
  static void decode(const Block& b, Decoded& o) {
    for (int ib = 0; ib < 8; ++ib) o.scale[2 * ib] = o.scale[2 * ib + 1] = scale(b, ib);
    for (int k = 0; k < 64; ++k)
      put4(iq3s_grid[index(b, k)], b.signs[k / 2] >> (4 * (k % 2)), o.q + 4 * k);
  }
#if VLLMX_X86
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    const uint8_t* q = b.qs + 8 * ib;
    const int h = b.qh[ib] << 8;  // bit 8 + j: the high index bit of entry j
    auto g = [&](int j) { return static_cast<int>(iq3s_grid[q[j] | ((h >> j) & 256)]); };
    u = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
    s0 = s1 = scale(b, ib);
    return load_u32(b.signs + 4 * ib);
  }
#endif
};

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

bool iq3_kernels(DType t, IqKernels* k) {
  switch (t) {
    case DType::IQ3_XXS: *k = iq::kernels<Iq3xxs>(dequantize_row_iq3_xxs); return true;
    case DType::IQ3_S: *k = iq::kernels<Iq3s>(dequantize_row_iq3_s); return true;
    default: return false;
  }
}

}  // namespace vllmx
