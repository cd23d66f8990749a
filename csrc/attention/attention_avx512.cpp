// paged_attention, AVX-512 path: one work item (consecutive query tokens of a sequence x the
// query heads of one kv head) against 16-key tiles converted once to f32.
//
// QK^T: the K tile is transposed (KT[d] holds dim d of the 16 keys), so a row's 16 scores are
// one vector, accumulated over d = 0 .. D-1 by FMA with the broadcast q[d]: no horizontal sums.
// Two tiles go through one pass (12 rows x 2 key vectors in registers). The online softmax then
// works on that vector; P.V is a register-tiled rank-1 update acc[row][d] += p[row][j] * V[j][d],
// j ascending. Every row does the same float operations whether it is alone (decode) or one of
// the 48 rows of a prefill item, and whichever register tile or pass it lands in.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "attention/attention.h"
#include "core/simd_math.h"
#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>
// GCC 12 false positive on the _mm512_undefined_* inside the intrinsic headers (PR 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace vllmx::attn {

namespace {

constexpr int kPvRows = 6;  // rows x 4 chunks of 16 dims per P.V register tile

// exp(x) for x <= 0 mostly; inputs below -103 give ~0.
VLLMX_TARGET_AVX512 inline __m512 exp512(__m512 x) { return vllmx::exp512(x, -103.0f); }

// Sum of the 16 lanes in a fixed tree: (l, l+8), then (l, l+4), (l, l+2), (l, l+1).
VLLMX_TARGET_AVX512 inline float hsum16(__m512 p) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(p), _mm512_extractf32x8_ps(p, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

VLLMX_TARGET_AVX512 inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// Converts one cache row of D elements to f32, zero padded to a multiple of 16.
VLLMX_TARGET_AVX512 inline void load_row(float* dst, const char* base, int64_t off, int64_t D,
                                         int dtype) {
  for (int64_t d = 0; d < D; d += 16) {
    const __mmask16 m = tail_mask(D - d);
    __m512 x;
    if (dtype == 1) {
      x = _mm512_cvtph_ps(
          _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(base) + off + d));
    } else if (dtype == 30) {
      const __m256i h =
          _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(base) + off + d);
      x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      x = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(base) + off + d);
    }
    _mm512_store_ps(dst + d, x);
  }
}

// dst[c * ldd + r] = src[r * lds + c] for a 16 x 16 block.
VLLMX_TARGET_AVX512 inline void transpose16(const float* src, int64_t lds, float* dst,
                                            int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // r[4i + e], 128-bit lane k: rows 4i .. 4i+3 of column 4k + e.
  for (int e = 0; e < 4; ++e) {
    t[e] = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88);
    t[4 + e] = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xdd);
    t[8 + e] = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
    t[12 + e] = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xdd);
  }
  for (int e = 0; e < 4; ++e) {
    _mm512_store_ps(dst + (0 + e) * ldd, _mm512_shuffle_f32x4(t[e], t[8 + e], 0x88));
    _mm512_store_ps(dst + (8 + e) * ldd, _mm512_shuffle_f32x4(t[e], t[8 + e], 0xdd));
    _mm512_store_ps(dst + (4 + e) * ldd, _mm512_shuffle_f32x4(t[4 + e], t[12 + e], 0x88));
    _mm512_store_ps(dst + (12 + e) * ldd, _mm512_shuffle_f32x4(t[4 + e], t[12 + e], 0xdd));
  }
}

// S[r * 32 + 16 t + j] = sum over d = 0 .. D-1, in order, of q_r[d] * K_t[j][d] for NT key
// tiles t; qt is the item's queries transposed (qt[d * ld + r]), KT[d * 32 + 16 t + j] = K_t[j][d].
template <int N, int NT>
VLLMX_TARGET_AVX512 void qk_tile(const float* qt, int64_t ld, const float* KT, int64_t D,
                                 float* S) {
  __m512 acc[N][NT];
  __m512 k[NT];
  for (int t = 0; t < NT; ++t) k[t] = _mm512_load_ps(KT + t * 16);
  for (int r = 0; r < N; ++r) {
    const __m512 q = _mm512_set1_ps(qt[r]);
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_mul_ps(q, k[t]);
  }
  for (int64_t d = 1; d < D; ++d) {
    for (int t = 0; t < NT; ++t) k[t] = _mm512_load_ps(KT + d * 32 + t * 16);
    const float* qd = qt + d * ld;
    for (int r = 0; r < N; ++r) {
      const __m512 q = _mm512_set1_ps(qd[r]);
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_fmadd_ps(q, k[t], acc[r][t]);
    }
  }
  for (int r = 0; r < N; ++r)
    for (int t = 0; t < NT; ++t) _mm512_store_ps(S + r * 32 + t * 16, acc[r][t]);
}

using QkFn = void (*)(const float*, int64_t, const float*, int64_t, float*);
template <int NT, int... I>
constexpr auto make_qk_table(std::integer_sequence<int, I...>) {
  return std::array<QkFn, sizeof...(I)>{&qk_tile<I + 1, NT>...};
}
constexpr int kQkRows1 = 24, kQkRows2 = 12;  // 24 accumulators
constexpr auto kQk1 = make_qk_table<1>(std::make_integer_sequence<int, kQkRows1>{});
constexpr auto kQk2 = make_qk_table<2>(std::make_integer_sequence<int, kQkRows2>{});

// acc[r][d] = acc[r][d] * corr[r], then += P[r * 32 + j] * V[j][d] for j = 0 .. 15 in order:
// all 16 keys of the tile visible to each of the N rows. NC chunks of 16 dims.
template <int N, int NC>
VLLMX_TARGET_AVX512 void pv_tile(float* acc, int64_t ld, const float* P, const float* corr,
                                 const float* V, int64_t ldv) {
  __m512 x[N][NC];
  for (int r = 0; r < N; ++r) {
    const __m512 c = _mm512_set1_ps(corr[r]);
    for (int i = 0; i < NC; ++i) x[r][i] = _mm512_mul_ps(_mm512_load_ps(acc + r * ld + i * 16), c);
  }
  for (int j = 0; j < kTile; ++j) {
    __m512 v[NC];
    for (int i = 0; i < NC; ++i) v[i] = _mm512_load_ps(V + j * ldv + i * 16);
    for (int r = 0; r < N; ++r) {
      const __m512 p = _mm512_set1_ps(P[r * 32 + j]);
      for (int i = 0; i < NC; ++i) x[r][i] = _mm512_fmadd_ps(p, v[i], x[r][i]);
    }
  }
  for (int r = 0; r < N; ++r)
    for (int i = 0; i < NC; ++i) _mm512_store_ps(acc + r * ld + i * 16, x[r][i]);
}

using PvFn = void (*)(float*, int64_t, const float*, const float*, const float*, int64_t);
template <int NC, int... I>
constexpr auto make_pv_row(std::integer_sequence<int, I...>) {
  return std::array<PvFn, sizeof...(I)>{&pv_tile<I + 1, NC>...};
}
constexpr std::array<std::array<PvFn, kPvRows>, 4> kPv = {
    make_pv_row<1>(std::make_integer_sequence<int, kPvRows>{}),
    make_pv_row<2>(std::make_integer_sequence<int, kPvRows>{}),
    make_pv_row<3>(std::make_integer_sequence<int, kPvRows>{}),
    make_pv_row<4>(std::make_integer_sequence<int, kPvRows>{})};

// The same update for one row whose visible keys of the tile are j0 .. j1-1.
VLLMX_TARGET_AVX512 void pv_row(float* acc, int64_t nc, const float* p, float corr,
                                const float* V, int64_t ldv, int64_t j0, int64_t j1) {
  const __m512 c = _mm512_set1_ps(corr);
  for (int64_t i = 0; i < nc; ++i) {
    __m512 x = _mm512_mul_ps(_mm512_load_ps(acc + i * 16), c);
    for (int64_t j = j0; j < j1; ++j)
      x = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_load_ps(V + j * ldv + i * 16), x);
    _mm512_store_ps(acc + i * 16, x);
  }
}

}  // namespace

// Converts the keys k0 .. k1 of the tile at ts (others zero): V row-major into V [16][Dp], K
// transposed into KT[d * 32 + j] (Kr: scratch).
VLLMX_TARGET_AVX512 static void convert_tile(const Args& a, const WorkItem& w, int64_t ts,
                                             int64_t k0, int64_t k1, bool with_k, bool with_v,
                                             float* Kr, float* KT, float* V) {
  const int64_t D = a.D, Dp = (D + 15) / 16 * 16;
  for (int64_t j = 0; j < kTile; ++j) {
    const int64_t pos = ts + j;
    if (pos < k0 || pos > k1) {
      if (with_k) std::memset(Kr + j * Dp, 0, sizeof(float) * Dp);
      if (with_v) std::memset(V + j * Dp, 0, sizeof(float) * Dp);
      continue;
    }
    const int64_t off = kv_offset(a, w.b, pos, w.g);
    if (with_k) load_row(Kr + j * Dp, a.kc, off, D, a.dtype);
    if (with_v) load_row(V + j * Dp, a.vc, off, D, a.dtype);
  }
  if (with_k)
    for (int64_t c = 0; c < Dp / 16; ++c) transpose16(Kr + c * 16, Dp, KT + c * 16 * 32, 32);
}

VLLMX_TARGET_AVX512 void attend_item_avx512(const Args& a, const WorkItem& w, Scratch& s) {
  const int64_t D = a.D, G = a.G, Dp = (D + 15) / 16 * 16, nc = Dp / 16;
  const int64_t R = w.nt * G, Rp = (R + 15) / 16 * 16;
  float* qt = s.get(0, D * R);
  float* Kr = s.get(1, kTile * Dp);
  float* KT = s.get(2, Dp * 2 * kTile);
  float* V = s.get(3, kTile * Dp);
  float* S = s.get(4, R * 2 * kTile);  // per row: scores, then probabilities, of 2 tiles
  float* acc = s.get(5, R * Dp);
  float* m = s.get(6, Rp);
  float* l = s.get(7, Rp);
  float* corr = s.get(8, Rp);
  float* mt = s.get(9, Rp);
  for (int64_t i = 0; i < w.nt; ++i) {
    const float* q = a.q + (w.t0 + i) * a.q_stride + w.g * G * D;  // G heads, contiguous
    for (int64_t d = 0; d < D; ++d)
      for (int64_t h = 0; h < G; ++h) qt[d * R + i * G + h] = q[h * D + d];
  }
  for (int64_t r = 0; r < R; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
  }
  std::memset(acc, 0, sizeof(float) * R * Dp);
  uint16_t masks[kMaxItemTokens];  // per token of the item: its visible keys of the tile
  int8_t j0s[kMaxItemTokens], j1s[kMaxItemTokens];
  const __m512 vscale = _mm512_set1_ps(a.scale);

  const int64_t pos_last = row_pos(w, w.nt - 1);
  // Tiles go by pairs: the pair's scores come from one QK^T pass (two K vectors per q
  // broadcast), then each tile is one online-softmax step.
  for (int64_t ts0 = window_lo(a, w.pos0) / kTile * kTile; ts0 <= pos_last; ts0 += 2 * kTile) {
    TileSpan sp[2];
    bool ok[2];
    for (int t = 0; t < 2; ++t) {
      ok[t] = ts0 + t * kTile <= pos_last && tile_span(a, w, ts0 + t * kTile, sp[t]);
      if (ok[t]) convert_tile(a, w, ts0 + t * kTile, sp[t].k0, sp[t].k1, true, false, Kr,
                              KT + t * kTile, V);
    }
    if (ok[0] && ok[1]) {
      const int64_t ra = std::min(sp[0].i_a, sp[1].i_a) * G;
      const int64_t rb = (std::max(sp[0].i_b, sp[1].i_b) + 1) * G;
      for (int64_t r = ra; r < rb; r += kQkRows2) {
        const int64_t n = std::min<int64_t>(kQkRows2, rb - r);
        kQk2[n - 1](qt + r, R, KT, D, S + r * 2 * kTile);
      }
    } else {
      const int t = ok[0] ? 0 : 1;
      if (!ok[t]) continue;
      for (int64_t r = sp[t].i_a * G; r < (sp[t].i_b + 1) * G; r += kQkRows1) {
        const int64_t n = std::min<int64_t>(kQkRows1, (sp[t].i_b + 1) * G - r);
        // Tile 1 alone: shift KT and S by one tile.
        kQk1[n - 1](qt + r, R, KT + t * kTile, D, S + r * 2 * kTile + t * kTile);
      }
    }
    for (int t = 0; t < 2; ++t) {
      if (!ok[t]) continue;
      const int64_t ts = ts0 + t * kTile;
      const int64_t i_a = sp[t].i_a, i_b = sp[t].i_b;
      bool full = true;
      for (int64_t i = i_a; i <= i_b; ++i) {
        int64_t j0, j1;
        visible_keys(a, w, i, ts, j0, j1);
        j0s[i] = static_cast<int8_t>(j0);
        j1s[i] = static_cast<int8_t>(j1);
        masks[i] = static_cast<uint16_t>(((1u << j1) - 1) & ~((1u << j0) - 1));
        full = full && j0 == 0 && j1 == kTile;
      }
      convert_tile(a, w, ts, sp[t].k0, sp[t].k1, false, true, Kr, KT, V);
      float* P = S + t * kTile;  // row r at P + r * 32
      const int64_t ra = i_a * G, rb = (i_b + 1) * G;
      // Online softmax: per row max, then the new running max and correction for all rows.
      for (int64_t r = ra; r < rb; ++r) {
        __m512 sv = _mm512_mul_ps(_mm512_load_ps(P + r * 32), vscale);
        if (a.cap > 0) {
          alignas(64) float sc[kTile];
          _mm512_store_ps(sc, sv);
          for (int j = 0; j < kTile; ++j) sc[j] = a.cap * std::tanh(sc[j] / a.cap);
          sv = _mm512_load_ps(sc);
        }
        _mm512_store_ps(P + r * 32, sv);
        mt[r] = _mm512_mask_reduce_max_ps(masks[r / G], sv);
      }
      for (int64_t r = ra; r < rb; r += 16) {
        const __mmask16 k = tail_mask(rb - r);
        const __m512 mo = _mm512_maskz_loadu_ps(k, m + r);
        const __m512 mn = _mm512_max_ps(mo, _mm512_maskz_loadu_ps(k, mt + r));
        _mm512_mask_storeu_ps(corr + r, k, exp512(_mm512_sub_ps(mo, mn)));
        _mm512_mask_storeu_ps(m + r, k, mn);
      }
      for (int64_t r = ra; r < rb; ++r) {
        const __m512 sv = _mm512_load_ps(P + r * 32);
        const __m512 p =
            _mm512_maskz_mov_ps(masks[r / G], exp512(_mm512_sub_ps(sv, _mm512_set1_ps(m[r]))));
        _mm512_store_ps(P + r * 32, p);
        l[r] = _mm_cvtss_f32(
            _mm_fmadd_ss(_mm_set_ss(l[r]), _mm_set_ss(corr[r]), _mm_set_ss(hsum16(p))));
      }
      // P.V
      if (full) {
        for (int64_t c = 0; c < nc; c += 4) {
          const int64_t ncb = std::min<int64_t>(4, nc - c);
          for (int64_t r = ra; r < rb; r += kPvRows) {
            const int64_t n = std::min<int64_t>(kPvRows, rb - r);
            kPv[ncb - 1][n - 1](acc + r * Dp + c * 16, Dp, P + r * 32, corr + r, V + c * 16, Dp);
          }
        }
      } else {
        for (int64_t r = ra; r < rb; ++r)
          pv_row(acc + r * Dp, nc, P + r * 32, corr[r], V, Dp, j0s[r / G], j1s[r / G]);
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* o = a.out + (w.t0 + r / G) * a.out_stride + (w.g * G + r % G) * D;
    const __m512 inv = a.sinks == nullptr
                           ? _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_set1_ps(l[r]))
                           : _mm512_set1_ps(row_inv(a, w.g * G + r % G, m[r], l[r]));
    for (int64_t d = 0; d < D; d += 16)
      _mm512_mask_storeu_ps(o + d, tail_mask(D - d),
                            _mm512_mul_ps(_mm512_load_ps(acc + r * Dp + d), inv));
  }
}

}  // namespace vllmx::attn
#endif
