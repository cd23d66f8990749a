// The x86 kernel over packed k-quant weights (layout and arithmetic in repack/repack.h):
// AVX-512 VNNI, one panel of 16 output rows against 1..kPackedRows activation rows. Each
// super-block is unpacked once per call (16 rows at a time, into unsigned bytes with the rows in
// the 16 lanes) and then applied to every activation row by dpbusd; per row and super-block it
// forms the k-quant vec_dot's exact integers isum / imin and combines them with the vec_dot's own
// f32 expression, as the scalar twin (repack_gemm_k.cpp) does, so a row's result equals the
// vec_dot's bit for bit, whatever the number of rows in the call.
//
// No floating-point contraction here: the combine must round exactly where the vec_dot does.
#include "core/kernel_pragmas.h"

#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include <cstring>

#include "repack/arch/arch.h"
#include "repack/arch/x86/repack_avx2.h"
#include "repack/repack_gemm.h"

namespace vllmx {

namespace {

VLLMX_TARGET_AVX512VNNI inline __m512i ld(const uint8_t* p) { return _mm512_loadu_si512(p); }

VLLMX_TARGET_AVX512VNNI inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Byte b of every 32-bit lane, as an int32 (unsigned).
template <int B>
VLLMX_TARGET_AVX512VNNI inline __m512i lane_byte(__m512i v) {
  return _mm512_and_si512(_mm512_srli_epi32(v, 8 * B), _mm512_set1_epi32(0xFF));
}

// acc[t] += sc * sum_k u[k] . x_t[xo + 4k .. +3] (k = 0..NK-1), minus the per-group term.
template <int R, int NK, bool kSub>
VLLMX_TARGET_AVX512VNNI inline void group_dot(__m512i* isum, const __m512i* w, __m512i sc,
                                              const int8_t* const* xq, int64_t xo,
                                              const int32_t* const* xt, int64_t ti) {
  for (int t = 0; t < R; ++t) {
    __m512i dot = _mm512_setzero_si512();
    for (int k = 0; k < NK; ++k) dot = _mm512_dpbusd_epi32(dot, w[k], bcast4(xq[t] + xo + 4 * k));
    if constexpr (kSub) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(xt[t][ti]));
    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot, sc));
  }
}

template <int KIND, int R>
VLLMX_TARGET_AVX512VNNI void gemm_k_vnni(const uint8_t* panel, int64_t nb, const uint8_t* x,
                                         int64_t xs, float* out, int64_t os, const float* bias) {
  using P = PackK<KIND>;
  const int8_t* xq[R];
  const float* xd[R];
  const int32_t* xt[R];
  __m512 acc[R];
  for (int t = 0; t < R; ++t) {
    const XRowK xr(x + t * xs, nb);
    xq[t] = xr.qs;
    xd[t] = xr.d;
    xt[t] = xr.term;
    acc[t] = _mm512_setzero_ps();
  }
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  for (int64_t s = 0; s < nb; ++s) {
    const uint8_t* o = panel + s * P::block_bytes;
    prefetch_lines(o + P::block_bytes, P::block_bytes);  // the next super-block, early
    const int8_t* xs_q[R];
    const int32_t* xs_t[R];
    for (int t = 0; t < R; ++t) {
      xs_q[t] = xq[t] + QK_K * s;
      xs_t[t] = xt[t] + 16 * s;
    }
    __m512i isum[R];
    for (int t = 0; t < R; ++t) isum[t] = _mm512_setzero_si512();
    __m512i w[8];
    if constexpr (P::q6) {
      const __m512i m30 = _mm512_set1_epi8(0x30);
      for (int c = 0; c < 2; ++c)
        for (int sh = 0; sh < 4; ++sh) {  // elements 128c + 32 sh + 0..31: groups 8c + 2sh (+1)
          for (int k = 0; k < 8; ++k) {
            const __m512i v = ld(o + 64 * (16 * c + 8 * (sh & 1) + k));
            const __m512i nib = sh >> 1 ? _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4)
                                        : _mm512_and_si512(v, lo4);
            const __m512i h = ld(o + P::qh_off + 64 * (8 * c + k));
            const __m512i hb = sh == 0   ? _mm512_slli_epi16(h, 4)
                               : sh == 1 ? _mm512_slli_epi16(h, 2)
                               : sh == 2 ? h
                                         : _mm512_srli_epi16(h, 2);
            w[k] = _mm512_or_si512(nib, _mm512_and_si512(hb, m30));
          }
          for (int half = 0; half < 2; ++half) {
            const int g = 8 * c + 2 * sh + half;
            // Group g's int8 scale, sign-extended in each row's lane.
            const __m512i sv = ld(o + P::sc_off + 64 * (g / 4));
            const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(sv, 24 - 8 * (g % 4)), 24);
            group_dot<R, 4, true>(isum, w + 4 * half, sc, xs_q, 128 * c + 32 * sh + 16 * half,
                                  xs_t, g);
          }
        }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(o + P::d_off)));
      for (int t = 0; t < R; ++t) {
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(xd[t][s]));
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(isum[t])));
      }
    } else {
      // The 6-bit scales and mins of the 16 rows, with llama.cpp's u32 word arithmetic.
      const __m512i a0 = ld(o + P::sc_off), a1 = ld(o + P::sc_off + 64),
                    a2 = ld(o + P::sc_off + 128);
      const __m512i low6 = _mm512_set1_epi8(0x3F), low2 = _mm512_set1_epi8(0x03);
      const __m512i sc_lo = _mm512_and_si512(a0, low6);
      const __m512i sc_hi = _mm512_or_si512(
          _mm512_and_si512(a2, lo4),
          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a0, 6), low2), 4));
      for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h) {  // elements 64j + 32h + 0..31: scale group 2j + h
          for (int k = 0; k < 8; ++k) {
            const __m512i v = ld(o + 64 * (8 * j + k));
            w[k] = h ? _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4) : _mm512_and_si512(v, lo4);
            if constexpr (KIND == kQ5K) {
              const __m512i qh = ld(o + P::qh_off + 64 * k);
              const int b = 2 * j + h;  // bit b of the byte -> bit 4
              const __m512i hb = b <= 4 ? _mm512_slli_epi16(qh, 4 - b)
                                        : _mm512_srli_epi16(qh, b - 4);
              w[k] = _mm512_or_si512(w[k], _mm512_and_si512(hb, _mm512_set1_epi8(0x10)));
            }
          }
          const int g = 2 * j + h;
          const __m512i sv = g < 4 ? sc_lo : sc_hi;
          __m512i sc;
          switch (g % 4) {
            case 0: sc = lane_byte<0>(sv); break;
            case 1: sc = lane_byte<1>(sv); break;
            case 2: sc = lane_byte<2>(sv); break;
            default: sc = lane_byte<3>(sv); break;
          }
          group_dot<R, 8, false>(isum, w, sc, xs_q, 64 * j + 32 * h, xs_t, 0);
        }
      // imin: the mins as int16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) against the
      // prepared pairs of 32-element activation sums (repack.h), by dpwssd.
      const __m512i mn_lo = _mm512_and_si512(a1, low6);
      const __m512i mn_hi = _mm512_or_si512(
          _mm512_and_si512(_mm512_srli_epi32(a2, 4), lo4),
          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a1, 6), low2), 4));
      const __m512i even = _mm512_set1_epi32(0x00FF00FF);
      const __m512i mp[4] = {_mm512_and_si512(mn_lo, even), _mm512_srli_epi16(mn_lo, 8),
                             _mm512_and_si512(mn_hi, even), _mm512_srli_epi16(mn_hi, 8)};
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(o + P::d_off)));
      const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(o + P::dmin_off)));
      for (int t = 0; t < R; ++t) {
        __m512i imin = _mm512_setzero_si512();
        for (int p = 0; p < 4; ++p)
          imin = _mm512_dpwssd_epi32(imin, mp[p], _mm512_set1_epi32(xs_t[t][p]));
        const __m512 dx = _mm512_set1_ps(xd[t][s]);
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_mul_ps(dw, dx),
                                                     _mm512_cvtepi32_ps(isum[t])));
        acc[t] = _mm512_sub_ps(acc[t], _mm512_mul_ps(_mm512_mul_ps(mw, dx),
                                                     _mm512_cvtepi32_ps(imin)));
      }
    }
  }
  for (int t = 0; t < R; ++t) {
    __m512 v = acc[t];
    if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias));
    _mm512_storeu_ps(out + t * os, v);
  }
}

// All kPackedRows rows in one kernel call: each super-block unpacked once for 8 rows measured
// 3-8% faster than for 4 or 6 (Q4_K, Q6_K; Sapphire Rapids), register spills included.
static_assert(kPackedRows == 8, "gemm_k_vnni_any handles up to 8 rows");

template <int KIND>
void gemm_k_vnni_any(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t xs, int nrows,
                     float* out, int64_t os, const float* bias) {
  switch (nrows) {
    case 1: gemm_k_vnni<KIND, 1>(panel, nb, x, xs, out, os, bias); break;
    case 2: gemm_k_vnni<KIND, 2>(panel, nb, x, xs, out, os, bias); break;
    case 3: gemm_k_vnni<KIND, 3>(panel, nb, x, xs, out, os, bias); break;
    case 4: gemm_k_vnni<KIND, 4>(panel, nb, x, xs, out, os, bias); break;
    case 5: gemm_k_vnni<KIND, 5>(panel, nb, x, xs, out, os, bias); break;
    case 6: gemm_k_vnni<KIND, 6>(panel, nb, x, xs, out, os, bias); break;
    case 7: gemm_k_vnni<KIND, 7>(panel, nb, x, xs, out, os, bias); break;
    default: gemm_k_vnni<KIND, 8>(panel, nb, x, xs, out, os, bias); break;
  }
}

}  // namespace

PackedGemmFn arch_packed_gemm_k(DType base) {
  if (simd_level() < 1) return nullptr;
  if (simd_level() < 3) return avx2_packed_gemm_k(base);  // repack_gemm_k_avx2.cpp
  switch (base) {
    case DType::Q4_K: return gemm_k_vnni_any<kQ4K>;
    case DType::Q5_K: return gemm_k_vnni_any<kQ5K>;
    case DType::Q6_K: return gemm_k_vnni_any<kQ6K>;
    default: return nullptr;
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
