// TQ1_0, TQ2_0: dequantization (bit-exact with gguf.quants), the scalar vec_dot twins against
// Q8_K and the kernel-table entries; the SIMD kernels (AVX2, AVX-512, VNNI) are in
// arch/x86/quant_tq.cpp.
//
// A block's dot is one exact int32, isum = sum t * y - sum y (the codes t are unsigned, so the
// SIMD paths take maddubs / dpbusd directly and subtract Q8_K's bsums), turned into f32 by one
// shared expression (accumulate_q8_K); every path and every row grouping gives the same bits.
#include "core/kernel_pragmas.h"

#include "quant/quant_tq.h"

#include "core/half.h"
#include "quant/arch/arch.h"
#include "quant/quant_k.h"

namespace vllmx {

namespace {

// The 256 codes t (0..3) of a block, element order.
inline void decode(const block_tq1_0& b, uint8_t* t) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  auto trit = [](uint8_t byte, int n) {
    const uint8_t q = static_cast<uint8_t>(byte * kPow3[n]);  // mod 256
    return static_cast<uint8_t>((q * 3) >> 8);
  };
  for (int n = 0; n < 5; ++n)
    for (int j = 0; j < 32; ++j) t[32 * n + j] = trit(b.qs[j], n);
  for (int n = 0; n < 5; ++n)
    for (int j = 0; j < 16; ++j) t[160 + 16 * n + j] = trit(b.qs[32 + j], n);
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) t[240 + 4 * n + j] = trit(b.qh[j], n);
}

inline void decode(const block_tq2_0& b, uint8_t* t) {
  for (int c = 0; c < 2; ++c)
    for (int l = 0; l < 4; ++l)
      for (int j = 0; j < 32; ++j) t[128 * c + 32 * l + j] = (b.qs[32 * c + j] >> (2 * l)) & 3;
}

template <class W>
void dequantize_row_tq(const void* src, float* y, int64_t n) {
  const W* b = static_cast<const W*>(src);
  uint8_t t[QK_K];
  for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
    const float d = f16_to_f32(b[i].d);
    decode(b[i], t);
    for (int e = 0; e < QK_K; ++e) y[e] = d * static_cast<float>(t[e] - 1);
  }
}

template <class W>
float vec_dot_tq_ref(int64_t n, const void* vw, const void* vx) {
  const W* w = static_cast<const W*>(vw);
  const block_q8_K* x = static_cast<const block_q8_K*>(vx);
  float sumf = 0.0f;
  uint8_t t[QK_K];
  for (int64_t i = 0; i < n / QK_K; ++i) {
    decode(w[i], t);
    int isum = 0;
    for (int e = 0; e < QK_K; ++e) isum += (t[e] - 1) * x[i].qs[e];
    sumf = accumulate_q8_K(sumf, f16_to_f32(w[i].d), x[i].d, isum);
  }
  return sumf;
}

void set_entry(QuantTraits* table, DType t, ToFloatFn to_float, VecDotFn ref) {
  QuantTraits& q = table[static_cast<int>(t)];
  const ArchDot fast = arch_dot_tq(t);
  q.to_float = to_float;
  q.vec_dot = fast.vec_dot ? fast.vec_dot : ref;
  q.vec_dot_ref = ref;
  q.vec_dot_rows = fast.vec_dot_rows;
  q.vec_dot_type = DType::Q8_K;
}

}  // namespace

void dequantize_row_tq1_0(const void* src, float* dst, int64_t n) {
  dequantize_row_tq<block_tq1_0>(src, dst, n);
}
void dequantize_row_tq2_0(const void* src, float* dst, int64_t n) {
  dequantize_row_tq<block_tq2_0>(src, dst, n);
}
float vec_dot_tq1_0_q8_K_ref(int64_t n, const void* w, const void* x) {
  return vec_dot_tq_ref<block_tq1_0>(n, w, x);
}
float vec_dot_tq2_0_q8_K_ref(int64_t n, const void* w, const void* x) {
  return vec_dot_tq_ref<block_tq2_0>(n, w, x);
}

void register_quant_tq(QuantTraits* table) {
  set_entry(table, DType::TQ1_0, dequantize_row_tq1_0, vec_dot_tq1_0_q8_K_ref);
  set_entry(table, DType::TQ2_0, dequantize_row_tq2_0, vec_dot_tq2_0_q8_K_ref);
}

}  // namespace vllmx
