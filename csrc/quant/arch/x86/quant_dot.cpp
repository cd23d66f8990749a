// x86 vec_dot kernels of the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): AVX2
// (maddubs); AVX-512BW (maddubs, two blocks per register); AVX-512 VNNI (dpbusd). The scheme, the
// scalar twins and the selectors are in quant/quant_dot.cpp; arch_dot gives the fastest path the
// CPU has (simd_level()).
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 flags the deliberately undefined upper halves in _mm512_cast* / reduce intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include <cmath>

#include "quant/arch/arch.h"
#include "quant/arch/x86/pick.h"
#include "quant/quant.h"

namespace vllmx {

namespace {

enum Kind { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };

template <int K> struct KindInfo;
template <> struct KindInfo<kQ4_0> { using W = block_q4_0; using X = block_q8_0; static constexpr int off = 8; static constexpr bool has_m = false; };
template <> struct KindInfo<kQ4_1> { using W = block_q4_1; using X = block_q8_1; static constexpr int off = 0; static constexpr bool has_m = true; };
template <> struct KindInfo<kQ5_0> { using W = block_q5_0; using X = block_q8_0; static constexpr int off = 16; static constexpr bool has_m = false; };
template <> struct KindInfo<kQ5_1> { using W = block_q5_1; using X = block_q8_1; static constexpr int off = 0; static constexpr bool has_m = true; };
template <> struct KindInfo<kQ8_0> { using W = block_q8_0; using X = block_q8_0; static constexpr int off = 0; static constexpr bool has_m = false; };

template <class B> inline uint16_t m_of(const B& b) { return b.m; }
inline uint16_t m_of(const block_q4_0&) { return 0; }
inline uint16_t m_of(const block_q5_0&) { return 0; }
inline uint16_t m_of(const block_q8_0&) { return 0; }
inline uint16_t s_of(const block_q8_1& b) { return b.s; }
inline uint16_t s_of(const block_q8_0&) { return 0; }

// ---------------------------------------------------------------- AVX2 (one block per step)

VLLMX_TARGET_AVX2 inline __m256i dot_u8s8_avx2(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

VLLMX_TARGET_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 32 weights of a 4/5-bit block as unsigned bytes in element order.
template <int K>
VLLMX_TARGET_AVX2 inline __m256i unpack_avx2(const typename KindInfo<K>::W& b) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
  if constexpr (K == kQ5_0 || K == kQ5_1) {
    // bit e of qh -> byte e: broadcast qh, pick byte e/8 into lane e, test bit e%8.
    const uint32_t qh = load_u32(b.qh);
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                            0x0202020202020202, 0x0303030303030303);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    bytes = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    q = _mm256_or_si256(q, _mm256_and_si256(bytes, _mm256_set1_epi8(0x10)));
  }
  return q;
}

template <int K>
VLLMX_TARGET_AVX2 float vec_dot_avx2(int64_t n, const void* vw, const void* vx) {
  using Info = KindInfo<K>;
  const typename Info::W* w = static_cast<const typename Info::W*>(vw);
  const typename Info::X* x = static_cast<const typename Info::X*>(vx);
  __m256 acc = _mm256_setzero_ps();
  float summs = 0.0f;
  for (int64_t i = 0; i < n / 32; ++i) {
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs));
    __m256i isum;
    if constexpr (K == kQ8_0) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs));
      isum = dot_u8s8_avx2(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
    } else {
      const __m256i q = unpack_avx2<K>(w[i]);
      isum = dot_u8s8_avx2(q, y);
      if constexpr (Info::off != 0)
        isum = _mm256_sub_epi32(isum, dot_u8s8_avx2(_mm256_set1_epi8(Info::off), y));
    }
    const float d = _cvtsh_ss(w[i].d) * _cvtsh_ss(x[i].d);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc);
    if constexpr (Info::has_m) summs = std::fma(_cvtsh_ss(m_of(w[i])), _cvtsh_ss(s_of(x[i])), summs);
  }
  return hsum_avx2(acc) + summs;
}

// ---------------------------------------------------------------- AVX-512 (two blocks per step)

// Weights of blocks a and b (b may be null: zeros) as 64 unsigned bytes, element order.
template <int K>
VLLMX_TARGET_AVX512 inline __m512i unpack_pair_512(const typename KindInfo<K>::W* a,
                                                   const typename KindInfo<K>::W* b) {
  const __m128i ta = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a->qs));
  const __m128i tb = b ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs))
                       : _mm_setzero_si128();
  __m512i v = _mm512_castsi128_si512(ta);
  v = _mm512_inserti32x4(v, ta, 1);
  v = _mm512_inserti32x4(v, tb, 2);
  v = _mm512_inserti32x4(v, tb, 3);
  v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
  v = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
  if constexpr (K == kQ5_0 || K == kQ5_1) {
    const uint64_t qh = static_cast<uint64_t>(load_u32(a->qh)) |
                        (b ? static_cast<uint64_t>(load_u32(b->qh)) << 32 : 0);
    v = _mm512_mask_add_epi8(v, static_cast<__mmask64>(qh), v, _mm512_set1_epi8(0x10));
  }
  return v;
}

template <class X>
VLLMX_TARGET_AVX512 inline __m512i load_y_pair_512(const X* a, const X* b) {
  const __m256i ya = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a->qs));
  const __m256i yb = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs))
                       : _mm256_setzero_si256();
  return _mm512_inserti64x4(_mm512_castsi256_si512(ya), yb, 1);
}

VLLMX_TARGET_AVX512 inline __m512i dot_u8s8_512(__m512i u, __m512i s) {
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}
VLLMX_TARGET_AVX512VNNI inline __m512i dot_u8s8_512vnni(__m512i u, __m512i s) {
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
}

// One weight row against R activation rows (x rows xs bytes apart; out[r * os]). The weight
// blocks are unpacked once per pair and reused for all R rows; each row's arithmetic is the
// same op sequence whatever R is, so results do not depend on how rows are grouped.
// The body is stamped out twice (VNNI / not): the target attribute cannot vary per template
// argument, and the dpbusd helper may only be inlined into VNNI-targeted functions.
#define VLLMX_DEFINE_VEC_DOT_512(NAME, TARGET, DOT)                                             \
  template <int K, int R>                                                                       \
  TARGET void NAME(int64_t n, const void* vw, const void* vx, int64_t xs, float* out,           \
                   int64_t os) {                                                                \
    using Info = KindInfo<K>;                                                                   \
    using X = typename Info::X;                                                                 \
    const typename Info::W* w = static_cast<const typename Info::W*>(vw);                       \
    const X* x[R];                                                                              \
    for (int r = 0; r < R; ++r)                                                                 \
      x[r] = reinterpret_cast<const X*>(static_cast<const uint8_t*>(vx) + r * xs);              \
    const int64_t nb = n / 32;                                                                  \
    __m512 acc[R];                                                                              \
    float summs[R];                                                                             \
    for (int r = 0; r < R; ++r) {                                                               \
      acc[r] = _mm512_setzero_ps();                                                             \
      summs[r] = 0.0f;                                                                          \
    }                                                                                           \
    for (int64_t i = 0; i < nb; i += 2) {                                                       \
      const bool two = i + 1 < nb;                                                              \
      const typename Info::W* wb = two ? &w[i + 1] : nullptr;                                   \
      __m512i q, neg = _mm512_setzero_si512();                                                  \
      __mmask64 sgn = 0;                                                                        \
      if constexpr (K == kQ8_0) {                                                               \
        const __m256i wa8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs));      \
        const __m256i wb8 = wb ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->qs))   \
                               : _mm256_setzero_si256();                                        \
        const __m512i q8 = _mm512_inserti64x4(_mm512_castsi256_si512(wa8), wb8, 1);             \
        sgn = _mm512_movepi8_mask(q8);                                                          \
        q = _mm512_abs_epi8(q8);                                                                \
      } else {                                                                                  \
        q = unpack_pair_512<K>(&w[i], wb);                                                      \
      }                                                                                         \
      const float dwa = _cvtsh_ss(w[i].d);                                                      \
      const float dwb = two ? _cvtsh_ss(wb->d) : 0.0f;                                          \
      for (int r = 0; r < R; ++r) {                                                             \
        const X* xb = two ? &x[r][i + 1] : nullptr;                                             \
        __m512i y = load_y_pair_512(&x[r][i], xb);                                              \
        __m512i isum;                                                                           \
        if constexpr (K == kQ8_0) {                                                             \
          y = _mm512_mask_sub_epi8(y, sgn, neg, y);                                             \
          isum = DOT(q, y);                                                                     \
        } else {                                                                                \
          isum = DOT(q, y);                                                                     \
          if constexpr (Info::off != 0)                                                         \
            isum = _mm512_sub_epi32(isum, DOT(_mm512_set1_epi8(Info::off), y));                 \
        }                                                                                       \
        const float da = dwa * _cvtsh_ss(x[r][i].d);                                            \
        const float db = two ? dwb * _cvtsh_ss(xb->d) : 0.0f;                                   \
        const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(da), _mm256_set1_ps(db), 1);     \
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[r]);                      \
        if constexpr (Info::has_m) {                                                            \
          summs[r] = std::fma(_cvtsh_ss(m_of(w[i])), _cvtsh_ss(s_of(x[r][i])), summs[r]);       \
          if (two) summs[r] = std::fma(_cvtsh_ss(m_of(*wb)), _cvtsh_ss(s_of(*xb)), summs[r]);   \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
    for (int r = 0; r < R; ++r) out[r * os] = _mm512_reduce_add_ps(acc[r]) + summs[r];         \
  }

VLLMX_DEFINE_VEC_DOT_512(vec_dot_rows_512, VLLMX_TARGET_AVX512, dot_u8s8_512)
VLLMX_DEFINE_VEC_DOT_512(vec_dot_rows_512vnni, VLLMX_TARGET_AVX512VNNI, dot_u8s8_512vnni)
#undef VLLMX_DEFINE_VEC_DOT_512

template <int K>
float vec_dot_512(int64_t n, const void* w, const void* x) {
  float v;
  vec_dot_rows_512<K, 1>(n, w, x, 0, &v, 0);
  return v;
}
template <int K>
float vec_dot_512vnni(int64_t n, const void* w, const void* x) {
  float v;
  vec_dot_rows_512vnni<K, 1>(n, w, x, 0, &v, 0);
  return v;
}
template <int K>
void vec_dot_rows_512_any(int64_t n, const void* w, const void* x, int64_t xs, int nrows,
                          float* out, int64_t os) {
  switch (nrows) {
    case 1: vec_dot_rows_512<K, 1>(n, w, x, xs, out, os); break;
    case 2: vec_dot_rows_512<K, 2>(n, w, x, xs, out, os); break;
    case 3: vec_dot_rows_512<K, 3>(n, w, x, xs, out, os); break;
    default: vec_dot_rows_512<K, 4>(n, w, x, xs, out, os); break;
  }
}
template <int K>
void vec_dot_rows_512vnni_any(int64_t n, const void* w, const void* x, int64_t xs, int nrows,
                              float* out, int64_t os) {
  switch (nrows) {
    case 1: vec_dot_rows_512vnni<K, 1>(n, w, x, xs, out, os); break;
    case 2: vec_dot_rows_512vnni<K, 2>(n, w, x, xs, out, os); break;
    case 3: vec_dot_rows_512vnni<K, 3>(n, w, x, xs, out, os); break;
    default: vec_dot_rows_512vnni<K, 4>(n, w, x, xs, out, os); break;
  }
}
static_assert(kDotRows == 4, "vec_dot_rows_*_any handle up to 4 rows");

template <int K>
ArchDot pick() {  // no multi-row AVX2 kernel: one block per step leaves nothing to share
  return by_level<ArchDot>({vec_dot_avx2<K>, nullptr}, {vec_dot_512<K>, vec_dot_rows_512_any<K>},
                           {vec_dot_512vnni<K>, vec_dot_rows_512vnni_any<K>});
}

}  // namespace

ArchDot arch_dot(DType t) {
  switch (t) {
    case DType::Q4_0: return pick<kQ4_0>();
    case DType::Q4_1: return pick<kQ4_1>();
    case DType::Q5_0: return pick<kQ5_0>();
    case DType::Q5_1: return pick<kQ5_1>();
    case DType::Q8_0: return pick<kQ8_0>();
    default: return {};
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
