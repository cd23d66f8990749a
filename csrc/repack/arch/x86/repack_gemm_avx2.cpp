// The AVX2 kernel over packed 32-element block weights (layout and arithmetic in
// repack/repack.h), for CPUs without AVX-512 VNNI. A 64-byte chunk of the panel holds 4 bytes of
// each of the 16 rows; its first 32 bytes are rows 0..7, its second rows 8..15, so each half is
// one 256-bit register with a row in each 32-bit lane. The kernel runs the panel half by half
// (8 rows in the 8 lanes): maddubs (u8 x s8 -> s16 pair sums) against 4 broadcast activation
// bytes, then madd with ones (-> s32): the exact integer isum of the scalar twin
// (repack_gemm.cpp), then its f32 multiply and fmas, so the two agree bit for bit.
//
// maddubs saturates at +-32767, so: 4-bit weights (u <= 15, |x| <= 128) sum all 8 maddubs of a
// block in s16 (|sum| <= 30720); 5-bit ones (u <= 31) 4 at a time (<= 31744); Q8_0 (u = q + 128
// would overflow one maddubs) takes llama.cpp's sign trick, |q| against sign(x, q), whose pair
// sums stay within 2 * 128 * 127 because Q8_0 activations are within +-127. Its isum
// sum(q * x) is the twin's sum(u * x) - 128 * sum(x) exactly, so it skips the prepared term.
//
// No floating-point contraction here: the kernel must round exactly where the scalar twin does.
#include "core/kernel_pragmas.h"

#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include <cstring>

#include "repack/arch/x86/repack_avx2.h"
#include "repack/repack_gemm.h"

namespace vllmx {

namespace {

VLLMX_TARGET_AVX2 inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Bit j of m -> byte j of the result: 0x10 where set, 0 elsewhere (bit 4 of a 5-bit weight).
VLLMX_TARGET_AVX2 inline __m256i bits_to_0x10(uint32_t m) {
  const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                          0x0202020202020202, 0x0303030303030303);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit),
                          _mm256_set1_epi8(0x10));
}

// Block b of rows 8h .. 8h + 7 against R activation rows: acc[t], macc[t] as the twin adds them.
template <int KIND, int R>
VLLMX_TARGET_AVX2 __attribute__((always_inline)) inline void block(
    const uint8_t* panel, int64_t nb, int64_t b, int h, const int8_t* const* xq,
    const float* const* xd, const uint8_t* const* xt, __m256* acc, __m256* macc) {
  using P = Pack<KIND>;
  const uint16_t* dw = reinterpret_cast<const uint16_t*>(panel + P::d_off(nb)) + 8 * h;
  const uint16_t* mw = reinterpret_cast<const uint16_t*>(panel + P::m_off(nb)) + 8 * h;
  const uint8_t* qh = panel + P::qh_off(nb);
  const uint8_t* qs = panel + 32 * h;
  const __m256i ones = _mm256_set1_epi16(1), lo = _mm256_set1_epi8(0x0F);
  {
    __m256i isum[R];
    if constexpr (P::q8) {
      const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
      for (int t = 0; t < R; ++t) isum[t] = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        const __m256i q = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * 512 + 64 * k)), flip);
        const __m256i aq = _mm256_sign_epi8(q, q);
        for (int t = 0; t < R; ++t) {
          const __m256i sx = _mm256_sign_epi8(bcast4(xq[t] + 32 * b + 4 * k), q);
          isum[t] = _mm256_add_epi32(isum[t],
                                     _mm256_madd_epi16(_mm256_maddubs_epi16(aq, sx), ones));
        }
      }
    } else {
      // s16[g][t]: the pair sums of chunks 2g, 2g + 1 (5-bit) or of all four (4-bit, g = 0).
      constexpr int kGroups = P::has_qh ? 2 : 1;
      __m256i s16[kGroups][R];
      for (int g = 0; g < kGroups; ++g)
        for (int t = 0; t < R; ++t) s16[g][t] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * 256 + 64 * c));
        __m256i wl = _mm256_and_si256(v, lo);
        __m256i wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo);
        if constexpr (P::has_qh) {
          uint32_t ml, mh;  // rows 8h.. of masks 2c, 2c + 1: bits 32h .. 32h + 31
          std::memcpy(&ml, qh + b * 64 + 8 * (2 * c) + 4 * h, 4);
          std::memcpy(&mh, qh + b * 64 + 8 * (2 * c + 1) + 4 * h, 4);
          wl = _mm256_or_si256(wl, bits_to_0x10(ml));
          wh = _mm256_or_si256(wh, bits_to_0x10(mh));
        }
        const int g = P::has_qh ? c / 2 : 0;
        for (int t = 0; t < R; ++t) {
          const int8_t* xb = xq[t] + 32 * b;
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(wl, bcast4(xb + 4 * c)),
                                             _mm256_maddubs_epi16(wh, bcast4(xb + 16 + 4 * c)));
          s16[g][t] = _mm256_add_epi16(s16[g][t], p);
        }
      }
      for (int t = 0; t < R; ++t) {
        isum[t] = _mm256_madd_epi16(s16[0][t], ones);
        if constexpr (P::has_qh)
          isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[kGroups - 1][t], ones));
      }
    }
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dw + 16 * b)));
    for (int t = 0; t < R; ++t) {
      int32_t term;
      std::memcpy(&term, xt[t] + 4 * b, 4);
      if constexpr (!P::has_m && !P::q8)
        isum[t] = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(term));
      const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(xd[t][b]));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), scale, acc[t]);
      if constexpr (P::has_m) {
        const __m256 m =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mw + 16 * b)));
        float s;
        std::memcpy(&s, &term, 4);
        macc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(s), macc[t]);
      }
    }
  }
}

template <int KIND, int R>
VLLMX_TARGET_AVX2 void gemm_avx2(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t xs,
                                 float* out, int64_t os, const float* bias) {
  const int8_t* xq[R];
  const float* xd[R];
  const uint8_t* xt[R];
  for (int t = 0; t < R; ++t) {
    const XRow xr(x + t * xs, nb);
    xq[t] = xr.qs;
    xd[t] = xr.d;
    xt[t] = xr.term;
  }
  using P = Pack<KIND>;
  __m256 acc[2][R], macc[2][R];
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < R; ++t) acc[h][t] = macc[h][t] = _mm256_setzero_ps();
  if constexpr (R <= 2) {
    // Decode streams the weights once: both halves of a block while its lines arrive, fetching
    // kPrefetchBytes ahead, so that memory never waits on a second pass.
    constexpr int64_t kBlockBytes = kPackRows * P::type_size;
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_lines(panel + kPrefetchBytes + b * kBlockBytes, kBlockBytes);
      for (int h = 0; h < 2; ++h) block<KIND, R>(panel, nb, b, h, xq, xd, xt, acc[h], macc[h]);
    }
  } else {
    // More rows need the registers for their sums: the panel half by half, the first pass
    // fetching ahead as decode does, the second reading it from L1.
    constexpr int64_t kBlockBytes = kPackRows * P::type_size;
    for (int h = 0; h < 2; ++h)
      for (int64_t b = 0; b < nb; ++b) {
        if (h == 0) prefetch_lines(panel + kPrefetchBytes + b * kBlockBytes, kBlockBytes);
        block<KIND, R>(panel, nb, b, h, xq, xd, xt, acc[h], macc[h]);
      }
  }
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < R; ++t) {
      __m256 v = P::has_m ? _mm256_add_ps(acc[h][t], macc[h][t]) : acc[h][t];
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + 8 * h));
      _mm256_storeu_ps(out + t * os + 8 * h, v);
    }
}

// Up to 4 activation rows per pass keeps the accumulators in the 16 registers; 8 rows are two
// passes over a panel that by then sits in L1.
template <int KIND>
void gemm_avx2_any(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t xs, int nrows,
                   float* out, int64_t os, const float* bias) {
  for (int t = 0; t < nrows; t += 4) {
    const uint8_t* xt = x + t * xs;
    float* ot = out + t * os;
    switch (nrows - t) {
      case 1: gemm_avx2<KIND, 1>(panel, nb, xt, xs, ot, os, bias); break;
      case 2: gemm_avx2<KIND, 2>(panel, nb, xt, xs, ot, os, bias); break;
      case 3: gemm_avx2<KIND, 3>(panel, nb, xt, xs, ot, os, bias); break;
      default: gemm_avx2<KIND, 4>(panel, nb, xt, xs, ot, os, bias); break;
    }
  }
}

}  // namespace

PackedGemmFn avx2_packed_gemm(DType base) {
  switch (base) {
    case DType::Q4_0: return gemm_avx2_any<kP4_0>;
    case DType::Q4_1: return gemm_avx2_any<kP4_1>;
    case DType::Q5_0: return gemm_avx2_any<kP5_0>;
    case DType::Q5_1: return gemm_avx2_any<kP5_1>;
    case DType::Q8_0: return gemm_avx2_any<kP8_0>;
    default: return nullptr;
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
