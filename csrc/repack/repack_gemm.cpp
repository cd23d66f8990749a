// Kernels over packed weights (layout and arithmetic in repack.h): one panel of 16 output rows
// against 1..kPackedRows activation rows. Here the scalar twin, which spells out the arithmetic
// element by element, and the selector; the AVX-512 VNNI kernel (arch/x86/repack_gemm.cpp) does
// the same operations with the 16 rows in the 16 lanes, the AVX2 one (repack_gemm_avx2.cpp) 8
// rows at a time, so all agree bit for bit, and the result for a row never depends on how many
// activation rows share the call.
//
// No floating-point contraction here: the scalar twin must round exactly where the SIMD one does.
#include "core/kernel_pragmas.h"

#include <cmath>

#include "core/half.h"
#include "repack/arch/arch.h"
#include "repack/repack_gemm.h"

namespace vllmx {

namespace {

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

}  // namespace

PackedGemmFn packed_gemm(DType base, bool reference) {
  if (!reference)
    if (const PackedGemmFn fast = arch_packed_gemm(base)) return fast;
  switch (base) {
    case DType::Q4_0: return gemm_ref<kP4_0>;
    case DType::Q4_1: return gemm_ref<kP4_1>;
    case DType::Q5_0: return gemm_ref<kP5_0>;
    case DType::Q5_1: return gemm_ref<kP5_1>;
    case DType::Q8_0: return gemm_ref<kP8_0>;
    default: return packed_gemm_k(base, reference);
  }
}

}  // namespace vllmx
