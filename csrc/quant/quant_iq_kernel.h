// The scalar side of the i-quant vec_dot, shared by the families (quant_iq1/2/3.cpp) and their
// SIMD kernels (arch/x86/quant_iq.cpp); not a public header.
//
// A family describes each of its types by a trait T (quant_iq1.h, quant_iq2.h, quant_iq3.h):
//   Block, kFactor             the block struct; w = d * kFactor * scale[g] * q (quant_iq.h)
//   float d(const Block&)      the f32 super-block scale
//   void decode(b, Decoded&)   scalar: the 256 integer weights q and 16 scales (reference twin)
// which the x86 kernels extend with their SIMD unpacking of 32 weights (group).
// Per super-block every path computes the same exact int32, isum = sum_g scale[g] *
// sum_{e in g} q[e] * y[e], and turns it into f32 with the one shared expression (combine), in
// super-block order; so the scalar twin, AVX2 and AVX-512 agree bit for bit, and so do all row
// groupings of vec_dot_rows, which keeps `linear` batch invariant.
#pragma once
#include "quant/arch/arch.h"
#include "quant/quant_iq.h"

namespace vllmx::iq {

// A super-block as integers: weight e = d * kFactor * scale[e / 16] * q[e].
struct Decoded {
  int8_t q[QK_K];
  int scale[QK_K / 16];
};

// The f32 part, identical for every path.
inline float combine(float sumf, float dw, float dx, int isum) {
  return sumf + (dw * dx) * static_cast<float>(isum);
}

template <class T>
float vec_dot_ref(int64_t n, const void* vw, const void* vx) {
  const typename T::Block* w = static_cast<const typename T::Block*>(vw);
  const block_q8_K* x = static_cast<const block_q8_K*>(vx);
  float sumf = 0.0f;
  Decoded dec;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    T::decode(w[i], dec);
    int isum = 0;
    for (int g = 0; g < QK_K / 16; ++g) {
      int dot = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) dot += dec.q[e] * x[i].qs[e];
      isum += dec.scale[g] * dot;
    }
    sumf = combine(sumf, T::d(w[i]), x[i].d, isum);
  }
  return T::kFactor * sumf;
}

// The kernels of type T (dtype t): the arch layer's where it has them, else the scalar twin.
template <class T>
IqKernels kernels(DType t, ToFloatFn to_float) {
  const ArchDot fast = arch_dot_iq(t);
  IqKernels k;
  k.to_float = to_float;
  k.vec_dot_ref = vec_dot_ref<T>;
  k.vec_dot = fast.vec_dot ? fast.vec_dot : k.vec_dot_ref;
  k.vec_dot_rows = fast.vec_dot_rows;
  return k;
}

}  // namespace vllmx::iq
