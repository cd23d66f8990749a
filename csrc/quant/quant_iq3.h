// IQ3_XXS, IQ3_S as integers: the traits (quant_iq_kernel.h) the scalar twins (quant_iq3.cpp)
// and the SIMD kernels (arch/x86/quant_iq.cpp) share. w = d * kFactor * (2 s + 1) * q with
// q = grid * sign.
#pragma once
#include <cstdint>

#include "core/half.h"
#include "quant/iq3_grids.h"
#include "quant/iq_ksigns.h"
#include "quant/quant_iq_kernel.h"

namespace vllmx::iq3 {

using iq::Decoded;

inline uint8_t grid_byte(uint32_t g, int j) { return static_cast<uint8_t>(g >> (8 * j)); }

// 4 weights of one grid entry as integers; signs bit j belongs to weight j.
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
};

}  // namespace vllmx::iq3
