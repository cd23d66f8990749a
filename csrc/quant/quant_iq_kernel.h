// The vec_dot drivers shared by the i-quant families (quant_iq1/2/3.cpp); not a public header.
//
// A family describes each of its types by a trait T:
//   Block, kFactor             the block struct; w = d * kFactor * scale[g] * q (quant_iq.h)
//   float d(const Block&)      the f32 super-block scale
//   void decode(b, Decoded&)   scalar: the 256 integer weights q and 16 scales (reference twin)
//   uint32_t group(b, ib, u, s0, s1)   SIMD: weights 32 ib .. 32 ib + 31 as magnitudes |q| in
//       the bytes of u (grid entries loaded 8 or 4 bytes at a time), their sign bits (returned,
//       bit j: weight 32 ib + j is negative) and the scales of the two 16-weight halves.
// Per super-block every path computes the same exact int32, isum = sum_g scale[g] *
// sum_{e in g} q[e] * y[e], and turns it into f32 with the one shared expression (combine), in
// super-block order; so the scalar twin, AVX2 and AVX-512 agree bit for bit, and so do all row
// groupings of vec_dot_rows, which keeps `linear` batch invariant.
// SIMD: the signs go onto the activations (sign_epi8 / a masked negate), |q| . y through maddubs
// (|q| <= 62, |y| <= 127: pairs never saturate), the scales through madd.
#pragma once
#include <cstring>

#include "core/cpu_features.h"
#include "core/half.h"
#include "quant/quant_iq.h"
#include "quant/vec_dot_rows.h"

#if VLLMX_X86
#include <immintrin.h>
#endif

namespace vllmx::iq {

inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// A super-block as integers: weight e = d * kFactor * scale[e / 16] * q[e].
struct Decoded {
  int8_t q[QK_K];
  int scale[QK_K / 16];
};

// The f32 part, identical for every path.
inline float combine(float sumf, float dw, float dx, int isum) {
  return sumf + (dw * dx) * static_cast<float>(isum);
}

template <class T>
float vec_dot_ref(int64_t n, const void* vw, const void* vx) {
  const typename T::Block* w = static_cast<const typename T::Block*>(vw);
  const block_q8_K* x = static_cast<const block_q8_K*>(vx);
  float sumf = 0.0f;
  Decoded dec;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    T::decode(w[i], dec);
    int isum = 0;
    for (int g = 0; g < QK_K / 16; ++g) {
      int dot = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) dot += dec.q[e] * x[i].qs[e];
      isum += dec.scale[g] * dot;
    }
    sumf = combine(sumf, T::d(w[i]), x[i].d, isum);
  }
  return T::kFactor * sumf;
}

#if VLLMX_X86
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

#endif  // VLLMX_X86

// The kernels of type T for this CPU (simd_level(), capped by VLLMX_ISA).
template <class T>
IqKernels kernels(ToFloatFn to_float) {
  IqKernels k;
  k.to_float = to_float;
  k.vec_dot_ref = vec_dot_ref<T>;
  k.vec_dot = vec_dot_ref<T>;
#if VLLMX_X86
  const int level = simd_level();
  if (level >= 2) {
    k.vec_dot = vec_dot_one<kernel<T, 2>>;
    k.vec_dot_rows = vec_dot_rows<kernel<T, 2>>;
  } else if (level >= 1) {
    k.vec_dot = vec_dot_one<kernel<T, 1>>;
    k.vec_dot_rows = vec_dot_rows<kernel<T, 1>>;
  }
#endif
  return k;
}

}  // namespace vllmx::iq
