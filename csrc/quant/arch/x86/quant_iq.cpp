// x86 vec_dot kernels of the i-quants IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S
// (AVX2, AVX-512BW) against Q8_K. The scalar side (the traits, the twins, combine) is in
// quant/quant_iq_kernel.h and quant/quant_iq1/2/3.h; each trait gets here its SIMD unpacking
//   uint32_t group(b, ib, u, s0, s1)   weights 32 ib .. 32 ib + 31 as magnitudes |q| in the bytes
//       of u (grid entries loaded 8 or 4 bytes at a time), their sign bits (returned, bit j:
//       weight 32 ib + j is negative) and the scales of the two 16-weight halves,
// and the drivers below form the twin's exact int32 per super-block from it: the signs go onto
// the activations (sign_epi8 / a masked negate), |q| . y through maddubs (|q| <= 62, |y| <= 127:
// pairs never saturate), the scales through madd.
#include "core/kernel_pragmas.h"

#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include "quant/arch/arch.h"
#include "quant/arch/vec_dot_rows.h"
#include "quant/arch/x86/pick.h"
#include "quant/quant_iq1.h"
#include "quant/quant_iq2.h"
#include "quant/quant_iq3.h"
#include "quant/quant_iq_kernel.h"

namespace vllmx::iq {

namespace {

VLLMX_TARGET_AVX2 inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Sign bits of 32 weights -> bytes of +1 / -1 (the second operand of sign_epi8).
VLLMX_TARGET_AVX2 inline __m256i sign_bytes(uint32_t bits) {
  const __m256i pick = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                          0x0303030303030303);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), pick);
  v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);  // 0xff where negative
  return _mm256_or_si256(v, _mm256_set1_epi8(1));
}

// Scales of the two halves as the 16 int16 lanes of maddubs over 32 weights.
VLLMX_TARGET_AVX2 inline __m256i scale_pair(int s0, int s1) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(s1)),
                          _mm_set1_epi16(static_cast<int16_t>(s0)));
}

VLLMX_TARGET_AVX2 inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// One weight row against R activation rows xs bytes apart (out[r * os]); each super-block is
// unpacked once and reused for all R rows.
template <class T, int R>
VLLMX_TARGET_AVX2 void vec_dot_avx2(int64_t n, const void* vw, const void* vx, int64_t xs,
                                    float* out, int64_t os) {
  const typename T::Block* w = static_cast<const typename T::Block*>(vw);
  const block_q8_K* x[R];
  for (int r = 0; r < R; ++r)
    x[r] = reinterpret_cast<const block_q8_K*>(static_cast<const uint8_t*>(vx) + r * xs);
  float sumf[R] = {};
  __m256i u[8], sv[8], sc[8];
  for (int64_t i = 0; i < n / QK_K; ++i) {
    for (int ib = 0; ib < 8; ++ib) {
      int s0, s1;
      sv[ib] = sign_bytes(T::group(w[i], ib, u[ib], s0, s1));
      sc[ib] = scale_pair(s0, s1);
    }
    const float dw = T::d(w[i]);
    for (int r = 0; r < R; ++r) {
      const block_q8_K& y = x[r][i];
      __m256i acc = _mm256_setzero_si256();
      for (int ib = 0; ib < 8; ++ib) {
        const __m256i ys = _mm256_sign_epi8(load256(y.qs + 32 * ib), sv[ib]);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u[ib], ys), sc[ib]));
      }
      sumf[r] = combine(sumf[r], dw, y.d, hsum_i32(acc));
    }
  }
  for (int r = 0; r < R; ++r) out[r * os] = T::kFactor * sumf[r];
}

VLLMX_TARGET_AVX512 inline __m512i join(__m256i a, __m256i b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// AVX-512BW: two groups per register; the signs stay bits (a mask register).
template <class T, int R>
VLLMX_TARGET_AVX512 void vec_dot_512(int64_t n, const void* vw, const void* vx, int64_t xs,
                                     float* out, int64_t os) {
  const typename T::Block* w = static_cast<const typename T::Block*>(vw);
  const block_q8_K* x[R];
  for (int r = 0; r < R; ++r)
    x[r] = reinterpret_cast<const block_q8_K*>(static_cast<const uint8_t*>(vx) + r * xs);
  float sumf[R] = {};
  __m512i u[4], sc[4];
  __mmask64 neg[4];
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    for (int k = 0; k < 4; ++k) {
      __m256i ua, ub;
      int a0, a1, b0, b1;
      const uint64_t sa = T::group(w[i], 2 * k, ua, a0, a1);
      const uint64_t sb = T::group(w[i], 2 * k + 1, ub, b0, b1);
      u[k] = join(ua, ub);
      neg[k] = static_cast<__mmask64>(sa | (sb << 32));
      sc[k] = join(scale_pair(a0, a1), scale_pair(b0, b1));
    }
    const float dw = T::d(w[i]);
    for (int r = 0; r < R; ++r) {
      const block_q8_K& y = x[r][i];
      __m512i acc = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        __m512i yv = _mm512_loadu_si512(y.qs + 64 * k);
        yv = _mm512_mask_sub_epi8(yv, neg[k], zero, yv);
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u[k], yv), sc[k]));
      }
      sumf[r] = combine(sumf[r], dw, y.d, _mm512_reduce_add_epi32(acc));
    }
  }
  for (int r = 0; r < R; ++r) out[r * os] = T::kFactor * sumf[r];
}

// Level 1: AVX2; 2 and up: AVX-512BW (VNNI's dpbusd has no per-16 scale step to save here).
template <class T, int L>
constexpr RowsKernelFn kernel(int R) {
  if constexpr (L == 1) {
    return R == 1 ? vec_dot_avx2<T, 1> : R == 2 ? vec_dot_avx2<T, 2>
         : R == 3 ? vec_dot_avx2<T, 3> : vec_dot_avx2<T, 4>;
  } else {
    return R == 1 ? vec_dot_512<T, 1> : R == 2 ? vec_dot_512<T, 2>
         : R == 3 ? vec_dot_512<T, 3> : vec_dot_512<T, 4>;
  }
}
static_assert(kDotRows == 4, "kernel() stamps out 1..4 rows");

}  // namespace

}  // namespace vllmx::iq

// ---------------------------------------------------------------- group() of each type

namespace vllmx::iq1 {

namespace {

// 8 grid + shift for 4 grid entries (shift bytes: +1 or -1 per 8), as |q| and sign bits.
VLLMX_TARGET_AVX2 inline uint32_t magnitudes(__m256i g, __m256i shift, __m256i& u) {
  const __m256i q = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), shift);
  u = _mm256_abs_epi8(q);
  return static_cast<uint32_t>(_mm256_movemask_epi8(q));  // q is never 0 (odd)
}
inline int64_t shift8(bool neg) { return neg ? -1 : 0x0101010101010101; }

struct Iq1sX86 : Iq1s {
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    const __m256i g = _mm256_setr_epi64x(
        static_cast<int64_t>(grid(b, ib, 0)), static_cast<int64_t>(grid(b, ib, 1)),
        static_cast<int64_t>(grid(b, ib, 2)), static_cast<int64_t>(grid(b, ib, 3)));
    s0 = s1 = scale(b, ib);
    return magnitudes(g, _mm256_set1_epi64x(shift8(neg(b, ib))), u);
  }
};

struct Iq1mX86 : Iq1m {
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
};

}  // namespace

}  // namespace vllmx::iq1

namespace vllmx::iq2 {

namespace {

struct Iq2xxsX86 : Iq2xxs {
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
};

struct Iq2xsX86 : Iq2xs {
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
};

struct Iq2sX86 : Iq2s {
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    const uint8_t* q = b.qs + 4 * ib;
    const int h = b.qh[ib] << 8;  // bits 8 + 2 l, 9 + 2 l: the high index bits of entry l
    auto g = [&](int l) { return static_cast<int64_t>(iq2s_grid[q[l] | ((h >> (2 * l)) & 768)]); };
    u = _mm256_setr_epi64x(g(0), g(1), g(2), g(3));
    s0 = 2 * nibble(b.scales, 2 * ib) + 1;
    s1 = 2 * nibble(b.scales, 2 * ib + 1) + 1;
    return load_u32(b.signs + 4 * ib);
  }
};

}  // namespace

}  // namespace vllmx::iq2

namespace vllmx::iq3 {

namespace {

struct Iq3xxsX86 : Iq3xxs {
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
};

struct Iq3sX86 : Iq3s {
  VLLMX_TARGET_AVX2 static uint32_t group(const Block& b, int ib, __m256i& u, int& s0, int& s1) {
    const uint8_t* q = b.qs + 8 * ib;
    const int h = b.qh[ib] << 8;  // bit 8 + j: the high index bit of entry j
    auto g = [&](int j) { return static_cast<int>(iq3s_grid[q[j] | ((h >> j) & 256)]); };
    u = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
    s0 = s1 = scale(b, ib);
    return load_u32(b.signs + 4 * ib);
  }
};

}  // namespace

}  // namespace vllmx::iq3

// ---------------------------------------------------------------- the pick

namespace vllmx {

namespace {

template <class T>
ArchDot pick() {  // VNNI: the AVX-512BW kernels (see iq::kernel)
  return by_level(arch_dot_of<iq::kernel<T, 1>>(), arch_dot_of<iq::kernel<T, 2>>(),
                  arch_dot_of<iq::kernel<T, 2>>());
}

}  // namespace

ArchDot arch_dot_iq(DType t) {
  switch (t) {
    case DType::IQ1_S: return pick<iq1::Iq1sX86>();
    case DType::IQ1_M: return pick<iq1::Iq1mX86>();
    case DType::IQ2_XXS: return pick<iq2::Iq2xxsX86>();
    case DType::IQ2_XS: return pick<iq2::Iq2xsX86>();
    case DType::IQ2_S: return pick<iq2::Iq2sX86>();
    case DType::IQ3_XXS: return pick<iq3::Iq3xxsX86>();
    case DType::IQ3_S: return pick<iq3::Iq3sX86>();
    default: return {};
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
