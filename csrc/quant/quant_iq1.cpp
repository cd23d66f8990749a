// IQ1_S, IQ1_M: 8 weights per grid entry (values -1, 0, 1 in iq1s_grid) shifted by +-1/8, with
// a 3-bit scale s: w = d * (2 s + 1) * (grid +- 1/8) = d / 8 * (2 s + 1) * (8 grid +- 1).
//   IQ1_S: one scale and one shift sign per 32 weights (qh); d is an f16 field.
//   IQ1_M: a scale per 16 and a shift sign per 8 weights; d is spread over the top nibbles of
//          the four u16 scale words.
// Dequantization rounds each weight as gguf.quants does, dl * (grid + delta) in f32 (the sum is
// exact); the dot products use the integer form q = 8 grid +- 1 (quant_iq1.h, quant_iq_kernel.h;
// the SIMD ones are in arch/x86/quant_iq.cpp).
#include "core/kernel_pragmas.h"

#include "quant/quant_iq1.h"

namespace vllmx {

namespace iq1 {
namespace {

constexpr float kDelta = 0.125f;  // llama.cpp's IQ1S_DELTA / IQ1M_DELTA

// 8 weights of one grid entry; neg: the shift is -1/8.
inline void put8(float dl, uint64_t g, bool neg, float* y) {
  const float delta = neg ? -kDelta : kDelta;
  for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(grid_val(g, j)) + delta);
}

// ---- dequantization ----

void dequantize_row_iq1_s(const void* src, float* y, int64_t n) {
  const block_iq1_s* b = static_cast<const block_iq1_s*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float dl = d * static_cast<float>(Iq1s::scale(b[i], ib));
      for (int l = 0; l < 4; ++l, y += 8) put8(dl, Iq1s::grid(b[i], ib, l), Iq1s::neg(b[i], ib), y);
    }
  }
}

void dequantize_row_iq1_m(const void* src, float* y, int64_t n) {
  const block_iq1_m* b = static_cast<const block_iq1_m*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = Iq1m::d(b[i]);
    for (int k = 0; k < 32; ++k, y += 8) {
      const float dl = d * static_cast<float>(Iq1m::scale(b[i], k / 2));
      put8(dl, Iq1m::grid(b[i], k), Iq1m::neg(b[i], k), y);
    }
  }
}

}  // namespace
}  // namespace iq1

bool iq1_kernels(DType t, IqKernels* k) {
  switch (t) {
    case DType::IQ1_S: *k = iq::kernels<iq1::Iq1s>(t, iq1::dequantize_row_iq1_s); return true;
    case DType::IQ1_M: *k = iq::kernels<iq1::Iq1m>(t, iq1::dequantize_row_iq1_m); return true;
    default: return false;
  }
}

}  // namespace vllmx
