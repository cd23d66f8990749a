// IQ2_XXS, IQ2_XS, IQ2_S: 8 weights per grid entry (bytes 8, 25 or 43), explicit signs, 4-bit
// scales s with w = d * (0.5 + s) / 4 * grid * sign = d / 8 * (2 s + 1) * (grid * sign).
// Dequantization rounds each weight exactly as gguf.quants does: (db * grid) * sign with
// db = d * (0.5 + s) * 0.25 in f32; the dot products use the integer form (quant_iq_kernel.h).
#include "core/kernel_pragmas.h"

#include "quant/iq2_grids.h"
#include "quant/iq_ksigns.h"
#include "quant/quant_iq_kernel.h"

namespace vllmx {

namespace {
using iq::Decoded;
using iq::load_u32;

inline uint8_t grid_byte(uint64_t g, int j) { return static_cast<uint8_t>(g >> (8 * j)); }
inline float sign_f(uint32_t bits, int j) { return (bits >> j) & 1 ? -1.0f : 1.0f; }
inline float db_iq2(float d, int s) { return d * (0.5f + static_cast<float>(s)) * 0.25f; }
// Nibble j of a scales field (IQ2_XS, IQ2_S: one per 16 weights).
inline int nibble(const uint8_t* scales, int j) { return (scales[j / 2] >> (4 * (j % 2))) & 15; }

// 8 weights of one grid entry with their sign byte: dequantized, and as integers.
inline void put8(float db, uint64_t g, uint32_t signs, float* y) {
  for (int j = 0; j < 8; ++j) y[j] = db * static_cast<float>(grid_byte(g, j)) * sign_f(signs, j);
}
inline void put8(uint64_t g, uint32_t signs, int8_t* q) {
  for (int j = 0; j < 8; ++j) {
    const int v = grid_byte(g, j);
    q[j] = static_cast<int8_t>((signs >> j) & 1 ? -v : v);
  }
}

// IQ2_XXS: per 32 weights two u32: a0 = 4 grid indices, a1 = 4 x 7 sign bits | scale << 28.
struct Iq2xxs {
  using Block = block_iq2_xxs;
  static constexpr float kFactor = 0.125f;
  static float d(const Block& b) { return f16_to_f32(b.d); }
  static void words(const Block& b, int ib, uint32_t& a0, uint32_t& a1) {
    a0 = load_u32(b.qs + 4 * ib);
    a1 = load_u32(b.qs + 4 * ib + 2);
  }
  static uint32_t signs(uint32_t a1, int l) { return ksigns_iq2xs[(a1 >> (7 * l)) & 127]; }
  static void decode(const Block& b, Decoded& o) {
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t a0, a1;
      words(b, ib, a0, a1);
      o.scale[2 * ib] = o.scale[2 * ib + 1] = 2 * static_cast<int>(a1 >> 28) + 1;
      for (int l = 0; l < 4; ++l)
        put8(iq2xxs_grid[(a0 >> (8 * l)) & 255], signs(a1, l), o.q + 32 * ib + 8 * l);
    }
  }
#if VLLMX_X86
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    uint32_t a0, a1;
    words(b, ib, a0, a1);
    u = _mm256_setr_epi64x(static_cast<int64_t>(iq2xxs_grid[a0 & 255]),
                           static_cast<int64_t>(iq2xxs_grid[(a0 >> 8) & 255]),
                           static_cast<int64_t>(iq2xxs_grid[(a0 >> 16) & 255]),
                           static_cast<int64_t>(iq2xxs_grid[a0 >> 24]));
    s0 = s1 = 2 * static_cast<int>(a1 >> 28) + 1;
    return signs(a1, 0) | signs(a1, 1) << 8 | signs(a1, 2) << 16 | signs(a1, 3) << 24;
  }
#endif
};

// IQ2_XS: per 8 weights a u16: 9-bit grid index | 7 sign bits << 9; a 4-bit scale per 16.
struct Iq2xs {
  using Block = block_iq2_xs;
  static constexpr float kFactor = 0.125f;
  static float d(const Block& b) { return f16_to_f32(b.d); }
  static void decode(const Block& b, Decoded& o) {
    for (int j = 0; j < 16; ++j) o.scale[j] = 2 * nibble(b.scales, j) + 1;
    for (int k = 0; k < 32; ++k)
      put8(iq2xs_grid[b.qs[k] & 511], ksigns_iq2xs[b.qs[k] >> 9], o.q + 8 * k);
  }
#if VLLMX_X86
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    const uint16_t* q = b.qs + 4 * ib;
    u = _mm256_setr_epi64x(static_cast<int64_t>(iq2xs_grid[q[0] & 511]),
                           static_cast<int64_t>(iq2xs_grid[q[1] & 511]),
                           static_cast<int64_t>(iq2xs_grid[q[2] & 511]),
                           static_cast<int64_t>(iq2xs_grid[q[3] & 511]));
    s0 = 2 * nibble(b.scales, 2 * ib) + 1;
    s1 = 2 * nibble(b.scales, 2 * ib + 1) + 1;
    return static_cast<uint32_t>(ksigns_iq2xs[q[0] >> 9]) | ksigns_iq2xs[q[1] >> 9] << 8 |
           ksigns_iq2xs[q[2] >> 9] << 16 | static_cast<uint32_t>(ksigns_iq2xs[q[3] >> 9]) << 24;
  }
#endif
};

// IQ2_S: per 8 weights a 10-bit grid index (qs byte | 2 bits of qh) and a byte of sign bits.
struct Iq2s {
  using Block = block_iq2_s;
  static constexpr float kFactor = 0.125f;
  static float d(const Block& b) { return f16_to_f32(b.d); }
  static int index(const Block& b, int k) {
    return b.qs[k] | ((b.qh[k / 4] >> (2 * (k % 4))) & 3) << 8;
  }
  static void decode(const Block& b, Decoded& o) {
    for (int j = 0; j < 16; ++j) o.scale[j] = 2 * nibble(b.scales, j) + 1;
    for (int k = 0; k < 32; ++k) put8(iq2s_grid[index(b, k)], b.signs[k], o.q + 8 * k);
  }
#if VLLMX_X86
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    const uint8_t* q = b.qs + 4 * ib;
    const int h = b.qh[ib] << 8;  // bits 8 + 2 l, 9 + 2 l: the high index bits of entry l
    auto g = [&](int l) { return static_cast<int64_t>(iq2s_grid[q[l] | ((h >> (2 * l)) & 768)]); };
    u = _mm256_setr_epi64x(g(0), g(1), g(2), g(3));
    s0 = 2 * nibble(b.scales, 2 * ib) + 1;
    s1 = 2 * nibble(b.scales, 2 * ib + 1) + 1;
    return load_u32(b.signs + 4 * ib);
  }
#endif
};

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

bool iq2_kernels(DType t, IqKernels* k) {
  switch (t) {
    case DType::IQ2_XXS: *k = iq::kernels<Iq2xxs>(dequantize_row_iq2_xxs); return true;
    case DType::IQ2_XS: *k = iq::kernels<Iq2xs>(dequantize_row_iq2_xs); return true;
    case DType::IQ2_S: *k = iq::kernels<Iq2s>(dequantize_row_iq2_s); return true;
    default: return false;
  }
}

}  // namespace vllmx
