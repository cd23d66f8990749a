// write_kv_cache: scatters f32 key/value rows into vLLM's flash-layout paged caches
// [num_blocks, block_size, num_kv_heads, head_size] of f16, bf16 or f32. f32 -> f16/bf16 rounds
// to nearest even; the SIMD paths (F16C / AVX-512 vcvtps2ph with round-to-nearest, and an
// integer rounding for bf16) give bit-identical results to the scalar converters in half.h.
#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif
// GCC 12 false positive on the _mm512_undefined_* inside the intrinsic headers (PR 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "core/cpu_features.h"
#include "core/half.h"
#include "core/op_table.h"

namespace vllmx {

namespace {

constexpr const char* kOp = "write_kv_cache";

void convert_row_scalar(void* dst, const float* src, int64_t n, DType dt) {
  switch (dt) {
    case DType::F16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      break;
    }
    case DType::BF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      break;
    }
    default:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}

#if VLLMX_X86
VLLMX_TARGET_AVX2 void convert_row_avx2(void* dst, const float* src, int64_t n, DType dt) {
  if (dt == DType::F16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
    }
    for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
  } else if (dt == DType::BF16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i qnan = _mm256_set1_epi32(64 << 16);
    for (; i + 8 <= n; i += 8) {
      const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
      const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
      r = _mm256_blendv_epi8(r, _mm256_or_si256(u, qnan), isnan);
      r = _mm256_srli_epi32(r, 16);
      // pack 8 x u32 (< 65536) -> 8 x u16
      const __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm_packus_epi32(lo, hi));
    }
    for (; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}

VLLMX_TARGET_AVX512 void convert_row_avx512(void* dst, const float* src, int64_t n, DType dt) {
  if (dt == DType::F16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; i += 16) {
      const int64_t left = n - i;
      const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xffff)
                                     : static_cast<__mmask16>((1u << left) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
      const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_mask_storeu_epi16(d + i, m, h);
    }
  } else if (dt == DType::BF16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i qnan = _mm512_set1_epi32(64 << 16);
    for (int64_t i = 0; i < n; i += 16) {
      const int64_t left = n - i;
      const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xffff)
                                     : static_cast<__mmask16>((1u << left) - 1);
      const __m512i u = _mm512_maskz_loadu_epi32(m, src + i);
      __m512i r = _mm512_add_epi32(
          u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
      const __mmask16 isnan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absmask), inf);
      r = _mm512_mask_mov_epi32(r, isnan, _mm512_or_si512(u, qnan));
      _mm256_mask_storeu_epi16(d + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
}
#endif

using ConvertFn = void (*)(void*, const float*, int64_t, DType);

ConvertFn pick_convert(bool reference) {
  if (reference) return convert_row_scalar;
#if VLLMX_X86
  if (simd_level() >= 2) return convert_row_avx512;
  if (simd_level() >= 1) return convert_row_avx2;
#endif
  return convert_row_scalar;
}

}  // namespace

void write_kv_cache(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                    const Tensor& value_cache, const Tensor& slot_mapping, bool reference) {
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs.
  check_dtype(key, DType::F32, kOp, "key");
  const DType dt = key_cache.dtype;
  const int64_t num_blocks = key_cache.shape[0], block_size = key_cache.shape[1];
  const int64_t nkv = key_cache.shape[2], head_size = key_cache.shape[3];
  const int64_t row = nkv * head_size;
  const int64_t T = key.shape[0];
  if (T == 0) return;
  const int32_t* slots = slot_mapping.ptr<int32_t>();
  const int64_t num_slots = num_blocks * block_size;
  for (int64_t t = 0; t < T; ++t)
    if (slots[t] >= num_slots)
      fail(kOp, "slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slots[t]) +
                    " is out of range for a cache of " + std::to_string(num_slots) +
                    " slots " + key_cache.str());

  const ConvertFn convert = pick_convert(reference);
  const int64_t esize = dt == DType::F32 ? 4 : 2;
  const float* kp = key.ptr<float>();
  const float* vp = value.ptr<float>();
  char* kc = static_cast<char*>(key_cache.data);
  char* vc = static_cast<char*>(value_cache.data);
  const int64_t ks = key.stride[0], vs = value.stride[0];
  // Slot rows are contiguous: the layout puts [nkv, D] of one slot together.
#pragma omp parallel for if (T * row > 65536) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = slots[t];
    if (s < 0) continue;
    convert(kc + s * row * esize, kp + t * ks, row, dt);
    convert(vc + s * row * esize, vp + t * vs, row, dt);
  }
}

VLLMX_KERNEL(write_kv_cache, kCPU, write_kv_cache);

}  // namespace vllmx
