// x86 vec_dot kernels of the table types (AVX2, AVX-512BW, AVX-512 VNNI): IQ4_NL and MXFP4
// against Q8_0, IQ4_XS against Q8_K. The scalar twins and the table entries are in
// quant/quant_nl.cpp.
//
// The 4-bit codes become int8 weights with one byte shuffle (vpshufb) through the 16-entry table.
// Weights and activations are both signed, so the unsigned x signed byte products take |w| and
// y with w's sign (maddubs / dpbusd); |w|, |y| <= 127 keeps maddubs' pair sums from saturating.
// The integer sums are exact, and the f32 part follows quant_nl.h's fixed order (16 lanes for
// the 32-value types, one accumulate_q8_K per super-block for IQ4_XS), so AVX2, AVX-512 and VNNI
// give the scalar twin's bits, whatever the number of activation rows (batch invariance of
// linear). Each unpacked weight block is reused for up to kDotRows activation rows.
#include "core/kernel_pragmas.h"

#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include <type_traits>

#include "quant/arch/arch.h"
#include "quant/arch/vec_dot_rows.h"
#include "quant/arch/x86/pick.h"
#include "quant/quant_k.h"
#include "quant/quant_nl.h"

namespace vllmx {

namespace {

VLLMX_TARGET_AVX2 inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
VLLMX_TARGET_AVX2 inline __m256i table256(const int8_t* kv) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kv)));
}
// The 32 weights of a 16-byte nibble array, element order (low nibbles, then high nibbles).
VLLMX_TARGET_AVX2 inline __m256i lookup32(const uint8_t* qs, __m256i table) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i idx =
      _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
  return _mm256_shuffle_epi8(table, idx);
}
// int32 lane k = sum of w[e] * y[e], e = 4k..4k+3 (aw = |w|).
VLLMX_TARGET_AVX2 inline __m256i dot_i8(__m256i aw, __m256i w, __m256i y) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(y, w)),
                           _mm256_set1_epi16(1));
}
// quant_nl.h's reduce_lanes16 of lanes a (0..7) and b (8..15).
VLLMX_TARGET_AVX2 inline float reduce16(__m256 a, __m256 b) {
  const __m256 s8 = _mm256_add_ps(a, b);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
VLLMX_TARGET_AVX2 inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

template <int R>
inline void row_ptrs(const void* vx, int64_t xs, const void* (&x)[R]) {
  for (int r = 0; r < R; ++r) x[r] = static_cast<const uint8_t*>(vx) + r * xs;
}

// ---------------------------------------------------------------- AVX2

// IQ4_NL / MXFP4: block i goes to accumulator i % 2 (quant_nl.h's lanes 8 (i % 2) + k).
template <class W, int R>
VLLMX_TARGET_AVX2 void vec_dot_nl32_avx2(int64_t n, const void* vw, const void* vx, int64_t xs,
                                         float* out, int64_t os) {
  const W* w = static_cast<const W*>(vw);
  const void* xv[R];
  row_ptrs<R>(vx, xs, xv);
  const __m256i table = table256(nl_table(w));
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int64_t nb = n / 32;
  auto block = [&](int64_t i, int slot) VLLMX_TARGET_AVX2 {
    const __m256i q = lookup32(w[i].qs, table);
    const __m256i aq = _mm256_sign_epi8(q, q);
    const float dw = nl_scale(w[i]);
    for (int r = 0; r < R; ++r) {
      const block_q8_0& y = static_cast<const block_q8_0*>(xv[r])[i];
      const __m256i p = dot_i8(aq, q, load256(y.qs));
      const __m256 d = _mm256_set1_ps(dw * _cvtsh_ss(y.d));
      acc[r][slot] = _mm256_add_ps(acc[r][slot], _mm256_mul_ps(_mm256_cvtepi32_ps(p), d));
    }
  };
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    block(i, 0);
    block(i + 1, 1);
  }
  if (i < nb) block(i, 0);
  for (int r = 0; r < R; ++r) out[r * os] = reduce16(acc[r][0], acc[r][1]);
}

// IQ4_XS: the super-block's 8 sub-blocks unpacked once, then per row sum (scale - 32) * dot.
struct UnpackedXS {
  __m256i w[8], aw[8];
  int16_t sc[8];
};

VLLMX_TARGET_AVX2 inline void unpack_xs(const block_iq4_xs& b, __m256i table, UnpackedXS& u) {
  for (int ib = 0; ib < 8; ++ib) {
    u.w[ib] = lookup32(b.qs + 16 * ib, table);
    u.aw[ib] = _mm256_sign_epi8(u.w[ib], u.w[ib]);
    u.sc[ib] = static_cast<int16_t>(iq4_xs_scale(b, ib));
  }
}

template <int R>
VLLMX_TARGET_AVX2 void vec_dot_xs_avx2(int64_t n, const void* vw, const void* vx, int64_t xs,
                                       float* out, int64_t os) {
  const block_iq4_xs* w = static_cast<const block_iq4_xs*>(vw);
  const void* xv[R];
  row_ptrs<R>(vx, xs, xv);
  const __m256i table = table256(kvalues_iq4nl);
  float sumf[R] = {};
  UnpackedXS u;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    unpack_xs(w[i], table, u);
    const float dw = _cvtsh_ss(w[i].d);
    for (int r = 0; r < R; ++r) {
      const block_q8_K& y = static_cast<const block_q8_K*>(xv[r])[i];
      __m256i acc = _mm256_setzero_si256();
      for (int ib = 0; ib < 8; ++ib) {
        const __m256i p =
            _mm256_maddubs_epi16(u.aw[ib], _mm256_sign_epi8(load256(y.qs + 32 * ib), u.w[ib]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(u.sc[ib])));
      }
      sumf[r] = accumulate_q8_K(sumf[r], dw, y.d, hsum_i32(acc));
    }
  }
  for (int r = 0; r < R; ++r) out[r * os] = sumf[r];
}

// ---------------------------------------------------------------- AVX-512 (BW / VNNI)
// Two 32-value (sub-)blocks per register; negative weights flip y's sign through a mask.

VLLMX_TARGET_AVX512 inline __m512i join(__m256i a, __m256i b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}
VLLMX_TARGET_AVX512 inline __m512i dot_u8s8_512(__m512i u, __m512i s) {
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}
VLLMX_TARGET_AVX512VNNI inline __m512i dot_u8s8_512vnni(__m512i u, __m512i s) {
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
}
VLLMX_TARGET_AVX512 inline __m512i dot_scaled_512(__m512i acc, __m512i p, __m512i s) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
}
VLLMX_TARGET_AVX512VNNI inline __m512i dot_scaled_512vnni(__m512i acc, __m512i p, __m512i s) {
  return _mm512_dpwssd_epi32(acc, p, s);
}

// Weights of blocks a and b (b may be null: the table's entry 0, met by zero activations).
template <class W>
VLLMX_TARGET_AVX512 inline __m512i lookup_pair_512(const W* a, const W* b, __m512i table) {
  const __m128i ta = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a->qs));
  const __m128i tb =
      b ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs)) : _mm_setzero_si128();
  __m512i v = _mm512_castsi128_si512(ta);
  v = _mm512_inserti32x4(v, ta, 1);
  v = _mm512_inserti32x4(v, tb, 2);
  v = _mm512_inserti32x4(v, tb, 3);
  v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
  return _mm512_shuffle_epi8(table, _mm512_and_si512(v, _mm512_set1_epi8(0x0F)));
}

#define VLLMX_DEFINE_VEC_DOT_NL_512(NL32, XS, TARGET, DOT, DOT_SCALED)                         \
  template <class W, int R>                                                                    \
  TARGET void NL32(int64_t n, const void* vw, const void* vx, int64_t xs, float* out,          \
                   int64_t os) {                                                               \
    const W* w = static_cast<const W*>(vw);                                                    \
    const void* xv[R];                                                                         \
    row_ptrs<R>(vx, xs, xv);                                                                   \
    const __m512i table = _mm512_broadcast_i32x4(                                              \
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(nl_table(w))));                    \
    const __m512i zero = _mm512_setzero_si512();                                               \
    __m512 acc[R];                                                                             \
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();                                  \
    const int64_t nb = n / 32;                                                                 \
    for (int64_t i = 0; i < nb; i += 2) {                                                      \
      const bool two = i + 1 < nb;                                                             \
      const __m512i q = lookup_pair_512(&w[i], two ? &w[i + 1] : nullptr, table);              \
      const __mmask64 neg = _mm512_movepi8_mask(q);                                            \
      const __m512i aq = _mm512_abs_epi8(q);                                                   \
      const float dwa = nl_scale(w[i]), dwb = two ? nl_scale(w[i + 1]) : 0.0f;                 \
      for (int r = 0; r < R; ++r) {                                                            \
        const block_q8_0* y = static_cast<const block_q8_0*>(xv[r]) + i;                       \
        const __m256i ya = load256(y[0].qs);                                                   \
        const __m256i yb = two ? load256(y[1].qs) : _mm256_setzero_si256();                    \
        __m512i yv = join(ya, yb);                                                             \
        yv = _mm512_mask_sub_epi8(yv, neg, zero, yv);                                          \
        const __m512i p = DOT(aq, yv);                                                         \
        const float da = dwa * _cvtsh_ss(y[0].d);                                              \
        const float db = two ? dwb * _cvtsh_ss(y[1].d) : 0.0f;                                 \
        const __m512 d = _mm512_insertf32x8(_mm512_set1_ps(da), _mm256_set1_ps(db), 1);        \
        acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_cvtepi32_ps(p), d));               \
      }                                                                                        \
    }                                                                                          \
    for (int r = 0; r < R; ++r)                                                                \
      out[r * os] = reduce16(_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps(acc[r], 1)); \
  }                                                                                            \
                                                                                               \
  template <int R>                                                                             \
  TARGET void XS(int64_t n, const void* vw, const void* vx, int64_t xs, float* out,            \
                 int64_t os) {                                                                 \
    const block_iq4_xs* w = static_cast<const block_iq4_xs*>(vw);                              \
    const void* xv[R];                                                                         \
    row_ptrs<R>(vx, xs, xv);                                                                   \
    const __m256i table = table256(kvalues_iq4nl);                                             \
    const __m512i zero = _mm512_setzero_si512();                                               \
    float sumf[R] = {};                                                                        \
    UnpackedXS u;                                                                              \
    __m512i aw[4], sv[4];                                                                      \
    __mmask64 neg[4];                                                                          \
    for (int64_t i = 0; i < n / QK_K; ++i) {                                                   \
      unpack_xs(w[i], table, u);                                                               \
      for (int k = 0; k < 4; ++k) {                                                            \
        neg[k] = _mm512_movepi8_mask(join(u.w[2 * k], u.w[2 * k + 1]));                        \
        aw[k] = join(u.aw[2 * k], u.aw[2 * k + 1]);                                            \
        sv[k] = join(_mm256_set1_epi16(u.sc[2 * k]), _mm256_set1_epi16(u.sc[2 * k + 1]));      \
      }                                                                                        \
      const float dw = _cvtsh_ss(w[i].d);                                                      \
      for (int r = 0; r < R; ++r) {                                                            \
        const block_q8_K& y = static_cast<const block_q8_K*>(xv[r])[i];                        \
        __m512i acc = _mm512_setzero_si512();                                                  \
        for (int k = 0; k < 4; ++k) {                                                          \
          __m512i yv = _mm512_loadu_si512(y.qs + 64 * k);                                      \
          yv = _mm512_mask_sub_epi8(yv, neg[k], zero, yv);                                     \
          acc = DOT_SCALED(acc, _mm512_maddubs_epi16(aw[k], yv), sv[k]);                       \
        }                                                                                      \
        sumf[r] = accumulate_q8_K(sumf[r], dw, y.d, _mm512_reduce_add_epi32(acc));             \
      }                                                                                        \
    }                                                                                          \
    for (int r = 0; r < R; ++r) out[r * os] = sumf[r];                                         \
  }

VLLMX_DEFINE_VEC_DOT_NL_512(vec_dot_nl32_512, vec_dot_xs_512, VLLMX_TARGET_AVX512,
                            dot_u8s8_512, dot_scaled_512)
VLLMX_DEFINE_VEC_DOT_NL_512(vec_dot_nl32_512vnni, vec_dot_xs_512vnni, VLLMX_TARGET_AVX512VNNI,
                            dot_u8s8_512vnni, dot_scaled_512vnni)
#undef VLLMX_DEFINE_VEC_DOT_NL_512

// ---------------------------------------------------------------- the pick

// Kernel for weight type T (a block struct, or block_iq4_xs), SIMD level L, R rows.
template <class T, int L, int R> constexpr RowsKernelFn kernel_for() {
  if constexpr (std::is_same_v<T, block_iq4_xs>) {
    if constexpr (L == 1) return vec_dot_xs_avx2<R>;
    else if constexpr (L == 2) return vec_dot_xs_512<R>;
    else return vec_dot_xs_512vnni<R>;
  } else {
    if constexpr (L == 1) return vec_dot_nl32_avx2<T, R>;
    else if constexpr (L == 2) return vec_dot_nl32_512<T, R>;
    else return vec_dot_nl32_512vnni<T, R>;
  }
}
template <class T, int L> constexpr RowsKernelFn kernel(int R) {
  return R == 1 ? kernel_for<T, L, 1>() : R == 2 ? kernel_for<T, L, 2>()
       : R == 3 ? kernel_for<T, L, 3>() : kernel_for<T, L, 4>();
}
static_assert(kDotRows == 4, "kernel() stamps out 1..4 rows");

template <class T>
ArchDot pick() {
  return by_level(arch_dot_of<kernel<T, 1>>(), arch_dot_of<kernel<T, 2>>(),
                  arch_dot_of<kernel<T, 3>>());
}

}  // namespace

ArchDot arch_dot_nl(DType t) {
  switch (t) {
    case DType::IQ4_NL: return pick<block_iq4_nl>();
    case DType::IQ4_XS: return pick<block_iq4_xs>();
    case DType::MXFP4: return pick<block_mxfp4>();
    default: return {};
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
