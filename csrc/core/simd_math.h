// Vector math shared by the AVX-512 and AVX2 kernels.
#pragma once
#include "core/cpu_features.h"

#include <algorithm>
#include <cstdint>

#if VLLMX_X86
#include <immintrin.h>

namespace vllmx {

// Cephes-style expf, ~1 ulp, for x in [lo, 88.7] (inputs are clamped there; NaN gives exp(lo)).
// Callers pick lo: the sampler -87 (zeroing what lies below: sampler.cpp exp_or_zero),
// attention -103.
VLLMX_TARGET_AVX512 inline __m512 exp512(__m512 x, float lo) {
  x = _mm512_max_ps(x, _mm512_set1_ps(lo));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// exp512's algorithm at 8 lanes (AVX2 has no scalef): 2^n is applied as two factors
// 2^(n >> 1) and 2^(n - (n >> 1)), each a normal float for n >= -149.
VLLMX_TARGET_AVX2 inline __m256 exp256(__m256 x, float lo) {
  x = _mm256_max_ps(x, _mm256_set1_ps(lo));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y =
      _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, f1), f2);
}

// silu(v) = v / (1 + exp(-v)) on exp512 / exp256 (the SwiGLU activation's and causal_conv1d's).
VLLMX_TARGET_AVX512 inline __m512 silu512(__m512 v) {
  const __m512 e = exp512(_mm512_xor_ps(v, _mm512_set1_ps(-0.0f)), -103.0f);
  return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
VLLMX_TARGET_AVX2 inline __m256 silu256(__m256 v) {
  const __m256 e = exp256(_mm256_xor_ps(v, _mm256_set1_ps(-0.0f)), -103.0f);
  return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// erf(x) as x P(x^2) / Q(x^2) on x clamped to [-4, 4] (erf(4) is 1 in f32): a rational fit,
// within 5e-7 of erf everywhere (checked against math.erf on a 6e-5 grid over [-6, 6]).
struct ErfFit {
  static constexpr float p[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f,
                                 -2.10102402082508e-06f, -5.69250639462346e-05f,
                                 -7.34990630326855e-04f, -2.95459980854025e-03f,
                                 -1.60960333262415e-02f};
  static constexpr float q[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f,
                                 -1.68282697438203e-03f, -7.37332916720468e-03f,
                                 -1.42647390514189e-02f};
};

VLLMX_TARGET_AVX512 inline __m512 erf512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-4.0f)), _mm512_set1_ps(4.0f));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(ErfFit::p[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(ErfFit::p[i]));
  __m512 q = _mm512_set1_ps(ErfFit::q[0]);
  for (int i = 1; i < 5; ++i) q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(ErfFit::q[i]));
  return _mm512_div_ps(_mm512_mul_ps(x, p), q);
}

VLLMX_TARGET_AVX2 inline __m256 erf256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-4.0f)), _mm256_set1_ps(4.0f));
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(ErfFit::p[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(ErfFit::p[i]));
  __m256 q = _mm256_set1_ps(ErfFit::q[0]);
  for (int i = 1; i < 5; ++i) q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(ErfFit::q[i]));
  return _mm256_div_ps(_mm256_mul_ps(x, p), q);
}

// Lanes 0 .. left - 1 of a 16-lane mask (all of them from 16 on), for masked loads / stores.
VLLMX_TARGET_AVX512 inline __mmask16 lanes512(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF)
                    : static_cast<__mmask16>((1u << left) - 1);
}

// Lanes 0 .. left - 1 of an 8-lane mask (all of them from 8 on), for maskload / maskstore.
VLLMX_TARGET_AVX2 inline __m256i lanes256(int64_t left) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 8))),
                            idx);
}

}  // namespace vllmx
#endif
