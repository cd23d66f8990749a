// paged_attention, AVX2 path: the AVX-512 path's design (attention_avx512.cpp) at 8 lanes. One
// work item (consecutive query tokens of a sequence x the query heads of one kv head) against
// 16-key tiles converted once to f32.
//
// QK^T: the K tile is transposed (KT[d * 16 + j] is dim d of key j), so a row's 16 scores are
// two vectors accumulated over d = 0 .. D-1 by FMA with the broadcast q[d]: no horizontal sums,
// and up to kQkRows rows share each K load. The online softmax works on those two vectors; P.V
// is a register-tiled rank-1 update acc[row][d] += p[row][j] * V[j][d], j ascending. Every row
// does the same float operations whether it is alone (decode) or one of the rows of a prefill
// item, and whichever register tile it lands in (batch invariance, attention.h).
//
// Head sizes that are not a multiple of 8 take the portable tiled path compiled for AVX2
// (attention_tiled.inc) instead: a function of the model, never of the batch.
#include "core/cpu_features.h"

#if VLLMX_X86
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "attention/attention.h"
#include "core/half.h"
#include "core/simd_math.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace vllmx::attn {

namespace {
#include "attention/attention_tiled.inc"

constexpr int kQkRows = 6;  // rows x 2 key vectors of accumulators
constexpr int kPvRows = 2;  // rows x up to 4 chunks of 8 dims per P.V register tile

inline __m256 exp256(__m256 x) { return vllmx::exp256(x, -103.0f); }

// Sum of the 8 lanes in a fixed tree: (l, l+4), then (l, l+2), (l, l+1).
inline float hsum8(__m256 p) {
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps(p, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

inline float hmax8(__m256 p) {
  const __m128 b = _mm_max_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps(p, 1));
  const __m128 c = _mm_max_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_max_ss(c, _mm_movehdup_ps(c)));
}

// Eight cache elements (off .. off + 7) as f32.
inline __m256 load8(const char* base, int64_t off, int dtype) {
  if (dtype == 1)
    return _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(base) + off)));
  if (dtype == 30) {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(base) + off));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps(reinterpret_cast<const float*>(base) + off);
}

// Converts one cache row of D (a multiple of 8) elements to f32.
inline void load_row(float* dst, const char* base, int64_t off, int64_t D, int dtype) {
  for (int64_t d = 0; d < D; d += 8) _mm256_store_ps(dst + d, load8(base, off + d, dtype));
}

// dst[c * ldd + i] = r[i][c] for 8 vectors r[0..7] (an 8 x 8 block, transposed in registers).
inline void transpose8(__m256 (&r)[8], float* dst, int64_t ldd) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  // r[e] holds columns e (low 128 bits) and 4 + e (high) of rows 0-3, r[4 + e] of rows 4-7.
  for (int e = 0; e < 4; ++e) {
    _mm256_store_ps(dst + e * ldd, _mm256_permute2f128_ps(r[e], r[4 + e], 0x20));
    _mm256_store_ps(dst + (4 + e) * ldd, _mm256_permute2f128_ps(r[e], r[4 + e], 0x31));
  }
}

// S[r * 16 + j] = sum over d = 0 .. D-1, in order, of q_r[d] * K[j][d]; qt is the item's
// queries transposed (qt[d * ld + r]), KT[d * 16 + j] = K[j][d].
template <int N>
void qk_tile(const float* qt, int64_t ld, const float* KT, int64_t D, float* S) {
  __m256 acc[N][2];
  __m256 k0 = _mm256_load_ps(KT), k1 = _mm256_load_ps(KT + 8);
  for (int r = 0; r < N; ++r) {
    const __m256 q = _mm256_broadcast_ss(qt + r);
    acc[r][0] = _mm256_mul_ps(q, k0);
    acc[r][1] = _mm256_mul_ps(q, k1);
  }
  for (int64_t d = 1; d < D; ++d) {
    k0 = _mm256_load_ps(KT + d * 16);
    k1 = _mm256_load_ps(KT + d * 16 + 8);
    const float* qd = qt + d * ld;
    for (int r = 0; r < N; ++r) {
      const __m256 q = _mm256_broadcast_ss(qd + r);
      acc[r][0] = _mm256_fmadd_ps(q, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(q, k1, acc[r][1]);
    }
  }
  for (int r = 0; r < N; ++r) {
    _mm256_store_ps(S + r * 16, acc[r][0]);
    _mm256_store_ps(S + r * 16 + 8, acc[r][1]);
  }
}

using QkFn = void (*)(const float*, int64_t, const float*, int64_t, float*);
template <int... I>
constexpr auto make_qk_table(std::integer_sequence<int, I...>) {
  return std::array<QkFn, sizeof...(I)>{&qk_tile<I + 1>...};
}
constexpr auto kQk = make_qk_table(std::make_integer_sequence<int, kQkRows>{});

// acc[r][d] = acc[r][d] * corr[r], then += P[r * 16 + j] * V[j][d] for j = 0 .. 15 in order:
// all 16 keys of the tile visible to each of the N rows. NC chunks of 8 dims.
template <int N, int NC>
void pv_tile(float* acc, int64_t ld, const float* P, const float* corr, const float* V,
             int64_t ldv) {
  __m256 x[N][NC];
  for (int r = 0; r < N; ++r) {
    const __m256 c = _mm256_set1_ps(corr[r]);
    for (int i = 0; i < NC; ++i) x[r][i] = _mm256_mul_ps(_mm256_load_ps(acc + r * ld + i * 8), c);
  }
  for (int j = 0; j < kTile; ++j) {
    __m256 p[N];
    for (int r = 0; r < N; ++r) p[r] = _mm256_broadcast_ss(P + r * 16 + j);
    for (int i = 0; i < NC; ++i) {
      const __m256 v = _mm256_load_ps(V + j * ldv + i * 8);
      for (int r = 0; r < N; ++r) x[r][i] = _mm256_fmadd_ps(p[r], v, x[r][i]);
    }
  }
  for (int r = 0; r < N; ++r)
    for (int i = 0; i < NC; ++i) _mm256_store_ps(acc + r * ld + i * 8, x[r][i]);
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
void pv_row(float* acc, int64_t nc, const float* p, float corr, const float* V, int64_t ldv,
            int64_t j0, int64_t j1) {
  const __m256 c = _mm256_set1_ps(corr);
  for (int64_t i = 0; i < nc; ++i) {
    __m256 x = _mm256_mul_ps(_mm256_load_ps(acc + i * 8), c);
    for (int64_t j = j0; j < j1; ++j)
      x = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_load_ps(V + j * ldv + i * 8), x);
    _mm256_store_ps(acc + i * 8, x);
  }
}

// Converts the keys k0 .. k1 of the tile at ts (others zero): V row-major into V [16][D], K
// transposed into KT[d * 16 + j], 8 keys x 8 dims at a time straight from the cache through
// registers (decode's items have few rows, and converting K and V was a fifth of a MoE decode
// step with K through a row-major scratch copy first).
void convert_tile(const Args& a, const WorkItem& w, int64_t ts, int64_t k0, int64_t k1,
                  float* KT, float* V) {
  const int64_t D = a.D;
  int64_t off[kTile];
  for (int64_t j = 0; j < kTile; ++j) {
    const int64_t pos = ts + j;
    off[j] = pos < k0 || pos > k1 ? -1 : kv_offset(a, w.b, pos, w.g);
    if (off[j] < 0)
      std::memset(V + j * D, 0, sizeof(float) * D);
    else
      load_row(V + j * D, a.vc, off[j], D, a.dtype);
  }
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t h = 0; h < kTile; h += 8)
    for (int64_t c = 0; c < D; c += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i)
        r[i] = off[h + i] < 0 ? zero : load8(a.kc, off[h + i] + c, a.dtype);
      transpose8(r, KT + c * kTile + h, kTile);
    }
}

void attend_item_vec(const Args& a, const WorkItem& w, Scratch& s) {
  const int64_t D = a.D, G = a.G, nc = D / 8;
  const int64_t R = w.nt * G, Rp = (R + 7) / 8 * 8;
  float* qt = s.get(0, D * R);
  float* KT = s.get(2, D * kTile);
  float* V = s.get(3, kTile * D);
  float* S = s.get(4, R * kTile);  // per row: scores, then probabilities
  float* acc = s.get(5, R * D);
  float* m = s.get(6, Rp);
  float* l = s.get(7, Rp);
  float* corr = s.get(8, Rp);
  float* mt = s.get(9, Rp);
  for (int64_t i = 0; i < w.nt; ++i) {
    const float* q = a.q + (w.t0 + i) * a.q_stride + w.g * G * D;  // G heads, contiguous
    for (int64_t d = 0; d < D; ++d)
      for (int64_t h = 0; h < G; ++h) qt[d * R + i * G + h] = q[h * D + d];
  }
  for (int64_t r = 0; r < Rp; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    mt[r] = -std::numeric_limits<float>::infinity();
  }
  std::memset(acc, 0, sizeof(float) * R * D);
  int8_t j0s[kMaxItemTokens], j1s[kMaxItemTokens];
  __m256 vis[kMaxItemTokens][2];  // per token of the item: its visible keys of the tile, by lane
  const __m256 vscale = _mm256_set1_ps(a.scale);
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256i lane_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lane_hi = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);

  const int64_t pos_last = row_pos(w, w.nt - 1);
  for (int64_t ts = window_lo(a, w.pos0) / kTile * kTile; ts <= pos_last; ts += kTile) {
    TileSpan sp;
    if (!tile_span(a, w, ts, sp)) continue;
    convert_tile(a, w, ts, sp.k0, sp.k1, KT, V);
    const int64_t ra = sp.i_a * G, rb = (sp.i_b + 1) * G;
    for (int64_t r = ra; r < rb; r += kQkRows) {
      const int64_t n = std::min<int64_t>(kQkRows, rb - r);
      kQk[n - 1](qt + r, R, KT, D, S + r * kTile);
    }
    bool full = true;
    for (int64_t i = sp.i_a; i <= sp.i_b; ++i) {
      int64_t j0, j1;
      visible_keys(a, w, i, ts, j0, j1);
      j0s[i] = static_cast<int8_t>(j0);
      j1s[i] = static_cast<int8_t>(j1);
      full = full && j0 == 0 && j1 == kTile;
      // Visible: j0 <= lane < j1.
      const __m256i lo = _mm256_set1_epi32(static_cast<int>(j0));
      const __m256i hi = _mm256_set1_epi32(static_cast<int>(j1));
      vis[i][0] = _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(lo, lane_lo),
                                                          _mm256_cmpgt_epi32(hi, lane_lo)));
      vis[i][1] = _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(lo, lane_hi),
                                                          _mm256_cmpgt_epi32(hi, lane_hi)));
    }
    // Online softmax: per row the max over its visible keys, then the new running max and the
    // correction for all rows, then the probabilities (zero where a key is not visible).
    for (int64_t r = ra; r < rb; ++r) {
      float* P = S + r * kTile;
      __m256 s0 = _mm256_mul_ps(_mm256_load_ps(P), vscale);
      __m256 s1 = _mm256_mul_ps(_mm256_load_ps(P + 8), vscale);
      if (a.cap > 0) {
        alignas(32) float sc[kTile];
        _mm256_store_ps(sc, s0);
        _mm256_store_ps(sc + 8, s1);
        for (int j = 0; j < kTile; ++j) sc[j] = a.cap * std::tanh(sc[j] / a.cap);
        s0 = _mm256_load_ps(sc);
        s1 = _mm256_load_ps(sc + 8);
      }
      _mm256_store_ps(P, s0);
      _mm256_store_ps(P + 8, s1);
      const __m256(&ok)[2] = vis[r / G];
      mt[r] = hmax8(
          _mm256_max_ps(_mm256_blendv_ps(ninf, s0, ok[0]), _mm256_blendv_ps(ninf, s1, ok[1])));
    }
    for (int64_t r = ra / 8 * 8; r < rb; r += 8) {
      // Rows outside ra .. rb-1 in this group are recomputed from their own m and mt = -inf:
      // unchanged (max(m, -inf) = m), and their corr is not read.
      const __m256 mo = _mm256_load_ps(m + r);
      const __m256 mn = _mm256_max_ps(mo, _mm256_load_ps(mt + r));
      _mm256_store_ps(corr + r, exp256(_mm256_sub_ps(mo, mn)));
      _mm256_store_ps(m + r, mn);
    }
    for (int64_t r = ra; r < rb; ++r) {
      float* P = S + r * kTile;
      const __m256(&ok)[2] = vis[r / G];
      const __m256 mr = _mm256_set1_ps(m[r]);
      const __m256 p0 = _mm256_and_ps(ok[0], exp256(_mm256_sub_ps(_mm256_load_ps(P), mr)));
      const __m256 p1 = _mm256_and_ps(ok[1], exp256(_mm256_sub_ps(_mm256_load_ps(P + 8), mr)));
      _mm256_store_ps(P, p0);
      _mm256_store_ps(P + 8, p1);
      l[r] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(l[r]), _mm_set_ss(corr[r]),
                                        _mm_set_ss(hsum8(_mm256_add_ps(p0, p1)))));
      mt[r] = -std::numeric_limits<float>::infinity();
    }
    // P.V
    if (full) {
      for (int64_t c = 0; c < nc; c += 4) {
        const int64_t ncb = std::min<int64_t>(4, nc - c);
        for (int64_t r = ra; r < rb; r += kPvRows) {
          const int64_t n = std::min<int64_t>(kPvRows, rb - r);
          kPv[ncb - 1][n - 1](acc + r * D + c * 8, D, S + r * kTile, corr + r, V + c * 8, D);
        }
      }
    } else {
      for (int64_t r = ra; r < rb; ++r)
        pv_row(acc + r * D, nc, S + r * kTile, corr[r], V, D, j0s[r / G], j1s[r / G]);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* o = a.out + (w.t0 + r / G) * a.out_stride + (w.g * G + r % G) * D;
    const __m256 inv = a.sinks == nullptr
                           ? _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(l[r]))
                           : _mm256_set1_ps(row_inv(a, w.g * G + r % G, m[r], l[r]));
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_load_ps(acc + r * D + d), inv));
  }
}

}  // namespace

void attend_item_avx2(const Args& a, const WorkItem& w, Scratch& s) {
  if (a.D % 8 == 0)
    attend_item_vec(a, w, s);
  else
    attend_item_tiled(a, w, s);
}

}  // namespace vllmx::attn

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // VLLMX_X86
