// Weight quantization to GGUF block types: llama.cpp's reference quantizers (quantize_row_*_ref,
// the path llama-quantize takes without an importance matrix), for `vllmx quantize`. Each row is
// quantized on its own, so rows run in parallel and the result is bit-identical to llama.cpp's.
//
// No floating-point contraction: the scale searches compare sums of products that llama.cpp's
// scalar build rounds after every multiply; a fused multiply-add would pick other scales.
#include "core/kernel_pragmas.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "core/half.h"
#include "core/op_table.h"
#include "quant/quant.h"
#include "quant/quant_k.h"

namespace vllmx {

namespace {

constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest (ties to even) through the float mantissa, for |x| < 2^22.
inline int nearest_int(float fval) {
  const float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

// Symmetric scale search for n values in [-nmax, nmax - 1] (rmse_type 1: weights x^2).
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; ++i) {
      const int l = nearest_int(iscale * x[i]);
      L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
    }
    return 1 / iscale;
  }
  auto weight = [&](int i) {
    return rmse_type == 1   ? x[i] * x[i]
           : rmse_type == 2 ? 1.0f
           : rmse_type == 3 ? std::fabs(x[i])
                            : std::sqrt(std::fabs(x[i]));
  };
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = weight(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Symmetric 3-bit search with per-value refinement (weights x^2); L in [0, 2 nmax).
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric search: x ~ scale * L - the_min with L in [0, nmax], minimizing the weighted
// squared (or absolute, use_mad) error over nstep + 1 trial scales.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Packs 6-bit scale / min of sub-block j (0..7) into a Q4_K/Q5_K `scales` field.
inline void set_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t* s) {
  if (j < 4) {
    s[j] = ls;
    s[j + 4] = lm;
  } else {
    s[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
    s[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
    s[j - 0] |= static_cast<uint8_t>((lm >> 4) << 6);
  }
}

// The value of largest magnitude (the first of equals), whose sign the symmetric 32-element
// types keep: d = max / -8 (Q4_0) or / -16 (Q5_0).
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// The range the affine 32-element types (Q4_1, Q5_1) spread their levels over.
void min_max(const float* x, int n, float* min, float* max) {
  *min = FLT_MAX;
  *max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

// ---- 32-element block types ----

void quantize_row_q4_0_ref(const float* x, void* vy, int64_t k) {
  block_q4_0* y = static_cast<block_q4_0*>(vy);
  for (int64_t i = 0; i < k / QK4_0; ++i, x += QK4_0) {
    const float d = signed_absmax(x, QK4_0) / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const uint8_t q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const uint8_t q1 =
          std::min(15, static_cast<int>(static_cast<int8_t>(x[j + QK4_0 / 2] * id + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_row_q4_1_ref(const float* x, void* vy, int64_t k) {
  block_q4_1* y = static_cast<block_q4_1*>(vy);
  for (int64_t i = 0; i < k / QK4_1; ++i, x += QK4_1) {
    float min, max;
    min_max(x, QK4_1, &min, &max);
    const float d = (max - min) / 15;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(min);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      const uint8_t q0 =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const uint8_t q1 = std::min(
          15, static_cast<int>(static_cast<int8_t>((x[j + QK4_1 / 2] - min) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_row_q5_0_ref(const float* x, void* vy, int64_t k) {
  block_q5_0* y = static_cast<block_q5_0*>(vy);
  for (int64_t i = 0; i < k / QK5_0; ++i, x += QK5_0) {
    const float d = signed_absmax(x, QK5_0) / -16;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const uint8_t q0 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
      const uint8_t q1 =
          std::min(31, static_cast<int>(static_cast<int8_t>(x[j + QK5_0 / 2] * id + 16.5f)));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= ((q0 & 0x10u) >> 4) << j;
      qh |= ((q1 & 0x10u) >> 4) << (j + QK5_0 / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

void quantize_row_q5_1_ref(const float* x, void* vy, int64_t k) {
  block_q5_1* y = static_cast<block_q5_1*>(vy);
  for (int64_t i = 0; i < k / QK5_1; ++i, x += QK5_1) {
    float min, max;
    min_max(x, QK5_1, &min, &max);
    const float d = (max - min) / 31;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(min);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const uint8_t q0 = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
      const uint8_t q1 = static_cast<uint8_t>((x[j + QK5_1 / 2] - min) * id + 0.5f);
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= ((q0 & 0x10u) >> 4) << j;
      qh |= ((q1 & 0x10u) >> 4) << (j + QK5_1 / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

// ---- k-quants: 256-element super-blocks ----

void quantize_row_q2_K_ref(const float* x, void* vy, int64_t k) {
  block_q2_K* y = static_cast<block_q2_K*>(vy);
  uint8_t L[QK_K], Laux[16];
  float weights[16], mins[QK_K / 16], scales[QK_K / 16];
  const float q4scale = 15.f;
  for (int64_t i = 0; i < k / QK_K; ++i, x += QK_K) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                   0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < QK_K / 16; ++j)
        y[i].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      y[i].d = f32_to_f16(max_scale / q4scale);
    } else {
      for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = 0;
      y[i].d = f32_to_f16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < QK_K / 16; ++j)
        y[i].scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      y[i].dmin = f32_to_f16(max_min / q4scale);
    } else {
      y[i].dmin = f32_to_f16(0.f);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = f16_to_f32(y[i].d) * (y[i].scales[j] & 0xF);
      if (!d) continue;
      const float dm = f16_to_f32(y[i].dmin) * (y[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    for (int j = 0; j < QK_K; j += 128)
      for (int l = 0; l < 32; ++l)
        y[i].qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                                  (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
  }
}

void quantize_row_q3_K_ref(const float* x, void* vy, int64_t k) {
  block_q3_K* y = static_cast<block_q3_K*>(vy);
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < k / QK_K; ++i, x += QK_K) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(y[i].scales, 0, 12);
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) {
        int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        l = static_cast<int8_t>(std::max(-32, std::min(31, static_cast<int>(l))) + 32);
        if (j < 8)
          y[i].scales[j] = static_cast<uint8_t>(l & 0xF);
        else
          y[i].scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
        l = static_cast<int8_t>(l >> 4);
        y[i].scales[j % 4 + 8] |= static_cast<uint8_t>(l << (2 * (j / 4)));
      }
      y[i].d = f32_to_f16(1 / iscale);
    } else {
      y[i].d = f32_to_f16(0.f);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      int sc = j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4;
      sc = (sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
      const float d = f16_to_f32(y[i].d) * sc;
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
      }
    }
    // High bit of element j goes to hmask[j % 32], bit j / 32.
    std::memset(y[i].hmask, 0, QK_K / 8);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < QK_K; ++j) {
      if (L[j] > 3) {
        y[i].hmask[m] |= hm;
        L[j] = static_cast<int8_t>(L[j] - 4);
      }
      if (++m == QK_K / 8) {
        m = 0;
        hm = static_cast<uint8_t>(hm << 1);
      }
    }
    for (int j = 0; j < QK_K; j += 128)
      for (int l = 0; l < 32; ++l)
        y[i].qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                                  (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
  }
}

// Q4_K and Q5_K share the scale search (nmax 15 / 31, trial range rmin .. rmin + nstep * 0.1).
template <int kNmax>
void quantize_k4_scales(const float* x, uint8_t* L, uint8_t* sc_out, uint16_t* d_out,
                        uint16_t* dmin_out, float rmin, int nstep) {
  uint8_t Laux[32];
  float weights[32], mins[QK_K / 32], scales[QK_K / 32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < QK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin,
                                 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(sc_out, 0, K_SCALE_SIZE);
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    set_scale_min_k4(j, std::min<uint8_t>(63, ls), std::min<uint8_t>(63, lm), sc_out);
  }
  *d_out = f32_to_f16(max_scale / 63.f);
  *dmin_out = f32_to_f16(max_min / 63.f);
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, sc_out, &sc, &m);
    const float d = f16_to_f32(*d_out) * sc;
    if (!d) continue;
    const float dm = f16_to_f32(*dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(kNmax, l)));
    }
  }
}

void quantize_row_q4_K_ref(const float* x, void* vy, int64_t k) {
  block_q4_K* y = static_cast<block_q4_K*>(vy);
  uint8_t L[QK_K];
  for (int64_t i = 0; i < k / QK_K; ++i, x += QK_K) {
    quantize_k4_scales<15>(x, L, y[i].scales, &y[i].d, &y[i].dmin, -1.f, 20);
    uint8_t* q = y[i].qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

void quantize_row_q5_K_ref(const float* x, void* vy, int64_t k) {
  block_q5_K* y = static_cast<block_q5_K*>(vy);
  uint8_t L[QK_K];
  for (int64_t i = 0; i < k / QK_K; ++i, x += QK_K) {
    quantize_k4_scales<31>(x, L, y[i].scales, &y[i].d, &y[i].dmin, -0.5f, 15);
    uint8_t* qh = y[i].qh;
    uint8_t* ql = y[i].qs;
    std::memset(qh, 0, QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[n + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
  }
}

void quantize_row_q6_K_ref(const float* x, void* vy, int64_t k) {
  block_q6_K* y = static_cast<block_q6_K*>(vy);
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < k / QK_K; ++i, x += QK_K) {
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(block_q6_K));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = f32_to_f16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib)
      y[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = f16_to_f32(y[i].d) * y[i].scales[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l + 0] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                     ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

// ---- dense types ----

void quantize_row_f32(const float* x, void* y, int64_t n) {
  std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
}
void quantize_row_f16(const float* x, void* vy, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(vy);
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}
void quantize_row_bf16(const float* x, void* vy, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(vy);
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

// The row quantizer of a weight type (nullptr where there is none).
FromFloatFn weight_quantizer(DType t) {
  switch (t) {
    case DType::F32: return quantize_row_f32;
    case DType::F16: return quantize_row_f16;
    case DType::BF16: return quantize_row_bf16;
    case DType::Q4_0: return quantize_row_q4_0_ref;
    case DType::Q4_1: return quantize_row_q4_1_ref;
    case DType::Q5_0: return quantize_row_q5_0_ref;
    case DType::Q5_1: return quantize_row_q5_1_ref;
    case DType::Q8_0: return quantize_row_q8_0_ref;
    case DType::Q2_K: return quantize_row_q2_K_ref;
    case DType::Q3_K: return quantize_row_q3_K_ref;
    case DType::Q4_K: return quantize_row_q4_K_ref;
    case DType::Q5_K: return quantize_row_q5_K_ref;
    case DType::Q6_K: return quantize_row_q6_K_ref;
    default: return nullptr;
  }
}

}  // namespace

void quantize_weight(const Tensor& out, const Tensor& src) {
  const char* op = "quantize_weight";
  VLLMX_CHECK(src.defined() && out.defined(), op, "missing tensor");
  check_dtype(src, DType::F32, op, "src");
  const FromFloatFn fn = weight_quantizer(out.dtype);
  if (fn == nullptr)
    fail(op, std::string("no quantizer for output dtype ") + dtype_name(out.dtype) + " (id " +
                 std::to_string(static_cast<int>(out.dtype)) + ")");
  VLLMX_CHECK(src.ndim >= 1 && out.ndim == src.ndim, op,
        "out " + out.str() + " and src " + src.str() + " differ in shape");
  for (int i = 0; i < src.ndim; ++i)
    VLLMX_CHECK(out.shape[i] == src.shape[i], op,
          "out " + out.str() + " and src " + src.str() + " differ in shape");
  const int64_t n = src.size(-1);
  const int64_t bs = type_traits(out.dtype).block_size;
  VLLMX_CHECK(n % bs == 0, op,
        "src " + src.str() + ": last dim is not a multiple of the " + dtype_name(out.dtype) +
            " block size " + std::to_string(bs));
  for (int i = 0; i + 1 < src.ndim; ++i)  // rows must be packed (a dim of 1 has any stride)
    VLLMX_CHECK(src.shape[i] == 1 || src.stride[i] == src.stride[i + 1] * src.shape[i + 1], op,
          "src " + src.str() + " must be contiguous");
  const int64_t rows = n == 0 ? 0 : src.numel() / n;
  const int64_t obytes = row_bytes(out.dtype, n);
  const bool packed = !is_quantized(out.dtype) || out.ndim < 2 || out.shape[out.ndim - 2] == 1 ||
                      out.stride[out.ndim - 2] == obytes;
  VLLMX_CHECK(packed, op, "out " + out.str() + " must be contiguous");
  uint8_t* o = static_cast<uint8_t*>(out.data);
  const float* s = src.ptr<float>();
#pragma omp parallel for schedule(dynamic, 4) if (rows * n > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) fn(s + r * n, o + r * obytes, n);
}

VLLMX_KERNEL(quantize_weight, kCPU, quantize_weight);

}  // namespace vllmx
