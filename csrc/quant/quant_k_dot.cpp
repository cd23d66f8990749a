// k-quant vec_dot kernels: a weight row of Q2_K..Q6_K super-blocks . a Q8_K activation row.
//
// Per super-block the whole integer part is exact in int32:
//   isum = sum_g scale[g] * sum_{l in g} q[l] * y[l]     (q with its offset, if any)
//   imin = sum_g min[g] * bsums[g]                       (Q2_K, Q4_K, Q5_K)
// and is turned into f32 by one shared expression (combine_k, quant_k.h), in super-block order.
// So every path (scalar twin, AVX2, AVX-512, VNNI) and every row grouping gives bit-identical
// results, which keeps `linear` batch invariant.
//
// Here: the scalar twins and the selectors, which take the arch layer's kernels where it has
// them (the x86 ones, with their unpacking scheme, are in arch/x86/quant_k_dot.cpp).
#include "core/kernel_pragmas.h"

#include "quant/arch/arch.h"
#include "quant/quant_k.h"

namespace vllmx {

namespace {

// ---------------------------------------------------------------- scalar reference twins
// Each decodes a super-block into its 256 integer quants (element order, offsets applied) and
// one scale and one min per 16-element group, then takes the plain integer dot.

struct DecodedK {
  int8_t q[QK_K];
  int scale[16];
  int min[16];
};

inline void decode(const block_q2_K& b, DecodedK& o) {
  for (int g = 0; g < 16; ++g) {
    o.scale[g] = b.scales[g] & 0xF;
    o.min[g] = b.scales[g] >> 4;
  }
  for (int e = 0; e < QK_K; ++e) {  // e = 128 c + 32 s + l: bits 2s of qs[32 c + l]
    const int c = e / 128, s = (e % 128) / 32, l = e % 32;
    o.q[e] = static_cast<int8_t>((b.qs[32 * c + l] >> (2 * s)) & 3);
  }
}

inline void decode(const block_q3_K& b, DecodedK& o) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4;
    const int hi = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    o.scale[j] = (lo | (hi << 4)) - 32;
    o.min[j] = 0;
  }
  for (int e = 0; e < QK_K; ++e) {  // high bit 4 c + s of hmask[l]; 0 means -4
    const int c = e / 128, s = (e % 128) / 32, l = e % 32;
    const int low = (b.qs[32 * c + l] >> (2 * s)) & 3;
    o.q[e] = static_cast<int8_t>(low - (((b.hmask[l] >> (4 * c + s)) & 1) ? 0 : 4));
  }
}

template <class B>
inline void decode_scales_k4(const B& b, DecodedK& o) {
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, b.scales, &sc, &m);
    o.scale[2 * j] = o.scale[2 * j + 1] = sc;
    o.min[2 * j] = o.min[2 * j + 1] = m;
  }
}

inline void decode(const block_q4_K& b, DecodedK& o) {
  decode_scales_k4(b, o);
  for (int e = 0; e < QK_K; ++e) {  // e = 64 j + 32 h + l: nibble h of qs[32 j + l]
    const int j = e / 64, h = (e % 64) / 32, l = e % 32;
    o.q[e] = static_cast<int8_t>((b.qs[32 * j + l] >> (4 * h)) & 0xF);
  }
}

inline void decode(const block_q5_K& b, DecodedK& o) {
  decode_scales_k4(b, o);
  for (int e = 0; e < QK_K; ++e) {  // fifth bit: bit 2 j + h of qh[l]
    const int j = e / 64, h = (e % 64) / 32, l = e % 32;
    const int hi = (b.qh[l] >> (2 * j + h)) & 1;
    o.q[e] = static_cast<int8_t>(((b.qs[32 * j + l] >> (4 * h)) & 0xF) | (hi << 4));
  }
}

inline void decode(const block_q6_K& b, DecodedK& o) {
  for (int g = 0; g < 16; ++g) {
    o.scale[g] = b.scales[g];
    o.min[g] = 0;
  }
  for (int e = 0; e < QK_K; ++e) {  // e = 128 c + 32 s + l
    const int c = e / 128, s = (e % 128) / 32, l = e % 32;
    const uint8_t low = b.ql[64 * c + 32 * (s & 1) + l] >> (4 * (s >> 1));
    const int hi = (b.qh[32 * c + l] >> (2 * s)) & 3;
    o.q[e] = static_cast<int8_t>(((low & 0xF) | (hi << 4)) - 32);
  }
}

template <class W, bool kHasMin>
float vec_dot_k_ref(int64_t n, const void* vw, const void* vx) {
  const W* w = static_cast<const W*>(vw);
  const block_q8_K* x = static_cast<const block_q8_K*>(vx);
  float sumf = 0.0f;
  DecodedK dec;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    decode(w[i], dec);
    int isum = 0, imin = 0;
    for (int g = 0; g < 16; ++g) {
      int dot = 0, ysum = 0;
      for (int l = 16 * g; l < 16 * g + 16; ++l) {
        dot += dec.q[l] * x[i].qs[l];
        ysum += x[i].qs[l];
      }
      isum += dec.scale[g] * dot;
      imin += dec.min[g] * ysum;
    }
    sumf = combine_k<kHasMin>(sumf, w[i], x[i].d, isum, imin);
  }
  return sumf;
}

}  // namespace

float vec_dot_q2_K_q8_K_ref(int64_t n, const void* w, const void* x) {
  return vec_dot_k_ref<block_q2_K, true>(n, w, x);
}
float vec_dot_q3_K_q8_K_ref(int64_t n, const void* w, const void* x) {
  return vec_dot_k_ref<block_q3_K, false>(n, w, x);
}
float vec_dot_q4_K_q8_K_ref(int64_t n, const void* w, const void* x) {
  return vec_dot_k_ref<block_q4_K, true>(n, w, x);
}
float vec_dot_q5_K_q8_K_ref(int64_t n, const void* w, const void* x) {
  return vec_dot_k_ref<block_q5_K, true>(n, w, x);
}
float vec_dot_q6_K_q8_K_ref(int64_t n, const void* w, const void* x) {
  return vec_dot_k_ref<block_q6_K, false>(n, w, x);
}

VecDotFn select_vec_dot_k(DType t) {
  if (const VecDotFn fast = arch_dot_k(t).vec_dot) return fast;
  switch (t) {
    case DType::Q2_K: return vec_dot_q2_K_q8_K_ref;
    case DType::Q3_K: return vec_dot_q3_K_q8_K_ref;
    case DType::Q4_K: return vec_dot_q4_K_q8_K_ref;
    case DType::Q5_K: return vec_dot_q5_K_q8_K_ref;
    case DType::Q6_K: return vec_dot_q6_K_q8_K_ref;
    default: return nullptr;
  }
}

VecDotRowsFn select_vec_dot_rows_k(DType t) { return arch_dot_k(t).vec_dot_rows; }

}  // namespace vllmx
