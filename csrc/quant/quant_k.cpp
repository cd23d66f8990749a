// k-quants: dequantization (bit-exact with gguf.quants, i.e. llama.cpp's dequantize_row_*_K)
// and Q8_K activation quantization (llama.cpp's quantize_row_q8_K_ref, bit for bit; the SIMD
// block quantizers are in arch/x86/quant_k.cpp).
//
// No floating-point contraction here: `dl * q - ml` must round twice, as numpy does.
#include "core/kernel_pragmas.h"

#include "quant/quant_k.h"

#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/arch/arch.h"

namespace vllmx {

namespace {
inline float f16(uint16_t h) { return f16_to_f32(h); }

// The 16 6-bit scales of a Q3_K block, biased by -32.
inline void q3_k_scales(const uint8_t* s, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}
}  // namespace

// ---- dequantization (scalar; each element's arithmetic exactly as llama.cpp's) ----

void dequantize_row_q2_K(const void* src, float* y, int64_t n) {
  const block_q2_K* b = static_cast<const block_q2_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16(b[i].d), dmin = f16(b[i].dmin);
    const uint8_t* q = b[i].qs;
    int is = 0;
    for (int c = 0; c < 2; ++c, q += 32)
      for (int shift = 0; shift < 8; shift += 2)
        for (int h = 0; h < 2; ++h) {
          const uint8_t sc = b[i].scales[is++];
          const float dl = d * static_cast<float>(sc & 0xF);
          const float ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l)
            *y++ = dl * static_cast<float>((q[l + 16 * h] >> shift) & 3) - ml;
        }
  }
}

void dequantize_row_q3_K(const void* src, float* y, int64_t n) {
  const block_q3_K* b = static_cast<const block_q3_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16(b[i].d);
    int8_t sc[16];
    q3_k_scales(b[i].scales, sc);
    const uint8_t* q = b[i].qs;
    const uint8_t* hm = b[i].hmask;
    int is = 0, bit = 0;
    for (int c = 0; c < 2; ++c, q += 32)
      for (int shift = 0; shift < 8; shift += 2, ++bit)
        for (int h = 0; h < 2; ++h) {
          const float dl = d * static_cast<float>(sc[is++]);
          for (int l = 16 * h; l < 16 * h + 16; ++l) {
            const int v = ((q[l] >> shift) & 3) - ((hm[l] >> bit) & 1 ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
  }
}

void dequantize_row_q4_K(const void* src, float* y, int64_t n) {
  const block_q4_K* b = static_cast<const block_q4_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16(b[i].d), dmin = f16(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < 8; j += 2, q += 32) {
      uint8_t sc, m;
      get_scale_min_k4(j, b[i].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      get_scale_min_k4(j + 1, b[i].scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
      y += 64;
    }
  }
}

void dequantize_row_q5_K(const void* src, float* y, int64_t n) {
  const block_q5_K* b = static_cast<const block_q5_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16(b[i].d), dmin = f16(b[i].dmin);
    const uint8_t* q = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int j = 0; j < 8; j += 2, q += 32) {
      uint8_t sc, m;
      get_scale_min_k4(j, b[i].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      get_scale_min_k4(j + 1, b[i].scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l)
        y[l] = d1 * static_cast<float>((q[l] & 0xF) | (((qh[l] >> j) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        y[l + 32] = d2 * static_cast<float>((q[l] >> 4) | (((qh[l] >> (j + 1)) & 1) << 4)) - m2;
      y += 64;
    }
  }
}

void dequantize_row_q6_K(const void* src, float* y, int64_t n) {
  const block_q6_K* b = static_cast<const block_q6_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = f16(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int c = 0; c < 2; ++c, ql += 64, qh += 32, sc += 8, y += 128)
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = (d * static_cast<float>(sc[is])) * static_cast<float>(q1);
        y[l + 32] = (d * static_cast<float>(sc[is + 2])) * static_cast<float>(q2);
        y[l + 64] = (d * static_cast<float>(sc[is + 4])) * static_cast<float>(q3);
        y[l + 96] = (d * static_cast<float>(sc[is + 6])) * static_cast<float>(q4);
      }
  }
}

void dequantize_row_q8_K(const void* src, float* y, int64_t n) {
  const block_q8_K* b = static_cast<const block_q8_K*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i)
    for (int j = 0; j < QK_K; ++j) *y++ = b[i].d * static_cast<float>(b[i].qs[j]);
}

// ---- Q8_K activation quantization ----

namespace {
// llama.cpp's nearest_int: round half to even, for |v| < 2^22.
inline int nearest_int(float v) {
  const float val = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &val, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// The value of largest magnitude (the first one, on ties), as the reference picks it.
inline float signed_max(const float* x, float* amax_out) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < QK_K; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  *amax_out = amax;
  return max;
}

inline void set_bsums(block_q8_K& y) {
  for (int g = 0; g < QK_K / 16; ++g) {
    int s = 0;
    for (int l = 0; l < 16; ++l) s += y.qs[16 * g + l];
    y.bsums[g] = static_cast<int16_t>(s);
  }
}

void quantize_block_q8_K_ref(const float* x, float iscale, block_q8_K& y) {
  for (int j = 0; j < QK_K; ++j) {
    const int v = nearest_int(iscale * x[j]);
    y.qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
  }
  set_bsums(y);
}

inline void quantize_row_q8_K_with(QuantBlockQ8KFn fn, SignedMaxFn max_of, const float* x,
                                   void* vy, int64_t n) {
  block_q8_K* y = static_cast<block_q8_K*>(vy);
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    float amax;
    const float max = max_of(x, &amax);
    if (amax == 0.0f) {  // (the reference leaves bsums as they were; zeros are what they mean)
      std::memset(&y[i], 0, sizeof(block_q8_K));
      continue;
    }
    const float iscale = -127.0f / max;
    fn(x, iscale, y[i]);
    y[i].d = 1.0f / iscale;
  }
}
}  // namespace

void quantize_row_q8_K_ref(const float* x, void* y, int64_t n) {
  quantize_row_q8_K_with(quantize_block_q8_K_ref, signed_max, x, y, n);
}

void quantize_row_q8_K(const float* x, void* y, int64_t n) {
  static const QuantBlockQ8KFn fast = arch_quantize_block_q8_K();
  static const SignedMaxFn fast_max = arch_signed_max_q8_K();
  quantize_row_q8_K_with(fast ? fast : quantize_block_q8_K_ref, fast_max ? fast_max : signed_max,
                         x, y, n);
}

}  // namespace vllmx
