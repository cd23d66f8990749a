// x86 vec_dot kernels of TQ1_0 and TQ2_0 against Q8_K (AVX2, AVX-512BW, AVX-512 VNNI). The
// codes t are unsigned, so maddubs / dpbusd take them directly and Q8_K's bsums give the sum y
// to subtract; the f32 part is accumulate_q8_K, as in the scalar twins (quant/quant_tq.cpp).
#include "core/kernel_pragmas.h"

#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include <cstring>

#include "quant/arch/arch.h"
#include "quant/arch/vec_dot_rows.h"
#include "quant/arch/x86/pick.h"
#include "quant/quant_k.h"
#include "quant/quant_tq.h"

namespace vllmx {

namespace {

// ---------------------------------------------------------------- SIMD unpacking (AVX2)
// u[k]: codes of values 32k..32k+31 as bytes.

VLLMX_TARGET_AVX2 inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
VLLMX_TARGET_AVX2 inline __m256i times3(__m256i v) {  // mod 256 per byte
  return _mm256_add_epi8(v, _mm256_add_epi8(v, v));
}
VLLMX_TARGET_AVX2 inline __m128i times3(__m128i v) { return _mm_add_epi8(v, _mm_add_epi8(v, v)); }
// floor(3 q / 256) of unsigned bytes q: (q >= 86) + (q >= 171).
VLLMX_TARGET_AVX2 inline __m256i top_trit(__m256i q) {
  const __m256i ge86 = _mm256_cmpeq_epi8(_mm256_max_epu8(q, _mm256_set1_epi8(86)), q);
  const __m256i ge171 =
      _mm256_cmpeq_epi8(_mm256_max_epu8(q, _mm256_set1_epi8(static_cast<char>(171))), q);
  return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(ge86, ge171));
}

VLLMX_TARGET_AVX2 inline void unpack(const block_tq1_0& b, __m256i* u) {
  __m256i q = load256(b.qs);
  for (int n = 0; n < 5; ++n, q = times3(q)) u[n] = top_trit(q);
  __m128i c[5];
  c[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 32));
  for (int n = 1; n < 5; ++n) c[n] = times3(c[n - 1]);
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  const __m128i h1 = _mm_set1_epi32(static_cast<int>(qh)), h3 = times3(h1), h9 = times3(h3);
  const __m128i h = _mm_blend_epi32(_mm_blend_epi32(h1, h3, 0x2),
                                    _mm_blend_epi32(h9, times3(h9), 0x8), 0xC);
  u[5] = top_trit(_mm256_set_m128i(c[1], c[0]));
  u[6] = top_trit(_mm256_set_m128i(c[3], c[2]));
  u[7] = top_trit(_mm256_set_m128i(h, c[4]));
}

VLLMX_TARGET_AVX2 inline void unpack(const block_tq2_0& b, __m256i* u) {
  const __m256i three = _mm256_set1_epi8(3);
  for (int c = 0; c < 2; ++c) {
    const __m256i q = load256(b.qs + 32 * c);
    u[4 * c + 0] = _mm256_and_si256(q, three);
    u[4 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), three);
    u[4 * c + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), three);
    u[4 * c + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), three);
  }
}

VLLMX_TARGET_AVX2 inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
// sum y over the block, from its 16 bsums.
VLLMX_TARGET_AVX2 inline int sum_y(const block_q8_K& y) {
  return hsum_i32(_mm256_madd_epi16(load256(y.bsums), _mm256_set1_epi16(1)));
}

// ---------------------------------------------------------------- AVX2

template <class W, int R>
VLLMX_TARGET_AVX2 void vec_dot_tq_avx2(int64_t n, const void* vw, const void* vx, int64_t xs,
                                       float* out, int64_t os) {
  const W* w = static_cast<const W*>(vw);
  float sumf[R] = {};
  __m256i u[8];
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    unpack(w[i], u);
    const float dw = _cvtsh_ss(w[i].d);
    for (int r = 0; r < R; ++r) {
      const block_q8_K& y = reinterpret_cast<const block_q8_K*>(
          static_cast<const uint8_t*>(vx) + r * xs)[i];
      __m256i acc = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k)
        acc = _mm256_add_epi32(
            acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], load256(y.qs + 32 * k)), ones));
      sumf[r] = accumulate_q8_K(sumf[r], dw, y.d, hsum_i32(acc) - sum_y(y));
    }
  }
  for (int r = 0; r < R; ++r) out[r * os] = sumf[r];
}

// ---------------------------------------------------------------- AVX-512 (BW / VNNI)

VLLMX_TARGET_AVX512 inline __m512i dot_acc_512(__m512i acc, __m512i u, __m512i s) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}
VLLMX_TARGET_AVX512VNNI inline __m512i dot_acc_512vnni(__m512i acc, __m512i u, __m512i s) {
  return _mm512_dpbusd_epi32(acc, u, s);
}

#define VLLMX_DEFINE_VEC_DOT_TQ_512(NAME, TARGET, DOT_ACC)                                    \
  template <class W, int R>                                                                   \
  TARGET void NAME(int64_t n, const void* vw, const void* vx, int64_t xs, float* out,         \
                   int64_t os) {                                                              \
    const W* w = static_cast<const W*>(vw);                                                   \
    float sumf[R] = {};                                                                       \
    __m256i u[8];                                                                             \
    __m512i u2[4];                                                                            \
    for (int64_t i = 0; i < n / QK_K; ++i) {                                                  \
      unpack(w[i], u);                                                                        \
      for (int k = 0; k < 4; ++k)                                                             \
        u2[k] = _mm512_inserti64x4(_mm512_castsi256_si512(u[2 * k]), u[2 * k + 1], 1);        \
      const float dw = _cvtsh_ss(w[i].d);                                                     \
      for (int r = 0; r < R; ++r) {                                                           \
        const block_q8_K& y = reinterpret_cast<const block_q8_K*>(                            \
            static_cast<const uint8_t*>(vx) + r * xs)[i];                                     \
        __m512i acc = _mm512_setzero_si512();                                                 \
        for (int k = 0; k < 4; ++k) acc = DOT_ACC(acc, u2[k], _mm512_loadu_si512(y.qs + 64 * k)); \
        sumf[r] = accumulate_q8_K(sumf[r], dw, y.d, _mm512_reduce_add_epi32(acc) - sum_y(y));      \
      }                                                                                       \
    }                                                                                         \
    for (int r = 0; r < R; ++r) out[r * os] = sumf[r];                                        \
  }

VLLMX_DEFINE_VEC_DOT_TQ_512(vec_dot_tq_512, VLLMX_TARGET_AVX512, dot_acc_512)
VLLMX_DEFINE_VEC_DOT_TQ_512(vec_dot_tq_512vnni, VLLMX_TARGET_AVX512VNNI, dot_acc_512vnni)
#undef VLLMX_DEFINE_VEC_DOT_TQ_512

template <class W, int L, int R> constexpr RowsKernelFn kernel_for() {
  if constexpr (L == 1) return vec_dot_tq_avx2<W, R>;
  else if constexpr (L == 2) return vec_dot_tq_512<W, R>;
  else return vec_dot_tq_512vnni<W, R>;
}
template <class W, int L> constexpr RowsKernelFn kernel(int R) {
  return R == 1 ? kernel_for<W, L, 1>() : R == 2 ? kernel_for<W, L, 2>()
       : R == 3 ? kernel_for<W, L, 3>() : kernel_for<W, L, 4>();
}
static_assert(kDotRows == 4, "kernel() stamps out 1..4 rows");

template <class W>
ArchDot pick() {
  return by_level(arch_dot_of<kernel<W, 1>>(), arch_dot_of<kernel<W, 2>>(),
                  arch_dot_of<kernel<W, 3>>());
}

}  // namespace

ArchDot arch_dot_tq(DType t) {
  switch (t) {
    case DType::TQ1_0: return pick<block_tq1_0>();
    case DType::TQ2_0: return pick<block_tq2_0>();
    default: return {};
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
