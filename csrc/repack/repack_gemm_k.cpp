// Kernels over packed k-quant weights (layout and arithmetic in repack.h): one panel of 16
// output rows against 1..kPackedRows activation rows. Here the scalar twin and the selector; the
// AVX-512 VNNI kernel is in arch/x86/repack_gemm_k.cpp, the AVX2 one in repack_gemm_k_avx2.cpp.
// Per row and super-block all form the k-quant vec_dot's exact integers isum / imin and combine
// them with the vec_dot's own f32 expression, so a row's result equals the vec_dot's bit for bit
// (quant_k_dot.cpp), whatever the number of rows in the call.
//
// No floating-point contraction here: the combine must round exactly where the vec_dot does.
#include "core/kernel_pragmas.h"

#include <cstring>

#include "core/half.h"
#include "repack/arch/arch.h"
#include "repack/repack_gemm.h"

namespace vllmx {

namespace {

// ---------------------------------------------------------------- scalar twin

// Byte 4r + i of chunk c of a panel super-block.
inline uint8_t at(const uint8_t* o, int64_t c, int r, int i) { return o[64 * c + 4 * r + i]; }

// Row r's unsigned quant of element e (0..255) of the super-block at o.
template <int KIND>
int32_t packed_u_k(const uint8_t* o, int r, int e) {
  using P = PackK<KIND>;
  if constexpr (P::q6) {
    const int c = e / 128, s = (e % 128) / 32, k = (e % 32) / 4, i = e % 4;
    const uint8_t lo = at(o, 16 * c + 8 * (s & 1) + k, r, i) >> (4 * (s >> 1));
    const uint8_t hi = at(o + P::qh_off, 8 * c + k, r, i) >> (2 * s);
    return (lo & 0xF) | ((hi & 3) << 4);
  } else {
    const int j = e / 64, h = (e % 64) / 32, k = (e % 32) / 4, i = e % 4;
    int32_t u = (at(o, 8 * j + k, r, i) >> (4 * h)) & 0xF;
    if constexpr (KIND == kQ5K) u |= ((at(o + P::qh_off, k, r, i) >> (2 * j + h)) & 1) << 4;
    return u;
  }
}

template <int KIND>
void gemm_k_ref(const uint8_t* panel, int64_t nb, const uint8_t* x, int64_t xs, int nrows,
                float* out, int64_t os, const float* bias) {
  using P = PackK<KIND>;
  for (int t = 0; t < nrows; ++t) {
    const XRowK xr(x + t * xs, nb);
    for (int r = 0; r < kPackRows; ++r) {
      float sumf = 0.0f;
      for (int64_t s = 0; s < nb; ++s) {
        const uint8_t* o = panel + s * P::block_bytes;
        const int8_t* y = xr.qs + QK_K * s;
        const int gsize = P::q6 ? 16 : 32;
        uint8_t sc_bytes[12];  // Q4_K / Q5_K: the row's 12 scale bytes
        for (int k = 0; k < (P::q6 ? 0 : 12); ++k) sc_bytes[k] = at(o + P::sc_off, k / 4, r, k % 4);
        int32_t isum = 0, imin = 0;
        for (int g = 0; g < QK_K / gsize; ++g) {
          int32_t dot = 0, ysum = 0;
          for (int e = gsize * g; e < gsize * (g + 1); ++e) {
            dot += packed_u_k<KIND>(o, r, e) * y[e];
            ysum += y[e];
          }
          if constexpr (P::q6) {
            const int32_t sc = static_cast<int8_t>(at(o + P::sc_off, g / 4, r, g % 4));
            isum += sc * (dot - 32 * ysum);
          } else {
            uint8_t sc, m;
            get_scale_min_k4(g, sc_bytes, &sc, &m);
            isum += sc * dot;
            imin += m * ysum;
          }
        }
        uint16_t dh, mh;
        std::memcpy(&dh, o + P::d_off + 2 * r, 2);
        sumf += (f16_to_f32(dh) * xr.d[s]) * static_cast<float>(isum);
        if constexpr (P::has_min) {
          std::memcpy(&mh, o + P::dmin_off + 2 * r, 2);
          sumf -= (f16_to_f32(mh) * xr.d[s]) * static_cast<float>(imin);
        }
      }
      out[t * os + r] = bias ? sumf + bias[r] : sumf;
    }
  }
}

}  // namespace

PackedGemmFn packed_gemm_k(DType base, bool reference) {
  if (!reference)
    if (const PackedGemmFn fast = arch_packed_gemm_k(base)) return fast;
  switch (base) {
    case DType::Q4_K: return gemm_k_ref<kQ4K>;
    case DType::Q5_K: return gemm_k_ref<kQ5K>;
    case DType::Q6_K: return gemm_k_ref<kQ6K>;
    default: return nullptr;
  }
}

}  // namespace vllmx
