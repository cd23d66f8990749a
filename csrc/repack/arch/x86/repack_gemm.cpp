// The x86 kernel over packed weights (layout and arithmetic in repack/repack.h): AVX-512 VNNI
// (the AVX2 one is in repack_gemm_avx2.cpp),
// one panel of 16 output rows against 1..kPackedRows activation rows, the 16 rows in the 16
// lanes (integer dots by dpbusd, then the scalar twin's f32 multiply and fmas, repack_gemm.cpp),
// so the two agree bit for bit whatever the number of rows in the call.
//
// No floating-point contraction here: the kernel must round exactly where the scalar twin does.
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

VLLMX_TARGET_AVX512VNNI inline __m512 load_f16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

VLLMX_TARGET_AVX512VNNI inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <int KIND, int R>
VLLMX_TARGET_AVX512VNNI void gemm_vnni(const uint8_t* panel, int64_t nb, const uint8_t* x,
                                       int64_t xs, float* out, int64_t os, const float* bias) {
  using P = Pack<KIND>;
  // d_off before qh_off: with GCC 12 this order (the one the scalar twin set when it shared this
  // file) gives the R = 8 kernels of Q4_0, Q4_1 and Q8_0 code that runs 15-25% faster.
  const uint16_t* dw = reinterpret_cast<const uint16_t*>(panel + P::d_off(nb));
  const uint16_t* mw = reinterpret_cast<const uint16_t*>(panel + P::m_off(nb));
  const uint8_t* qh = panel + P::qh_off(nb);
  const int8_t* xq[R];
  const float* xd[R];
  const uint8_t* xt[R];
  __m512 acc[R], macc[R];
  for (int t = 0; t < R; ++t) {
    const XRow xr(x + t * xs, nb);
    xq[t] = xr.qs;
    xd[t] = xr.d;
    xt[t] = xr.term;
    acc[t] = macc[t] = _mm512_setzero_ps();
  }
  // Decode and verify steps stream each weight once from memory: prefetch kPrefetchBytes
  // ahead, through the panel and on into the next, at the rate the loop consumes it (more
  // misses in flight; without it a 5-row step stalled on its weight loads).
  constexpr int64_t kBlockBytes = kPackRows * P::type_size;
  for (int64_t b = 0; b < nb; ++b) {
    prefetch_lines(panel + kPrefetchBytes + b * kBlockBytes, kBlockBytes);
    // w[k] holds 4 consecutive elements of each of the 16 rows, starting at element xo[k].
    __m512i w[8];
    int xo[8];
    if constexpr (P::q8) {
      for (int k = 0; k < 8; ++k) {
        w[k] = _mm512_loadu_si512(panel + b * 512 + 64 * k);
        xo[k] = 4 * k;
      }
    } else {
      const __m512i lo = _mm512_set1_epi8(0x0F);
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(panel + b * 256 + 64 * c);
        w[2 * c] = _mm512_and_si512(v, lo);
        w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo);
        xo[2 * c] = 4 * c;
        xo[2 * c + 1] = 16 + 4 * c;
      }
      if constexpr (P::has_qh) {
        const __m512i sixteen = _mm512_set1_epi8(0x10);
        for (int k = 0; k < 8; ++k) {
          uint64_t mk;
          std::memcpy(&mk, qh + b * 64 + 8 * k, 8);
          w[k] = _mm512_mask_add_epi8(w[k], static_cast<__mmask64>(mk), w[k], sixteen);
        }
      }
    }
    const __m512 d = load_f16x16(dw + b * 16);
    const __m512 m = P::has_m ? load_f16x16(mw + b * 16) : _mm512_setzero_ps();
    for (int t = 0; t < R; ++t) {
      const int8_t* xb = xq[t] + 32 * b;
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int k = 0; k < 8; k += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[k], bcast4(xb + xo[k]));
        s1 = _mm512_dpbusd_epi32(s1, w[k + 1], bcast4(xb + xo[k + 1]));
      }
      __m512i isum = _mm512_add_epi32(s0, s1);
      int32_t term;
      std::memcpy(&term, xt[t] + 4 * b, 4);
      if constexpr (!P::has_m) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(term));
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xd[t][b]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t]);
      if constexpr (P::has_m) {
        float s;
        std::memcpy(&s, &term, 4);
        macc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(s), macc[t]);
      }
    }
  }
  for (int t = 0; t < R; ++t) {
    __m512 v = P::has_m ? _mm512_add_ps(acc[t], macc[t]) : acc[t];
    if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias));
    _mm512_storeu_ps(out + t * os, v);
  }
}

template <int KIND>
void gemm_vnni_any(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t xs, int nrows,
                   float* out, int64_t os, const float* bias) {
  switch (nrows) {
    case 1: gemm_vnni<KIND, 1>(panel, nb, x, xs, out, os, bias); break;
    case 2: gemm_vnni<KIND, 2>(panel, nb, x, xs, out, os, bias); break;
    case 3: gemm_vnni<KIND, 3>(panel, nb, x, xs, out, os, bias); break;
    case 4: gemm_vnni<KIND, 4>(panel, nb, x, xs, out, os, bias); break;
    case 5: gemm_vnni<KIND, 5>(panel, nb, x, xs, out, os, bias); break;
    case 6: gemm_vnni<KIND, 6>(panel, nb, x, xs, out, os, bias); break;
    case 7: gemm_vnni<KIND, 7>(panel, nb, x, xs, out, os, bias); break;
    default: gemm_vnni<KIND, 8>(panel, nb, x, xs, out, os, bias); break;
  }
}
static_assert(kPackedRows == 8, "gemm_vnni_any handles up to 8 rows");

}  // namespace

PackedGemmFn arch_packed_gemm(DType base) {
  // Below VNNI (AVX2, AVX-512 without VNNI) the AVX2 kernel of the same layout.
  if (simd_level() < 1) return nullptr;
  if (simd_level() < 3) return avx2_packed_gemm(base);
  switch (base) {
    case DType::Q4_0: return gemm_vnni_any<kP4_0>;
    case DType::Q4_1: return gemm_vnni_any<kP4_1>;
    case DType::Q5_0: return gemm_vnni_any<kP5_0>;
    case DType::Q5_1: return gemm_vnni_any<kP5_1>;
    case DType::Q8_0: return gemm_vnni_any<kP8_0>;
    default: return nullptr;
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
