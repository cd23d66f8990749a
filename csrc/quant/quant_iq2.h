// IQ2_XXS, IQ2_XS, IQ2_S as integers: the traits (quant_iq_kernel.h) the scalar twins
// (quant_iq2.cpp) and the SIMD kernels (arch/x86/quant_iq.cpp) share. w = d / 8 * (2 s + 1) * q
// with q = grid * sign.
#pragma once
#include <cstdint>

#include "core/half.h"
#include "quant/iq2_grids.h"
#include "quant/iq_ksigns.h"
#include "quant/quant_iq_kernel.h"

namespace vllmx::iq2 {

using iq::Decoded;

inline uint8_t grid_byte(uint64_t g, int j) { return static_cast<uint8_t>(g >> (8 * j)); }
// Nibble j of a scales field (IQ2_XS, IQ2_S: one per 16 weights).
inline int nibble(const uint8_t* scales, int j) { return (scales[j / 2] >> (4 * (j % 2))) & 15; }

// 8 weights of one grid entry with their sign byte, as integers.
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
};

}  // namespace vllmx::iq2
