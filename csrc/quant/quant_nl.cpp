// IQ4_NL, IQ4_XS, MXFP4: dequantization (bit-exact with gguf.quants), the scalar vec_dot twins
// and the kernel-table entries. The SIMD kernels are in arch/x86/quant_nl_dot.cpp.
//
// No floating-point contraction here: `dl * kv` and the lane sums must round as the SIMD paths
// (and numpy) do.
#include "core/kernel_pragmas.h"

#include "quant/quant_nl.h"

#include "quant/arch/arch.h"
#include "quant/quant_k.h"

namespace vllmx {

namespace {

// Code e (0..31) of a 32-value nibble array: low nibbles first, then high nibbles.
inline int nibble(const uint8_t* qs, int e) { return e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4; }

template <class W>
void dequantize_row_nl32(const void* src, float* y, int64_t n) {
  const W* b = static_cast<const W*>(src);
  for (int64_t i = 0; i < n / 32; ++i, y += 32) {
    const float d = nl_scale(b[i]);
    const int8_t* kv = nl_table(b);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kv[b[i].qs[j] & 0xF]);
      y[j + 16] = d * static_cast<float>(kv[b[i].qs[j] >> 4]);
    }
  }
}

template <class W>
float vec_dot_nl32_q8_0_ref(int64_t n, const void* vw, const void* vx) {
  const W* w = static_cast<const W*>(vw);
  const block_q8_0* x = static_cast<const block_q8_0*>(vx);
  float acc[16] = {};
  for (int64_t i = 0; i < n / 32; ++i) {
    const float d = nl_scale(w[i]) * f16_to_f32(x[i].d);
    const int8_t* kv = nl_table(w);
    float* lane = acc + 8 * (i % 2);
    for (int k = 0; k < 8; ++k) {
      int p = 0;
      for (int e = 4 * k; e < 4 * k + 4; ++e) p += kv[nibble(w[i].qs, e)] * x[i].qs[e];
      lane[k] += static_cast<float>(p) * d;
    }
  }
  return reduce_lanes16(acc);
}

}  // namespace

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
  dequantize_row_nl32<block_iq4_nl>(src, dst, n);
}
void dequantize_row_mxfp4(const void* src, float* dst, int64_t n) {
  dequantize_row_nl32<block_mxfp4>(src, dst, n);
}

void dequantize_row_iq4_xs(const void* src, float* y, int64_t n) {
  const block_iq4_xs* b = static_cast<const block_iq4_xs*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int ib = 0; ib < QK_K / 32; ++ib, y += 32) {
      const float dl = d * static_cast<float>(iq4_xs_scale(b[i], ib));
      const uint8_t* qs = b[i].qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kvalues_iq4nl[qs[j] & 0xF]);
        y[j + 16] = dl * static_cast<float>(kvalues_iq4nl[qs[j] >> 4]);
      }
    }
  }
}

float vec_dot_iq4_nl_q8_0_ref(int64_t n, const void* w, const void* x) {
  return vec_dot_nl32_q8_0_ref<block_iq4_nl>(n, w, x);
}
float vec_dot_mxfp4_q8_0_ref(int64_t n, const void* w, const void* x) {
  return vec_dot_nl32_q8_0_ref<block_mxfp4>(n, w, x);
}

// Per super-block: isum = sum over sub-blocks of (scale - 32) * (integer dot), exact in int32
// (|isum| <= 8 * 32 * 32 * 127 * 127).
float vec_dot_iq4_xs_q8_K_ref(int64_t n, const void* vw, const void* vx) {
  const block_iq4_xs* w = static_cast<const block_iq4_xs*>(vw);
  const block_q8_K* x = static_cast<const block_q8_K*>(vx);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int isum = 0;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      const uint8_t* qs = w[i].qs + 16 * ib;
      const int8_t* y = x[i].qs + 32 * ib;
      int dot = 0;
      for (int e = 0; e < 32; ++e) dot += kvalues_iq4nl[nibble(qs, e)] * y[e];
      isum += iq4_xs_scale(w[i], ib) * dot;
    }
    sumf = accumulate_q8_K(sumf, f16_to_f32(w[i].d), x[i].d, isum);
  }
  return sumf;
}

void register_quant_nl(QuantTraits* table) {
  auto set = [&](DType t, ToFloatFn to_float, VecDotFn ref, DType vec_dot_type) {
    QuantTraits& q = table[static_cast<int>(t)];
    const ArchDot fast = arch_dot_nl(t);
    q.to_float = to_float;
    q.vec_dot = fast.vec_dot ? fast.vec_dot : ref;
    q.vec_dot_ref = ref;
    q.vec_dot_rows = fast.vec_dot_rows;
    q.vec_dot_type = vec_dot_type;
  };
  set(DType::IQ4_NL, dequantize_row_iq4_nl, vec_dot_iq4_nl_q8_0_ref, DType::Q8_0);
  set(DType::IQ4_XS, dequantize_row_iq4_xs, vec_dot_iq4_xs_q8_K_ref, DType::Q8_K);
  set(DType::MXFP4, dequantize_row_mxfp4, vec_dot_mxfp4_q8_0_ref, DType::Q8_0);
}

}  // namespace vllmx
