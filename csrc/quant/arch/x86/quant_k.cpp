// x86 Q8_K activation quantization (AVX2, AVX-512): the per-block part of llama.cpp's
// quantize_row_q8_K_ref, bit for bit; the scale and the rest of the row are in
// quant/quant_k.cpp.
#include "core/kernel_pragmas.h"

#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include "quant/arch/arch.h"
#include "quant/arch/x86/pick.h"
#include "quant/quant_k.h"

namespace vllmx {

namespace {

// iscale * x rounded half-to-even (cvtps under the default MXCSR rounding = nearest_int),
// clamped to 127, with the 16-value sums.
VLLMX_TARGET_AVX512 void quantize_block_q8_K_avx512(const float* x, float iscale, block_q8_K& y) {
  const __m512 vs = _mm512_set1_ps(iscale);
  const __m512i top = _mm512_set1_epi32(127);
  for (int g = 0; g < QK_K / 16; ++g) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * g), vs));
    q = _mm512_min_epi32(q, top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y.qs + 16 * g), _mm512_cvtsepi32_epi8(q));
    y.bsums[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
  }
}
VLLMX_TARGET_AVX2 void quantize_block_q8_K_avx2(const float* x, float iscale, block_q8_K& y) {
  const __m256 vs = _mm256_set1_ps(iscale);
  const __m256i top = _mm256_set1_epi32(127);
  for (int g = 0; g < QK_K / 16; ++g) {
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * g), vs));
    __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * g + 8), vs));
    a = _mm256_min_epi32(a, top);
    b = _mm256_min_epi32(b, top);
    __m256i s = _mm256_add_epi32(a, b);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    y.bsums[g] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
    const __m256i p16 = _mm256_packs_epi32(a, b);  // a0-3 b0-3 | a4-7 b4-7
    __m128i p8 = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
    p8 = _mm_shuffle_epi32(p8, 0xD8);  // a0-3 a4-7 b0-3 b4-7
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y.qs + 16 * g), p8);
  }
}

// The block's largest magnitude by a vector max (max_ps(|x|, m) keeps m where |x| is NaN, as
// the scalar loop's `>` skips NaNs), then the first element of that magnitude: the scalar
// loop's value (it keeps the first on ties), found in a 256-value block of prefill activations
// 16 at a time instead of one (5% of a small Qwen3.5's prefill).
VLLMX_TARGET_AVX512 float signed_max_avx512(const float* x, float* amax_out) {
  __m512 m = _mm512_setzero_ps();
  for (int g = 0; g < QK_K / 16; ++g)
    m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * g)), m);
  const float amax = _mm512_reduce_max_ps(m);
  *amax_out = amax;
  if (!(amax > 0.0f)) return 0.0f;
  const __m512 va = _mm512_set1_ps(amax);
  for (int g = 0; g < QK_K / 16; ++g) {
    const __mmask16 hit = _mm512_cmpeq_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * g)), va);
    if (hit != 0) return x[16 * g + __builtin_ctz(hit)];
  }
  return 0.0f;  // (unreachable: amax is one of the magnitudes)
}

}  // namespace

SignedMaxFn arch_signed_max_q8_K() {
  return by_level<SignedMaxFn>(nullptr, signed_max_avx512, signed_max_avx512);
}

QuantBlockQ8KFn arch_quantize_block_q8_K() {  // VNNI: the AVX-512 block
  return by_level<QuantBlockQ8KFn>(quantize_block_q8_K_avx2, quantize_block_q8_K_avx512,
                                   quantize_block_q8_K_avx512);
}

}  // namespace vllmx
#endif  // VLLMX_X86
