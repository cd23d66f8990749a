// The AVX2 kernel over packed k-quant weights (layout and arithmetic in repack/repack.h), for
// CPUs without AVX-512 VNNI: the panel runs half by half, rows 8h .. 8h + 7 in the 8 32-bit lanes
// (the 32-byte halves of each 64-byte chunk), against up to 4 activation rows per call. Per row
// and super-block it forms the k-quant vec_dot's exact integers isum / imin and combines them
// with the vec_dot's own f32 expression, as the scalar twin (repack_gemm_k.cpp) does, so a row's
// result equals the vec_dot's bit for bit, whatever the number of rows in the call.
//
// The integer dot is maddubs (u8 weight x s8 activation -> s16 pair sums, saturating at 32767),
// then madd against the group's scale held as an s16 pair in each row's lane, which yields
// scale * dot in s32 without a 32-bit multiply (llama.cpp's AVX2 k-quant trick). Pair sums stay
// exact while summed in s16: |x| <= 128, so 8 maddubs of 4-bit weights (<= 30720), 4 of 5-bit
// (<= 31744) or 2 of 6-bit (<= 32256) before each madd.
//
// No floating-point contraction here: the combine must round exactly where the vec_dot does.
#include "core/kernel_pragmas.h"

#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include <cstring>

#include "repack/arch/x86/repack_avx2.h"
#include "repack/repack_gemm.h"

namespace vllmx {

namespace {

VLLMX_TARGET_AVX2 inline __m256i ld(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

VLLMX_TARGET_AVX2 inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

VLLMX_TARGET_AVX2 inline __m256 load_f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Byte B of every 32-bit lane, zero-extended into both of the lane's s16 halves.
template <int B>
VLLMX_TARGET_AVX2 inline __m256i byte_pair_u(__m256i v) {
  constexpr char z = -128;  // shuffle_epi8 zeroes a byte whose index has bit 7 set
  return _mm256_shuffle_epi8(v, _mm256_setr_epi8(B, z, B, z, 4 + B, z, 4 + B, z, 8 + B, z, 8 + B,
                                                 z, 12 + B, z, 12 + B, z, B, z, B, z, 4 + B, z,
                                                 4 + B, z, 8 + B, z, 8 + B, z, 12 + B, z, 12 + B,
                                                 z));
}

// Bytes B0 and B1 of every 32-bit lane, sign-extended into the lane's low and high s16.
template <int B0, int B1>
VLLMX_TARGET_AVX2 inline __m256i byte_pairs_s(__m256i v) {
  constexpr char z = -128;
  const __m256i hi = _mm256_shuffle_epi8(
      v, _mm256_setr_epi8(z, B0, z, B1, z, 4 + B0, z, 4 + B1, z, 8 + B0, z, 8 + B1, z, 12 + B0, z,
                          12 + B1, z, B0, z, B1, z, 4 + B0, z, 4 + B1, z, 8 + B0, z, 8 + B1, z,
                          12 + B0, z, 12 + B1));
  return _mm256_srai_epi16(hi, 8);
}

template <bool kSigned>
VLLMX_TARGET_AVX2 inline __m256i byte_pair(__m256i v, int b) {
  switch (b) {
    case 0: return kSigned ? byte_pairs_s<0, 0>(v) : byte_pair_u<0>(v);
    case 1: return kSigned ? byte_pairs_s<1, 1>(v) : byte_pair_u<1>(v);
    case 2: return kSigned ? byte_pairs_s<2, 2>(v) : byte_pair_u<2>(v);
    default: return kSigned ? byte_pairs_s<3, 3>(v) : byte_pair_u<3>(v);
  }
}

// isum[t] += sc * sum_k w_k . x_t[xo + 4k .. +3] over NK weight vectors made by unpack(k),
// folding the s16 pair sums into s32 by madd with sc16 every kFlush maddubs.
template <int R, int NK, int kFlush, class Unpack>
VLLMX_TARGET_AVX2 inline void group_dot(__m256i* isum, __m256i sc16, const int8_t* const* xq,
                                        int64_t xo, const Unpack& unpack) {
  __m256i s16[R];
  for (int t = 0; t < R; ++t) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int k = 0; k < NK; ++k) {
    const __m256i w = unpack(k);
    for (int t = 0; t < R; ++t)
      s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(w, bcast4(xq[t] + xo + 4 * k)));
    if ((k + 1) % kFlush == 0)
      for (int t = 0; t < R; ++t) {
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], sc16));
        s16[t] = _mm256_setzero_si256();
      }
  }
}

// Super-block s of rows 8h .. 8h + 7 against R activation rows: acc[t] as the vec_dot adds it.
template <int KIND, int R>
VLLMX_TARGET_AVX2 __attribute__((always_inline)) inline void superblock(
    const uint8_t* panel, int64_t s, int h, const int8_t* const* xq, const float* const* xd,
    const int32_t* const* xt, __m256* acc) {
  using P = PackK<KIND>;
  const __m256i lo4 = _mm256_set1_epi8(0x0F);
  {
    const uint8_t* o = panel + s * P::block_bytes;
    const uint8_t* oh = o + 32 * h;  // this half's 32 bytes of every chunk
    const int8_t* xs_q[R];
    const int32_t* xs_t[R];
    for (int t = 0; t < R; ++t) {
      xs_q[t] = xq[t] + QK_K * s;
      xs_t[t] = xt[t] + 16 * s;
    }
    __m256i isum[R];
    for (int t = 0; t < R; ++t) isum[t] = _mm256_setzero_si256();
    if constexpr (P::q6) {
      const __m256i m30 = _mm256_set1_epi8(0x30);
      // Unrolled, so that the shifts and the scale bytes below are compile-time constants.
#pragma GCC unroll 2
      for (int c = 0; c < 2; ++c)
#pragma GCC unroll 4
        for (int sh = 0; sh < 4; ++sh)  // elements 128c + 32 sh + 0..31: groups 8c + 2sh (+1)
#pragma GCC unroll 2
          for (int half = 0; half < 2; ++half) {
            const int g = 8 * c + 2 * sh + half;
            const __m256i sv = ld(oh + P::sc_off + 64 * (g / 4));
            const __m256i sc16 = byte_pair<true>(sv, g % 4);
            auto unpack = [&](int k) VLLMX_TARGET_AVX2 {
              const int kk = 4 * half + k;
              const __m256i v = ld(oh + 64 * (16 * c + 8 * (sh & 1) + kk));
              const __m256i nib = sh >> 1 ? _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4)
                                          : _mm256_and_si256(v, lo4);
              const __m256i hq = ld(oh + P::qh_off + 64 * (8 * c + kk));
              const __m256i hb = sh == 0   ? _mm256_slli_epi16(hq, 4)
                                 : sh == 1 ? _mm256_slli_epi16(hq, 2)
                                 : sh == 2 ? hq
                                           : _mm256_srli_epi16(hq, 2);
              return _mm256_or_si256(nib, _mm256_and_si256(hb, m30));
            };
            group_dot<R, 4, 2>(isum, sc16, xs_q, 128 * c + 32 * sh + 16 * half, unpack);
          }
      // The offset -32 of the 6-bit weights, sum_g sc_g * 32 * ysum_g (ysum_g the sum of group
      // g's activations, the prepared term / 32): the scales as s16 pairs (2q, 2q + 1) against
      // the sums paired alike, by madd, then times 32.
      __m256i scp[8];
      for (int w = 0; w < 4; ++w) {
        const __m256i sv = ld(oh + P::sc_off + 64 * w);
        scp[2 * w] = byte_pairs_s<0, 1>(sv);
        scp[2 * w + 1] = byte_pairs_s<2, 3>(sv);
      }
      for (int t = 0; t < R; ++t) {
        const __m256i* tp = reinterpret_cast<const __m256i*>(xs_t[t]);
        // packs_epi32 leaves the pairs of groups (0, 1) (2, 3) (8, 9) (10, 11) (4, 5) (6, 7)
        // (12, 13) (14, 15) in its 8 lanes: kLane[q] is where pair q went.
        const __m256i y = _mm256_packs_epi32(_mm256_srai_epi32(_mm256_loadu_si256(tp), 5),
                                             _mm256_srai_epi32(_mm256_loadu_si256(tp + 1), 5));
        alignas(32) int32_t yp[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(yp), y);
        constexpr int kLane[8] = {0, 1, 4, 5, 2, 3, 6, 7};
        __m256i off = _mm256_setzero_si256();
        for (int q = 0; q < 8; ++q)
          off = _mm256_add_epi32(off, _mm256_madd_epi16(scp[q], _mm256_set1_epi32(yp[kLane[q]])));
        isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(off, 5));
      }
      const __m256 dw = load_f16x8(o + P::d_off + 16 * h);
      for (int t = 0; t < R; ++t) {
        const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(xd[t][s]));
        acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum[t])));
      }
    } else {
      // The 6-bit scales and mins of the 8 rows, with llama.cpp's u32 word arithmetic.
      const __m256i a0 = ld(oh + P::sc_off), a1 = ld(oh + P::sc_off + 64),
                    a2 = ld(oh + P::sc_off + 128);
      const __m256i low6 = _mm256_set1_epi8(0x3F), low2 = _mm256_set1_epi8(0x03);
      const __m256i sc_lo = _mm256_and_si256(a0, low6);
      const __m256i sc_hi = _mm256_or_si256(
          _mm256_and_si256(a2, lo4),
          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a0, 6), low2), 4));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j)
#pragma GCC unroll 2
        for (int hh = 0; hh < 2; ++hh) {  // elements 64j + 32hh + 0..31: scale group 2j + hh
          const int g = 2 * j + hh;
          const __m256i sc16 = byte_pair<false>(g < 4 ? sc_lo : sc_hi, g % 4);
          auto unpack = [&](int k) VLLMX_TARGET_AVX2 {
            const __m256i v = ld(oh + 64 * (8 * j + k));
            __m256i w = hh ? _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4)
                           : _mm256_and_si256(v, lo4);
            if constexpr (KIND == kQ5K) {
              const __m256i qh = ld(oh + P::qh_off + 64 * k);
              const int bit = 2 * j + hh;  // bit `bit` of the byte -> bit 4
              const __m256i hb = bit <= 4 ? _mm256_slli_epi16(qh, 4 - bit)
                                          : _mm256_srli_epi16(qh, bit - 4);
              w = _mm256_or_si256(w, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
            }
            return w;
          };
          group_dot<R, 8, KIND == kQ5K ? 4 : 8>(isum, sc16, xs_q, 64 * j + 32 * hh, unpack);
        }
      // imin: the mins as int16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) against the
      // prepared pairs of 32-element activation sums (repack.h), by madd.
      const __m256i mn_lo = _mm256_and_si256(a1, low6);
      const __m256i mn_hi = _mm256_or_si256(
          _mm256_and_si256(_mm256_srli_epi32(a2, 4), lo4),
          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a1, 6), low2), 4));
      const __m256i even = _mm256_set1_epi32(0x00FF00FF);
      const __m256i mp[4] = {_mm256_and_si256(mn_lo, even), _mm256_srli_epi16(mn_lo, 8),
                             _mm256_and_si256(mn_hi, even), _mm256_srli_epi16(mn_hi, 8)};
      const __m256 dw = load_f16x8(o + P::d_off + 16 * h);
      const __m256 mw = load_f16x8(o + P::dmin_off + 16 * h);
      for (int t = 0; t < R; ++t) {
        __m256i imin = _mm256_setzero_si256();
        for (int p = 0; p < 4; ++p)
          imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mp[p], _mm256_set1_epi32(xs_t[t][p])));
        const __m256 dx = _mm256_set1_ps(xd[t][s]);
        acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(dw, dx),
                                                     _mm256_cvtepi32_ps(isum[t])));
        acc[t] = _mm256_sub_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(mw, dx),
                                                     _mm256_cvtepi32_ps(imin)));
      }
    }
  }
}

template <int KIND, int R>
VLLMX_TARGET_AVX2 void gemm_k_avx2(const uint8_t* panel, int64_t nb, const uint8_t* x,
                                   int64_t xs, float* out, int64_t os, const float* bias) {
  const int8_t* xq[R];
  const float* xd[R];
  const int32_t* xt[R];
  for (int t = 0; t < R; ++t) {
    const XRowK xr(x + t * xs, nb);
    xq[t] = xr.qs;
    xd[t] = xr.d;
    xt[t] = xr.term;
  }
  __m256 acc[2][R];
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < R; ++t) acc[h][t] = _mm256_setzero_ps();
  if constexpr (R <= 2) {
    // Decode streams the weights once: both halves of a super-block while its lines arrive,
    // with the next super-block fetched ahead, so that memory never waits on a second pass.
    for (int64_t s = 0; s < nb; ++s) {
      prefetch_lines(panel + (s + 1) * PackK<KIND>::block_bytes, PackK<KIND>::block_bytes);
      for (int h = 0; h < 2; ++h) superblock<KIND, R>(panel, s, h, xq, xd, xt, acc[h]);
    }
  } else {
    // More rows need the registers for their sums: the panel half by half, the first pass
    // fetching the next super-block ahead as decode does, the second reading it from L1.
    for (int h = 0; h < 2; ++h)
      for (int64_t s = 0; s < nb; ++s) {
        if (h == 0)
          prefetch_lines(panel + (s + 1) * PackK<KIND>::block_bytes, PackK<KIND>::block_bytes);
        superblock<KIND, R>(panel, s, h, xq, xd, xt, acc[h]);
      }
  }
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < R; ++t) {
      __m256 v = acc[h][t];
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + 8 * h));
      _mm256_storeu_ps(out + t * os + 8 * h, v);
    }
}

// Up to 4 activation rows per pass keeps the s16 / s32 sums in the 16 registers; 8 rows are two
// passes over a panel that by then sits in L1.
template <int KIND>
void gemm_k_avx2_any(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t xs, int nrows,
                     float* out, int64_t os, const float* bias) {
  for (int t = 0; t < nrows; t += 4) {
    const uint8_t* xt = x + t * xs;
    float* ot = out + t * os;
    switch (nrows - t) {
      case 1: gemm_k_avx2<KIND, 1>(panel, nb, xt, xs, ot, os, bias); break;
      case 2: gemm_k_avx2<KIND, 2>(panel, nb, xt, xs, ot, os, bias); break;
      case 3: gemm_k_avx2<KIND, 3>(panel, nb, xt, xs, ot, os, bias); break;
      default: gemm_k_avx2<KIND, 4>(panel, nb, xt, xs, ot, os, bias); break;
    }
  }
}

}  // namespace

PackedGemmFn avx2_packed_gemm_k(DType base) {
  switch (base) {
    case DType::Q4_K: return gemm_k_avx2_any<kQ4K>;
    case DType::Q5_K: return gemm_k_avx2_any<kQ5K>;
    case DType::Q6_K: return gemm_k_avx2_any<kQ6K>;
    default: return nullptr;
  }
}

}  // namespace vllmx
#endif  // VLLMX_X86
