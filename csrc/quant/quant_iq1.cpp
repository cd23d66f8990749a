// IQ1_S, IQ1_M: 8 weights per grid entry (values -1, 0, 1 in iq1s_grid) shifted by +-1/8, with
// a 3-bit scale s: w = d * (2 s + 1) * (grid +- 1/8) = d / 8 * (2 s + 1) * (8 grid +- 1).
//   IQ1_S: one scale and one shift sign per 32 weights (qh); d is an f16 field.
//   IQ1_M: a scale per 16 and a shift sign per 8 weights; d is spread over the top nibbles of
//          the four u16 scale words.
// Dequantization rounds each weight as gguf.quants does, dl * (grid + delta) in f32 (the sum is
// exact); the dot products use the integer form q = 8 grid +- 1 (quant_iq_kernel.h).
#include "core/kernel_pragmas.h"

#include "quant/iq1_grids.h"
#include "quant/quant_iq_kernel.h"

namespace vllmx {

namespace {
using iq::Decoded;

constexpr float kDelta = 0.125f;  // llama.cpp's IQ1S_DELTA / IQ1M_DELTA

inline int8_t grid_val(uint64_t g, int j) { return static_cast<int8_t>(g >> (8 * j)); }

// 8 weights of one grid entry; neg: the shift is -1/8.
inline void put8(float dl, uint64_t g, bool neg, float* y) {
  const float delta = neg ? -kDelta : kDelta;
  for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(grid_val(g, j)) + delta);
}
inline void put8(uint64_t g, bool neg, int8_t* q) {
  for (int j = 0; j < 8; ++j) q[j] = static_cast<int8_t>(8 * grid_val(g, j) + (neg ? -1 : 1));
}

#if VLLMX_X86
// 8 grid + shift for 4 grid entries (shift bytes: +1 or -1 per 8), as |q| and sign bits.
VLLMX_TARGET_AVX2 inline uint32_t magnitudes(__m256i g, __m256i shift, __m256i& u) {
  const __m256i q = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), shift);
  u = _mm256_abs_epi8(q);
  return static_cast<uint32_t>(_mm256_movemask_epi8(q));  // q is never 0 (odd)
}
inline int64_t shift8(bool neg) { return neg ? -1 : 0x0101010101010101; }
#endif

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
#if VLLMX_X86
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    const __m256i g = _mm256_setr_epi64x(
        static_cast<int64_t>(grid(b, ib, 0)), static_cast<int64_t>(grid(b, ib, 1)),
        static_cast<int64_t>(grid(b, ib, 2)), static_cast<int64_t>(grid(b, ib, 3)));
    s0 = s1 = scale(b, ib);
    return magnitudes(g, _mm256_set1_epi64x(shift8(neg(b, ib))), u);
  }
#endif
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
#if VLLMX_X86
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    const uint8_t* q = b.qs + 4 * ib;
    const int h = b.qh[2 * ib] | b.qh[2 * ib + 1] << 8;  // nibble l: entry 4 ib + l
    auto g = [&](int l) {
      return static_cast<int64_t>(iq1s_grid[q[l] | ((h >> (4 * l)) & 7) << 8]);
    };
    auto sh = [&](int l) { return shift8((h >> (4 * l + 3)) & 1); };
    const __m256i shift = _mm256_setr_epi64x(sh(0), sh(1), sh(2), sh(3));
    const int sc = word(b, ib / 2) >> (6 * (ib % 2));
    s0 = 2 * (sc & 7) + 1;
    s1 = 2 * ((sc >> 3) & 7) + 1;
    return magnitudes(_mm256_setr_epi64x(g(0), g(1), g(2), g(3)), shift, u);
  }
#endif
};

// ---- dequantization ----

void dequantize_row_iq1_s(const void* src, float* y, int64_t n) {
  const block_iq1_s* b = static_cast<const block_iq1_s*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float dl = d * static_cast<float>(Iq1s::scale(b[i], ib));
      for (int l = 0; l < 4; ++l, y += 8) put8(dl, Iq1s::grid(b[i], ib, l), Iq1s::neg(b[i], ib), y);
    }
  }
}

void dequantize_row_iq1_m(const void* src, float* y, int64_t n) {
  const block_iq1_m* b = static_cast<const block_iq1_m*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = Iq1m::d(b[i]);
    for (int k = 0; k < 32; ++k, y += 8) {
      const float dl = d * static_cast<float>(Iq1m::scale(b[i], k / 2));
      put8(dl, Iq1m::grid(b[i], k), Iq1m::neg(b[i], k), y);
    }
  }
}

}  // namespace

bool iq1_kernels(DType t, IqKernels* k) {
  switch (t) {
    case DType::IQ1_S: *k = iq::kernels<Iq1s>(dequantize_row_iq1_s); return true;
    case DType::IQ1_M: *k = iq::kernels<Iq1m>(dequantize_row_iq1_m); return true;
    default: return false;
  }
}

}  // namespace vllmx
