// vec_dot kernels: a weight row of blocks . an 8-bit activation row -> f32 (llama.cpp's scheme).
// Per block the integer dot product is exact; it is scaled by d_w * d_x and accumulated in f32
// (plus m_w * s_x for the *_1 types). Each kernel has a fixed summation order, so a dot product
// does not depend on which call or thread computes it (batch invariance of `linear`).
//
// Here: the scalar reference twins and the selectors. The SIMD paths (AVX2, AVX-512BW, AVX-512
// VNNI) are in arch/x86/quant_dot.cpp; the fastest one the CPU has is picked once
// (select_vec_dot), the scalar twin where the arch layer has none.
#include "core/half.h"
#include "quant/arch/arch.h"
#include "quant/quant.h"
#include "quant/quant_k.h"

namespace vllmx {

// ---------------------------------------------------------------- scalar reference twins

float vec_dot_q4_0_q8_0_ref(int64_t n, const void* vw, const void* vx) {
  const block_q4_0* w = static_cast<const block_q4_0*>(vw);
  const block_q8_0* x = static_cast<const block_q8_0*>(vx);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / QK4_0; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += ((w[i].qs[j] & 0x0F) - 8) * x[i].qs[j];
      sumi += ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
    }
    sumf += (f16_to_f32(w[i].d) * f16_to_f32(x[i].d)) * static_cast<float>(sumi);
  }
  return sumf;
}

float vec_dot_q4_1_q8_1_ref(int64_t n, const void* vw, const void* vx) {
  const block_q4_1* w = static_cast<const block_q4_1*>(vw);
  const block_q8_1* x = static_cast<const block_q8_1*>(vx);
  float sumf = 0.0f, summs = 0.0f;
  for (int64_t i = 0; i < n / QK4_1; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      sumi += (w[i].qs[j] & 0x0F) * x[i].qs[j];
      sumi += (w[i].qs[j] >> 4) * x[i].qs[j + 16];
    }
    sumf += (f16_to_f32(w[i].d) * f16_to_f32(x[i].d)) * static_cast<float>(sumi);
    summs += f16_to_f32(w[i].m) * f16_to_f32(x[i].s);
  }
  return sumf + summs;
}

float vec_dot_q5_0_q8_0_ref(int64_t n, const void* vw, const void* vx) {
  const block_q5_0* w = static_cast<const block_q5_0*>(vw);
  const block_q8_0* x = static_cast<const block_q8_0*>(vx);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / QK5_0; ++i) {
    const uint32_t qh = load_u32(w[i].qh);
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = ((w[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
      const int q1 = ((w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
      sumi += q0 * x[i].qs[j] + q1 * x[i].qs[j + 16];
    }
    sumf += (f16_to_f32(w[i].d) * f16_to_f32(x[i].d)) * static_cast<float>(sumi);
  }
  return sumf;
}

float vec_dot_q5_1_q8_1_ref(int64_t n, const void* vw, const void* vx) {
  const block_q5_1* w = static_cast<const block_q5_1*>(vw);
  const block_q8_1* x = static_cast<const block_q8_1*>(vx);
  float sumf = 0.0f, summs = 0.0f;
  for (int64_t i = 0; i < n / QK5_1; ++i) {
    const uint32_t qh = load_u32(w[i].qh);
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = (w[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
      const int q1 = (w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      sumi += q0 * x[i].qs[j] + q1 * x[i].qs[j + 16];
    }
    sumf += (f16_to_f32(w[i].d) * f16_to_f32(x[i].d)) * static_cast<float>(sumi);
    summs += f16_to_f32(w[i].m) * f16_to_f32(x[i].s);
  }
  return sumf + summs;
}

float vec_dot_q8_0_q8_0_ref(int64_t n, const void* vw, const void* vx) {
  const block_q8_0* w = static_cast<const block_q8_0*>(vw);
  const block_q8_0* x = static_cast<const block_q8_0*>(vx);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    int sumi = 0;
    for (int j = 0; j < QK8_0; ++j) sumi += w[i].qs[j] * x[i].qs[j];
    sumf += (f16_to_f32(w[i].d) * f16_to_f32(x[i].d)) * static_cast<float>(sumi);
  }
  return sumf;
}

VecDotRowsFn select_vec_dot_rows(DType t) {
  if (const VecDotRowsFn fast = arch_dot(t).vec_dot_rows) return fast;
  return select_vec_dot_rows_k(t);
}

VecDotFn select_vec_dot(DType t) {
  if (const VecDotFn fast = arch_dot(t).vec_dot) return fast;
  switch (t) {
    case DType::Q4_0: return vec_dot_q4_0_q8_0_ref;
    case DType::Q4_1: return vec_dot_q4_1_q8_1_ref;
    case DType::Q5_0: return vec_dot_q5_0_q8_0_ref;
    case DType::Q5_1: return vec_dot_q5_1_q8_1_ref;
    case DType::Q8_0: return vec_dot_q8_0_q8_0_ref;
    default: return select_vec_dot_k(t);
  }
}

}  // namespace vllmx
