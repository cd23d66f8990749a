// Kernels over packed weights (layout and arithmetic in repack.h): one panel of 16 output rows
// against 1..4 activation rows. The scalar twin spells out the arithmetic element by element;
// the AVX-512 VNNI kernel does the same operations with the 16 rows in the 16 lanes (integer
// dots by dpbusd, then the same f32 multiply and fmas), so the two agree bit for bit, and the
// result for a row never depends on how many activation rows share the call.
//
// No floating-point contraction here: the scalar twin must round exactly where the SIMD one does.
#include "core/kernel_pragmas.h"

#include <cmath>
#include <cstring>

#include "core/cpu_features.h"
#include "core/half.h"
#include "quant/quant.h"
#include "repack/repack.h"

#if VLLMX_X86
#include <immintrin.h>
#endif

namespace vllmx {

namespace {

enum PackKind { kP4_0, kP4_1, kP5_0, kP5_1, kP8_0 };

template <int KIND>
struct Pack {
  static constexpr bool q8 = KIND == kP8_0;
  static constexpr bool has_qh = KIND == kP5_0 || KIND == kP5_1;
  static constexpr bool has_m = KIND == kP4_1 || KIND == kP5_1;
  static constexpr int64_t qs_bytes = q8 ? 512 : 256;
  static constexpr int64_t type_size = q8 ? 34 : 18 + (has_qh ? 4 : 0) + (has_m ? 2 : 0);
  // Offsets of the parts of a panel of nb blocks.
  static int64_t qh_off(int64_t nb) { return nb * qs_bytes; }
  static int64_t d_off(int64_t nb) { return qh_off(nb) + (has_qh ? nb * 64 : 0); }
  static int64_t m_off(int64_t nb) { return d_off(nb) + nb * 32; }
};

// Prepared activation row (repack.h): qs [K], d_x f32 [nb], term f32 / int32 [nb].
struct XRow {
  const int8_t* qs;
  const float* d;
  const uint8_t* term;
  XRow(const uint8_t* row, int64_t nb)
      : qs(reinterpret_cast<const int8_t*>(row)),
        d(reinterpret_cast<const float*>(row + nb * 32)),
        term(row + nb * 32 + nb * 4) {}
  int32_t term_i(int64_t b) const {
    int32_t v;
    std::memcpy(&v, term + 4 * b, 4);
    return v;
  }
  float term_f(int64_t b) const {
    float v;
    std::memcpy(&v, term + 4 * b, 4);
    return v;
  }
};

// ---------------------------------------------------------------- scalar twin

// Stored unsigned weight of panel row r, block b, element e (0..31).
template <int KIND>
inline int32_t packed_u(const uint8_t* panel, int64_t nb, int64_t b, int r, int e) {
  using P = Pack<KIND>;
  if constexpr (P::q8) return panel[b * 512 + 64 * (e / 4) + 4 * r + e % 4];
  const int hi = e >= 16, c = (e % 16) / 4, i = e % 4;
  const uint8_t byte = panel[b * 256 + 64 * c + 4 * r + i];
  int32_t u = hi ? byte >> 4 : byte & 0x0F;
  if constexpr (P::has_qh) {
    const uint8_t* mask = panel + P::qh_off(nb) + b * 64 + 8 * (2 * c + hi);
    const int bit = 4 * r + i;
    u |= ((mask[bit / 8] >> (bit % 8)) & 1) << 4;
  }
  return u;
}

template <int KIND>
void gemm_ref(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t xs, int nrows,
              float* out, int64_t os, const float* bias) {
  using P = Pack<KIND>;
  const uint16_t* dw = reinterpret_cast<const uint16_t*>(panel + P::d_off(nb));
  const uint16_t* mw = reinterpret_cast<const uint16_t*>(panel + P::m_off(nb));
  for (int t = 0; t < nrows; ++t) {
    const XRow xr(x + t * xs, nb);
    for (int r = 0; r < kPackRows; ++r) {
      float acc = 0.0f, macc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t isum = 0;
        for (int e = 0; e < 32; ++e) isum += packed_u<KIND>(panel, nb, b, r, e) * xr.qs[32 * b + e];
        if constexpr (!P::has_m) isum -= xr.term_i(b);
        const float scale = f16_to_f32(dw[b * 16 + r]) * xr.d[b];
        acc = std::fma(static_cast<float>(isum), scale, acc);
        if constexpr (P::has_m) macc = std::fma(f16_to_f32(mw[b * 16 + r]), xr.term_f(b), macc);
      }
      const float v = P::has_m ? acc + macc : acc;
      out[t * os + r] = bias ? v + bias[r] : v;
    }
  }
}

// ---------------------------------------------------------------- AVX-512 VNNI

#if VLLMX_X86
constexpr int64_t kPrefetchBytes = 4096;  // 2-8 KiB measured alike; none is ~10% slower

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
  const uint8_t* qh = panel + P::qh_off(nb);
  const uint16_t* dw = reinterpret_cast<const uint16_t*>(panel + P::d_off(nb));
  const uint16_t* mw = reinterpret_cast<const uint16_t*>(panel + P::m_off(nb));
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
  // Decode streams each weight once from memory: prefetch kPrefetchBytes ahead, through the
  // panel and on into the next, at the rate the loop consumes it (more misses in flight).
  constexpr int64_t kBlockBytes = kPackRows * P::type_size;
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (R == 1) {
      const char* pf = reinterpret_cast<const char*>(panel) + kPrefetchBytes + b * kBlockBytes;
      for (int64_t l = 0; l < (kBlockBytes + 63) / 64; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
    }
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
#endif  // VLLMX_X86

template <int KIND>
PackedGemmFn pick(bool reference) {
#if VLLMX_X86
  if (!reference && simd_level() >= 3) return gemm_vnni_any<KIND>;
#endif
  (void)reference;
  return gemm_ref<KIND>;
}

}  // namespace

PackedGemmFn packed_gemm(DType base, bool reference) {
  switch (base) {
    case DType::Q4_0: return pick<kP4_0>(reference);
    case DType::Q4_1: return pick<kP4_1>(reference);
    case DType::Q5_0: return pick<kP5_0>(reference);
    case DType::Q5_1: return pick<kP5_1>(reference);
    case DType::Q8_0: return pick<kP8_0>(reference);
    default: return packed_gemm_k(base, reference);
  }
}

}  // namespace vllmx
