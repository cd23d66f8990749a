// apply_token_bitmask: structured output's grammar mask over the batch's logits, in place.
// Bitmask row r (one 32-bit word per 32 tokens, bit j of word w = token 32 w + j, as llguidance
// and xgrammar pack it) applies to logits row indices[r] (or r): every token whose bit is 0
// becomes -inf. Words with every bit set (all allowed) are skipped, so a permissive grammar
// state costs one read per 32 tokens.
//
// Fast paths: AVX-512 writes 16 lanes per masked store straight from the word's bits; AVX2
// expands 8 bits at a time into a lane mask and blends. Reference twin: one bit test per token.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "core/cpu_features.h"
#include "core/op_table.h"

namespace vllmx {

namespace {

constexpr const char* kOp = "apply_token_bitmask";
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Masks tokens [32 w, 32 w + n) of row l by word `bits` (n <= 32: the last word may be short).
using WordFn = void (*)(float* l, uint32_t bits, int n);

void word_scalar(float* l, uint32_t bits, int n) {
  for (int j = 0; j < n; ++j)
    if (!((bits >> j) & 1u)) l[j] = kNegInf;
}

#if VLLMX_X86
VLLMX_TARGET_AVX2 void word_avx2(float* l, uint32_t bits, int n) {
  if (n < 32) return word_scalar(l, bits, n);
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  for (int k = 0; k < 32; k += 8) {
    const __m256i b = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits >> k)), lane_bit);
    const __m256 banned = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, _mm256_setzero_si256()));
    _mm256_storeu_ps(l + k, _mm256_blendv_ps(_mm256_loadu_ps(l + k), neg_inf, banned));
  }
}

VLLMX_TARGET_AVX512 void word_avx512(float* l, uint32_t bits, int n) {
  const uint32_t valid = n == 32 ? ~0u : (1u << n) - 1u;
  const uint32_t banned = ~bits & valid;
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  _mm512_mask_storeu_ps(l, static_cast<__mmask16>(banned & 0xffffu), neg_inf);
  _mm512_mask_storeu_ps(l + 16, static_cast<__mmask16>(banned >> 16), neg_inf);
}
#endif

WordFn pick_word_fn() {
#if VLLMX_X86
  if (simd_level() >= 2) return word_avx512;
  if (simd_level() >= 1) return word_avx2;
#endif
  return word_scalar;
}

}  // namespace

void apply_token_bitmask_kernel(const Tensor& logits, const Tensor& bitmask,
                                const Tensor& indices, bool reference) {
  // The shapes are the op's contract (csrc/ops.cpp); the row indices are read here.
  const int64_t B = logits.shape[0], V = logits.shape[1], R = bitmask.shape[0];
  const int64_t W = bitmask.shape[1];
  const int32_t* rows = indices.defined() ? indices.ptr<int32_t>() : nullptr;
  if (rows != nullptr) {
    std::vector<char> seen(static_cast<size_t>(B), 0);  // rows run in parallel: no two alike
    for (int64_t r = 0; r < R; ++r) {
      VLLMX_CHECK(rows[r] >= 0 && rows[r] < B && !seen[rows[r]], kOp,
                  "indices[" + std::to_string(r) + "] = " + std::to_string(rows[r]) +
                      " is not a distinct row of logits " + logits.str());
      seen[rows[r]] = 1;
    }
  }
  if (R == 0 || V == 0) return;
  static const WordFn fast = pick_word_fn();
  const WordFn word = reference ? word_scalar : fast;
  float* lg = logits.ptr<float>();
  const int64_t ls = logits.stride[0];
  const uint32_t* masks = reinterpret_cast<const uint32_t*>(bitmask.ptr<int32_t>());
#pragma omp parallel for schedule(static) if (R * V > (1 << 16))
  for (int64_t r = 0; r < R; ++r) {
    float* l = lg + (rows != nullptr ? rows[r] : r) * ls;
    const uint32_t* m = masks + r * W;
    for (int64_t w = 0; w < W; ++w) {
      if (m[w] == ~0u && !reference) continue;
      word(l + 32 * w, m[w], static_cast<int>(std::min<int64_t>(32, V - 32 * w)));
    }
  }
}

VLLMX_KERNEL(apply_token_bitmask, kCPU, apply_token_bitmask_kernel);

}  // namespace vllmx
