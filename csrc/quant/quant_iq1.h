// IQ1_S, IQ1_M as integers: the traits (quant_iq_kernel.h) the scalar twins (quant_iq1.cpp) and
// the SIMD kernels (arch/x86/quant_iq.cpp) share. w = d / 8 * (2 s + 1) * q with q = 8 grid +- 1
// (grid values -1, 0, 1 in iq1s_grid, the shift +-1/8 made an integer).
#pragma once
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "quant/iq1_grids.h"
#include "quant/quant_iq_kernel.h"

namespace vllmx::iq1 {

using iq::Decoded;

inline int8_t grid_val(uint64_t g, int j) { return static_cast<int8_t>(g >> (8 * j)); }

// 8 weights of one grid entry as integers; neg: the shift is -1/8.
inline void put8(uint64_t g, bool neg, int8_t* q) {
  for (int j = 0; j < 8; ++j) q[j] = static_cast<int8_t>(8 * grid_val(g, j) + (neg ? -1 : 1));
}

// IQ1_S: per 8 weights an 11-bit grid index (qs byte | 3 bits of qh); per 32 a u16 qh with the
// four 3-bit index highs, the scale (bits 12..14) and the shift sign (bit 15).
struct Iq1s {
  using Block = block_iq1_s;
  static constexpr float kFactor = 0.125f;
  static float d(const Block& b) { return f16_to_f32(b.d); }
  static uint64_t grid(const Block& b, int ib, int l) {
    return iq1s_grid[b.qs[4 * ib + l] | ((b.qh[ib] >> (3 * l)) & 7) << 8];
  }
  static int scale(const Block& b, int ib) { return 2 * ((b.qh[ib] >> 12) & 7) + 1; }
  static bool neg(const Block& b, int ib) { return (b.qh[ib] & 0x8000) != 0; }
  static void decode(const Block& b, Decoded& o) {
    for (int ib = 0; ib < 8; ++ib) {
      o.scale[2 * ib] = o.scale[2 * ib + 1] = scale(b, ib);
      for (int l = 0; l < 4; ++l) put8(grid(b, ib, l), neg(b, ib), o.q + 32 * ib + 8 * l);
    }
  }
};

// IQ1_M: per 8 weights an 11-bit grid index (qs byte | low 3 bits of a qh nibble) and the shift
// sign (bit 3 of the nibble); per 16 a 3-bit scale, four to each u16 of `scales`.
struct Iq1m {
  using Block = block_iq1_m;
  static constexpr float kFactor = 0.125f;
  static uint16_t word(const Block& b, int w) {
    uint16_t v;
    std::memcpy(&v, b.scales + 2 * w, 2);
    return v;
  }
  static float d(const Block& b) {
    const int bits = (word(b, 0) >> 12) | ((word(b, 1) >> 8) & 0x00F0) |
                     ((word(b, 2) >> 4) & 0x0F00) | (word(b, 3) & 0xF000);
    return f16_to_f32(static_cast<uint16_t>(bits));
  }
  static int nib(const Block& b, int k) { return (b.qh[k / 2] >> (4 * (k % 2))) & 15; }
  static uint64_t grid(const Block& b, int k) { return iq1s_grid[b.qs[k] | (nib(b, k) & 7) << 8]; }
  static bool neg(const Block& b, int k) { return (nib(b, k) & 8) != 0; }
  static int scale(const Block& b, int j) {  // j: 16-weight group
    return 2 * ((word(b, j / 4) >> (3 * (j % 4))) & 7) + 1;
  }
  static void decode(const Block& b, Decoded& o) {
    for (int j = 0; j < 16; ++j) o.scale[j] = scale(b, j);
    for (int k = 0; k < 32; ++k) put8(grid(b, k), neg(b, k), o.q + 8 * k);
  }
};

}  // namespace vllmx::iq1
