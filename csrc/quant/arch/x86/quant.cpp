// x86 activation quantization to Q8_0 / Q8_1 (AVX2, AVX-512): the bits of llama.cpp's
// reference rounding (quantize_row_q8_0_ref / _q8_1_ref in quant/quant.cpp).
//
// No floating-point contraction in this file: the SIMD rounding trick below needs a separately
// rounded product.
#include "core/kernel_pragmas.h"

#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include "core/half.h"
#include "quant/arch/arch.h"
#include "quant/arch/x86/pick.h"
#include "quant/quant.h"

namespace vllmx {

namespace {

// roundf (half away from zero) of |v| < 2^23: trunc(v + copysign(0.5 - 2^-25, v)) (the sum's own
// rounding carries exact halves up). Returns the block's int8 values and their sum.
VLLMX_TARGET_AVX512 inline int quantize_block_q8_avx512(const float* x, int8_t* qs, float* d_out) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 m = _mm512_max_ps(_mm512_and_ps(a, absmask), _mm512_and_ps(b, absmask));
  const float amax = _mm512_reduce_max_ps(m);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m512 vid = _mm512_set1_ps(id);
  const __m512 half = _mm512_set1_ps(0.49999997f);
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0x80000000u)));
  __m512 va = _mm512_mul_ps(a, vid), vb = _mm512_mul_ps(b, vid);
  va = _mm512_add_ps(va, _mm512_or_ps(half, _mm512_and_ps(va, sign)));
  vb = _mm512_add_ps(vb, _mm512_or_ps(half, _mm512_and_ps(vb, sign)));
  const __m512i ia = _mm512_cvttps_epi32(va), ib = _mm512_cvttps_epi32(vb);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(ia));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(ib));
  *d_out = d;
  return _mm512_reduce_add_epi32(_mm512_add_epi32(ia, ib));
}

VLLMX_TARGET_AVX512 void quantize_row_q8_0_avx512(const float* x, void* vy, int64_t n) {
  block_q8_0* y = static_cast<block_q8_0*>(vy);
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    float d;
    quantize_block_q8_avx512(x + i * QK8_0, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
  }
}
VLLMX_TARGET_AVX512 void quantize_row_q8_1_avx512(const float* x, void* vy, int64_t n) {
  block_q8_1* y = static_cast<block_q8_1*>(vy);
  for (int64_t i = 0; i < n / QK8_1; ++i) {
    float d;
    const int sum = quantize_block_q8_avx512(x + i * QK8_1, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
    y[i].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}

VLLMX_TARGET_AVX2 inline int quantize_block_q8_avx2(const float* x, int8_t* qs, float* d_out) {
  __m256 v[4];
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    m = _mm256_max_ps(m, _mm256_and_ps(v[k], absmask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  const __m256 half = _mm256_set1_ps(0.49999997f);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  __m256i iv[4];
  for (int k = 0; k < 4; ++k) {
    __m256 t = _mm256_mul_ps(v[k], vid);
    t = _mm256_add_ps(t, _mm256_or_ps(half, _mm256_and_ps(t, sign)));
    iv[k] = _mm256_cvttps_epi32(t);
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
  // pack 32 x i32 -> 32 x i8 in order
  const __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]);  // lanes interleaved by 128-bit halves
  const __m256i p23 = _mm256_packs_epi32(iv[2], iv[3]);
  __m256i p = _mm256_packs_epi16(p01, p23);
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), p);
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  *d_out = d;
  return _mm_cvtsi128_si32(s4);
}
VLLMX_TARGET_AVX2 void quantize_row_q8_0_avx2(const float* x, void* vy, int64_t n) {
  block_q8_0* y = static_cast<block_q8_0*>(vy);
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    float d;
    quantize_block_q8_avx2(x + i * QK8_0, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
  }
}
VLLMX_TARGET_AVX2 void quantize_row_q8_1_avx2(const float* x, void* vy, int64_t n) {
  block_q8_1* y = static_cast<block_q8_1*>(vy);
  for (int64_t i = 0; i < n / QK8_1; ++i) {
    float d;
    const int sum = quantize_block_q8_avx2(x + i * QK8_1, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
    y[i].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}

}  // namespace

FromFloatFn arch_quantize_row(DType t) {  // VNNI: the AVX-512 rows
  switch (t) {
    case DType::Q8_0:
      return by_level<FromFloatFn>(quantize_row_q8_0_avx2, quantize_row_q8_0_avx512,
                                   quantize_row_q8_0_avx512);
    case DType::Q8_1:
      return by_level<FromFloatFn>(quantize_row_q8_1_avx2, quantize_row_q8_1_avx512,
                                   quantize_row_q8_1_avx512);
    default: return nullptr;
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
