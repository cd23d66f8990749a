// x86 k-quant vec_dot kernels (AVX2, AVX-512BW, AVX-512 VNNI): a weight row of Q2_K..Q6_K
// super-blocks . a Q8_K activation row. The exact integer sums they form, the shared f32
// expression (combine_k) and the scalar twins are in quant/quant_k_dot.cpp and quant/quant_k.h.
//
// Each super-block is unpacked once into 256 unsigned bytes u (q = u - offset) and 16-bit
// per-group scales; u . y goes through maddubs (u <= 63, so pairs never saturate), the scales
// through madd (AVX2 / AVX-512BW) or dpwssd (VNNI); the offsets and minimums through bsums.
// The unpacked block is reused for up to kDotRows activation rows (vec_dot_rows).
#include "core/kernel_pragmas.h"

#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "quant/arch/arch.h"
#include "quant/arch/vec_dot_rows.h"
#include "quant/arch/x86/pick.h"
#include "quant/quant_k.h"

namespace vllmx {

namespace {

// One super-block, unpacked: u[k] holds elements 32k..32k+31 as unsigned bytes; s8 the 16
// group scales (int8); c16 the 16 bsums coefficients (int16): the minimums where kHasMin,
// else -offset * scale (folded into isum).
struct UnpackedK {
  __m256i u[8];
  __m128i s8;
  __m256i c16;
};

VLLMX_TARGET_AVX2 inline __m256i lo_nibbles(__m256i v) {
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}
VLLMX_TARGET_AVX2 inline __m256i hi_nibbles(__m256i v) {
  return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
}
VLLMX_TARGET_AVX2 inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
VLLMX_TARGET_AVX2 inline __m128i load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// Q4_K / Q5_K scales: 8 (scale, min) pairs of 6 bits -> per-16-group s8 and c16. The 12 bytes
// are rearranged as u32 words (llama.cpp's trick) into 8 scale bytes then 8 min bytes.
VLLMX_TARGET_AVX2 inline void scales_k4(const uint8_t* packed, UnpackedK& o) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t a[3];
  std::memcpy(a, packed, 12);
  const uint32_t sc_lo = a[0] & kLow6;
  const uint32_t sc_hi = (a[2] & kLow4) | (((a[0] >> 6) & kLow2) << 4);
  const uint32_t mn_lo = a[1] & kLow6;
  const uint32_t mn_hi = ((a[2] >> 4) & kLow4) | (((a[1] >> 6) & kLow2) << 4);
  const __m128i v = _mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi),
                                   static_cast<int>(mn_lo), static_cast<int>(mn_hi));
  o.s8 = _mm_unpacklo_epi8(v, v);                           // s0 s0 s1 s1 ... s7 s7
  o.c16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(v, v));  // m0 m0 m1 m1 ... m7 m7
}

VLLMX_TARGET_AVX2 inline void unpack(const block_q2_K& b, UnpackedK& o) {
  const __m128i sc = load128(b.scales);
  o.s8 = _mm_and_si128(sc, _mm_set1_epi8(0x0F));
  o.c16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F)));
  const __m256i three = _mm256_set1_epi8(3);
  for (int c = 0; c < 2; ++c) {
    const __m256i q = load256(b.qs + 32 * c);
    o.u[4 * c + 0] = _mm256_and_si256(q, three);
    o.u[4 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), three);
    o.u[4 * c + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), three);
    o.u[4 * c + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), three);
  }
}

VLLMX_TARGET_AVX2 inline void unpack(const block_q3_K& b, UnpackedK& o) {
  // 16 6-bit scales: low 4 bits in nibbles of bytes 0..7, high 2 bits in bytes 8..11.
  constexpr uint32_t kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t a[3];
  std::memcpy(a, b.scales, 12);
  const __m128i s6 = _mm_setr_epi32(
      static_cast<int>((a[0] & kLow4) | (((a[2] >> 0) & kLow2) << 4)),
      static_cast<int>((a[1] & kLow4) | (((a[2] >> 2) & kLow2) << 4)),
      static_cast<int>(((a[0] >> 4) & kLow4) | (((a[2] >> 4) & kLow2) << 4)),
      static_cast<int>(((a[1] >> 4) & kLow4) | (((a[2] >> 6) & kLow2) << 4)));
  o.s8 = _mm_sub_epi8(s6, _mm_set1_epi8(32));
  o.c16 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(o.s8), _mm256_set1_epi16(-4));
  const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  __m256i hm = load256(b.hmask);  // bit 0 of each byte: the high bit of the current 32
  for (int c = 0; c < 2; ++c) {
    const __m256i q = load256(b.qs + 32 * c);
    for (int s2 = 0; s2 < 4; ++s2) {
      const __m256i low = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s2)), three);
      const __m256i high = _mm256_and_si256(_mm256_slli_epi16(hm, 2), four);
      o.u[4 * c + s2] = _mm256_or_si256(low, high);
      hm = _mm256_srli_epi16(hm, 1);
    }
  }
}

VLLMX_TARGET_AVX2 inline void unpack(const block_q4_K& b, UnpackedK& o) {
  scales_k4(b.scales, o);
  for (int j = 0; j < 4; ++j) {
    const __m256i q = load256(b.qs + 32 * j);
    o.u[2 * j] = lo_nibbles(q);
    o.u[2 * j + 1] = hi_nibbles(q);
  }
}

VLLMX_TARGET_AVX2 inline void unpack(const block_q5_K& b, UnpackedK& o) {
  scales_k4(b.scales, o);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  __m256i h = load256(b.qh);  // bits 0 and 1 of each byte: the fifth bits of the current 64
  for (int j = 0; j < 4; ++j) {
    const __m256i q = load256(b.qs + 32 * j);
    o.u[2 * j] = _mm256_or_si256(lo_nibbles(q), _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4));
    o.u[2 * j + 1] =
        _mm256_or_si256(hi_nibbles(q), _mm256_and_si256(_mm256_slli_epi16(h, 3), bit4));
    h = _mm256_srli_epi16(h, 2);
  }
}

VLLMX_TARGET_AVX2 inline void unpack(const block_q6_K& b, UnpackedK& o) {
  o.s8 = load128(b.scales);
  o.c16 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(o.s8), _mm256_set1_epi16(-32));
  const __m256i m30 = _mm256_set1_epi8(0x30);
  for (int c = 0; c < 2; ++c) {
    const __m256i l0 = load256(b.ql + 64 * c), l1 = load256(b.ql + 64 * c + 32);
    const __m256i h = load256(b.qh + 32 * c);
    o.u[4 * c + 0] = _mm256_or_si256(lo_nibbles(l0), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
    o.u[4 * c + 1] = _mm256_or_si256(lo_nibbles(l1), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
    o.u[4 * c + 2] = _mm256_or_si256(hi_nibbles(l0), _mm256_and_si256(h, m30));
    o.u[4 * c + 3] = _mm256_or_si256(hi_nibbles(l1), _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
  }
}

// Scales of u[k] as 16 int16 lanes: group 2k in the low half, 2k+1 in the high half (the lanes
// of maddubs(u[k], y)).
VLLMX_TARGET_AVX2 inline __m256i scale_vec(__m128i s8, int k) {
  const int64_t lo = 0x0101010101010101ll * (2 * k), hi = 0x0101010101010101ll * (2 * k + 1);
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, _mm_set_epi64x(hi, lo)));
}

VLLMX_TARGET_AVX2 inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

template <class W> constexpr bool has_min() {
  return std::is_same_v<W, block_q2_K> || std::is_same_v<W, block_q4_K> ||
         std::is_same_v<W, block_q5_K>;
}

// ---------------------------------------------------------------- AVX2

template <class W, int R>
VLLMX_TARGET_AVX2 void vec_dot_k_avx2(int64_t n, const void* vw, const void* vx, int64_t xs,
                                      float* out, int64_t os) {
  constexpr bool kMin = has_min<W>();
  const W* w = static_cast<const W*>(vw);
  const block_q8_K* x[R];
  for (int r = 0; r < R; ++r)
    x[r] = reinterpret_cast<const block_q8_K*>(static_cast<const uint8_t*>(vx) + r * xs);
  float sumf[R] = {};
  UnpackedK b;
  __m256i sv[8];
  for (int64_t i = 0; i < n / QK_K; ++i) {
    unpack(w[i], b);
    for (int k = 0; k < 8; ++k) sv[k] = scale_vec(b.s8, k);
    for (int r = 0; r < R; ++r) {
      const block_q8_K& y = x[r][i];
      __m256i acc = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        const __m256i p = _mm256_maddubs_epi16(b.u[k], load256(y.qs + 32 * k));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sv[k]));
      }
      const __m256i bm = _mm256_madd_epi16(load256(y.bsums), b.c16);
      int imin = 0;
      if constexpr (kMin) imin = hsum_i32(bm);
      else acc = _mm256_add_epi32(acc, bm);
      sumf[r] = combine_k<kMin>(sumf[r], w[i], y.d, hsum_i32(acc), imin);
    }
  }
  for (int r = 0; r < R; ++r) out[r * os] = sumf[r];
}

// ---------------------------------------------------------------- AVX-512 (BW / VNNI)
// Two 32-element slices per register; the integer sums are the same as AVX2's.

VLLMX_TARGET_AVX512 inline __m512i join(__m256i a, __m256i b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}
VLLMX_TARGET_AVX512 inline __m512i dot_scaled_512(__m512i acc, __m512i p, __m512i s) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
}
VLLMX_TARGET_AVX512VNNI inline __m512i dot_scaled_512vnni(__m512i acc, __m512i p, __m512i s) {
  return _mm512_dpwssd_epi32(acc, p, s);
}

#define VLLMX_DEFINE_VEC_DOT_K_512(NAME, TARGET, DOT_SCALED)                                  \
  template <class W, int R>                                                                   \
  TARGET void NAME(int64_t n, const void* vw, const void* vx, int64_t xs, float* out,         \
                   int64_t os) {                                                              \
    constexpr bool kMin = has_min<W>();                                                       \
    const W* w = static_cast<const W*>(vw);                                                   \
    const block_q8_K* x[R];                                                                   \
    for (int r = 0; r < R; ++r)                                                               \
      x[r] = reinterpret_cast<const block_q8_K*>(static_cast<const uint8_t*>(vx) + r * xs);   \
    float sumf[R] = {};                                                                       \
    UnpackedK b;                                                                              \
    __m512i u[4], sv[4];                                                                      \
    for (int64_t i = 0; i < n / QK_K; ++i) {                                                  \
      unpack(w[i], b);                                                                        \
      for (int k = 0; k < 4; ++k) {                                                           \
        u[k] = join(b.u[2 * k], b.u[2 * k + 1]);                                              \
        sv[k] = join(scale_vec(b.s8, 2 * k), scale_vec(b.s8, 2 * k + 1));                     \
      }                                                                                       \
      for (int r = 0; r < R; ++r) {                                                           \
        const block_q8_K& y = x[r][i];                                                        \
        __m512i acc = _mm512_setzero_si512();                                                 \
        for (int k = 0; k < 4; ++k) {                                                         \
          const __m512i yv = _mm512_loadu_si512(y.qs + 64 * k);                               \
          acc = DOT_SCALED(acc, _mm512_maddubs_epi16(u[k], yv), sv[k]);                       \
        }                                                                                     \
        const __m256i bm = _mm256_madd_epi16(load256(y.bsums), b.c16);                        \
        int imin = 0;                                                                         \
        if constexpr (kMin) imin = hsum_i32(bm);                                              \
        else acc = _mm512_add_epi32(acc, _mm512_zextsi256_si512(bm));                         \
        sumf[r] = combine_k<kMin>(sumf[r], w[i], y.d, _mm512_reduce_add_epi32(acc), imin);      \
      }                                                                                       \
    }                                                                                         \
    for (int r = 0; r < R; ++r) out[r * os] = sumf[r];                                        \
  }

VLLMX_DEFINE_VEC_DOT_K_512(vec_dot_k_512, VLLMX_TARGET_AVX512, dot_scaled_512)
VLLMX_DEFINE_VEC_DOT_K_512(vec_dot_k_512vnni, VLLMX_TARGET_AVX512VNNI, dot_scaled_512vnni)
#undef VLLMX_DEFINE_VEC_DOT_K_512

// Per weight type and SIMD level: the kernels for 1..kDotRows rows.
template <class W, int L> constexpr RowsKernelFn kernel(int R) {
  if constexpr (L == 1) {
    return R == 1 ? vec_dot_k_avx2<W, 1> : R == 2 ? vec_dot_k_avx2<W, 2>
         : R == 3 ? vec_dot_k_avx2<W, 3> : vec_dot_k_avx2<W, 4>;
  } else if constexpr (L == 2) {
    return R == 1 ? vec_dot_k_512<W, 1> : R == 2 ? vec_dot_k_512<W, 2>
         : R == 3 ? vec_dot_k_512<W, 3> : vec_dot_k_512<W, 4>;
  } else {
    return R == 1 ? vec_dot_k_512vnni<W, 1> : R == 2 ? vec_dot_k_512vnni<W, 2>
         : R == 3 ? vec_dot_k_512vnni<W, 3> : vec_dot_k_512vnni<W, 4>;
  }
}
static_assert(kDotRows == 4, "kernel() stamps out 1..4 rows");

template <class W>
ArchDot pick() {
  return by_level(arch_dot_of<kernel<W, 1>>(), arch_dot_of<kernel<W, 2>>(),
                  arch_dot_of<kernel<W, 3>>());
}

}  // namespace

ArchDot arch_dot_k(DType t) {
  switch (t) {
    case DType::Q2_K: return pick<block_q2_K>();
    case DType::Q3_K: return pick<block_q3_K>();
    case DType::Q4_K: return pick<block_q4_K>();
    case DType::Q5_K: return pick<block_q5_K>();
    case DType::Q6_K: return pick<block_q6_K>();
    default: return {};
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
