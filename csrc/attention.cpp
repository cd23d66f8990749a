// paged_attention: varlen causal attention over vLLM's flash-layout paged KV cache
// [num_blocks, block_size, num_kv_heads, head_size] (f16 / bf16 / f32), GQA, optional sliding
// window and logits soft cap.
//
// Work item = (query token, kv head): the G = nq / nkv query heads sharing that kv head are done
// together so each K/V row is converted to f32 once per item. Keys are visited in tiles of 16
// aligned to absolute context positions (tile t covers positions [16t, 16t + 16)), with a flash
// style online softmax in f32. The arithmetic of a query row therefore depends only on its own
// query vector, its absolute position and its sequence's cache contents: never on the batch
// around it, on the thread that ran it, or on whether the prompt was prefilled in one go or in
// chunks (batch invariance). The reference twin is a scalar two-pass softmax in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif
// GCC 12 false positive on the _mm512_undefined_* inside the intrinsic headers (PR 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "cpu_features.h"
#include "half.h"
#include "ops.h"

namespace vllmx {

namespace {

constexpr const char* kOp = "paged_attention";
constexpr int kTile = 16;
constexpr int64_t kMaxHeadSize = 1024;

struct Args {
  const float* q;
  float* out;
  const char* kc;
  const char* vc;
  int dtype;  // 0 f32, 1 f16, 30 bf16
  int64_t esize;
  int64_t block_size, nkv, D, nq, G;
  const int32_t* bt;
  int64_t bt_stride;
  const int32_t* qsl;
  const int32_t* seq_lens;
  int64_t B;
  float scale;
  int64_t window;
  float cap;
  int64_t q_stride, out_stride;
};

// Which sequence owns query row t (query_start_loc is non-decreasing).
inline int64_t seq_of(const Args& a, int64_t t) {
  const int32_t* it = std::upper_bound(a.qsl, a.qsl + a.B + 1, static_cast<int32_t>(t));
  return (it - a.qsl) - 1;
}

struct Item {
  int64_t b, pos, lo, hi;  // sequence, absolute position, visible keys [lo, hi]
};

inline Item make_item(const Args& a, int64_t t) {
  Item it;
  it.b = seq_of(a, t);
  const int64_t q_len = a.qsl[it.b + 1] - a.qsl[it.b];
  const int64_t seq_len = a.seq_lens[it.b];
  it.pos = seq_len - q_len + (t - a.qsl[it.b]);
  it.hi = it.pos;
  it.lo = a.window > 0 ? std::max<int64_t>(0, it.pos - a.window + 1) : 0;
  return it;
}

// Address of the (kv head g) row of context position pos of sequence b, in elements.
inline int64_t kv_offset(const Args& a, int64_t b, int64_t pos, int64_t g) {
  const int64_t block = a.bt[b * a.bt_stride + pos / a.block_size];
  const int64_t slot = block * a.block_size + pos % a.block_size;
  return (slot * a.nkv + g) * a.D;
}

// ---------------------------------------------------------------------------------------------
// Reference: scalar, double precision, two-pass softmax.
void attend_reference(const Args& a, int64_t t, int64_t g, std::vector<double>& sc) {
  const Item it = make_item(a, t);
  const int64_t n = it.hi - it.lo + 1;
  sc.resize(static_cast<size_t>(n));
  for (int64_t h = g * a.G; h < (g + 1) * a.G; ++h) {
    const float* qr = a.q + t * a.q_stride + h * a.D;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t off = kv_offset(a, it.b, it.lo + j, g);
      double s = 0;
      for (int64_t d = 0; d < a.D; ++d)
        s += static_cast<double>(qr[d]) * load_f32(a.kc, off + d, a.dtype);
      s *= a.scale;
      if (a.cap > 0) s = a.cap * std::tanh(s / a.cap);
      sc[j] = s;
      m = std::max(m, s);
    }
    double l = 0;
    for (int64_t j = 0; j < n; ++j) {
      sc[j] = std::exp(sc[j] - m);
      l += sc[j];
    }
    float* o = a.out + t * a.out_stride + h * a.D;
    for (int64_t d = 0; d < a.D; ++d) {
      double acc = 0;
      for (int64_t j = 0; j < n; ++j)
        acc += sc[j] * load_f32(a.vc, kv_offset(a, it.b, it.lo + j, g) + d, a.dtype);
      o[d] = static_cast<float>(acc / l);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Portable fast path: the tiled online softmax in plain f32 (used on CPUs without AVX-512).
struct Scratch {
  std::vector<float> k, v, acc, qv, m, l;
};

void attend_generic(const Args& a, int64_t t, int64_t g, Scratch& s) {
  const Item it = make_item(a, t);
  const int64_t D = a.D, G = a.G;
  s.k.resize(kTile * D);
  s.v.resize(kTile * D);
  s.acc.assign(G * D, 0.0f);
  s.m.assign(G, -std::numeric_limits<float>::infinity());
  s.l.assign(G, 0.0f);
  float sc[kTile], p[kTile];
  for (int64_t ts = it.lo / kTile * kTile; ts <= it.hi; ts += kTile) {
    const int64_t j0 = std::max(it.lo, ts) - ts, j1 = std::min(it.hi + 1, ts + kTile) - ts;
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t off = kv_offset(a, it.b, ts + j, g);
      for (int64_t d = 0; d < D; ++d) {
        s.k[j * D + d] = load_f32(a.kc, off + d, a.dtype);
        s.v[j * D + d] = load_f32(a.vc, off + d, a.dtype);
      }
    }
    for (int64_t hh = 0; hh < G; ++hh) {
      const float* qr = a.q + t * a.q_stride + (g * G + hh) * D;
      float mt = -std::numeric_limits<float>::infinity();
      for (int64_t j = j0; j < j1; ++j) {
        float acc8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t d = 0;
        for (; d + 8 <= D; d += 8)
          for (int e = 0; e < 8; ++e) acc8[e] += qr[d + e] * s.k[j * D + d + e];
        float x = ((acc8[0] + acc8[1]) + (acc8[2] + acc8[3])) +
                  ((acc8[4] + acc8[5]) + (acc8[6] + acc8[7]));
        for (; d < D; ++d) x += qr[d] * s.k[j * D + d];
        x *= a.scale;
        if (a.cap > 0) x = a.cap * std::tanh(x / a.cap);
        sc[j] = x;
        mt = std::max(mt, x);
      }
      const float mnew = std::max(s.m[hh], mt);
      const float corr = std::exp(s.m[hh] - mnew);
      float lt = 0;
      for (int64_t j = j0; j < j1; ++j) {
        p[j] = std::exp(sc[j] - mnew);
        lt += p[j];
      }
      s.l[hh] = s.l[hh] * corr + lt;
      s.m[hh] = mnew;
      float* acc = s.acc.data() + hh * D;
      for (int64_t d = 0; d < D; ++d) {
        float x = acc[d] * corr;
        for (int64_t j = j0; j < j1; ++j) x += p[j] * s.v[j * D + d];
        acc[d] = x;
      }
    }
  }
  for (int64_t hh = 0; hh < G; ++hh) {
    float* o = a.out + t * a.out_stride + (g * G + hh) * D;
    const float inv = 1.0f / s.l[hh];
    for (int64_t d = 0; d < D; ++d) o[d] = s.acc[hh * D + d] * inv;
  }
}

// ---------------------------------------------------------------------------------------------
// AVX-512 fast path.
#if VLLMX_X86
// exp(x) for x <= 0 mostly (Cephes polynomial, ~1 ulp); inputs below -103 give 0.
VLLMX_TARGET_AVX512 inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-103.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// Converts one cache row of D elements to f32, zero padded to Dp (a multiple of 16).
VLLMX_TARGET_AVX512 inline void load_row512(float* dst, const char* base, int64_t off,
                                            int64_t D, int dtype) {
  for (int64_t d = 0; d < D; d += 16) {
    const int64_t left = D - d;
    const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xffff)
                                   : static_cast<__mmask16>((1u << left) - 1);
    __m512 x;
    if (dtype == 1) {
      const __m256i h =
          _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(base) + off + d);
      x = _mm512_cvtph_ps(h);
    } else if (dtype == 30) {
      const __m256i h =
          _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(base) + off + d);
      x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      x = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(base) + off + d);
    }
    _mm512_storeu_ps(dst + d, x);
  }
}

VLLMX_TARGET_AVX512 void attend_avx512(const Args& a, int64_t t, int64_t g, Scratch& s) {
  const Item it = make_item(a, t);
  const int64_t D = a.D, G = a.G;
  const int64_t Dp = (D + 15) / 16 * 16, nc = Dp / 16;
  s.k.resize(kTile * Dp);
  s.v.resize(kTile * Dp);
  s.qv.assign(G * Dp, 0.0f);
  s.acc.assign(G * Dp, 0.0f);
  s.m.assign(G, -std::numeric_limits<float>::infinity());
  s.l.assign(G, 0.0f);
  for (int64_t hh = 0; hh < G; ++hh) {
    const float* qr = a.q + t * a.q_stride + (g * G + hh) * D;
    std::copy(qr, qr + D, s.qv.data() + hh * Dp);
  }
  float* kb = s.k.data();
  float* vb = s.v.data();
  alignas(64) float sc[kTile];
  alignas(64) float pv[kTile];
  for (int64_t ts = it.lo / kTile * kTile; ts <= it.hi; ts += kTile) {
    const int64_t j0 = std::max(it.lo, ts) - ts, j1 = std::min(it.hi + 1, ts + kTile) - ts;
    const __mmask16 valid = static_cast<__mmask16>(((1u << j1) - 1) & ~((1u << j0) - 1));
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t off = kv_offset(a, it.b, ts + j, g);
      load_row512(kb + j * Dp, a.kc, off, D, a.dtype);
      load_row512(vb + j * Dp, a.vc, off, D, a.dtype);
    }
    for (int64_t hh = 0; hh < G; ++hh) {
      const float* qr = s.qv.data() + hh * Dp;
      for (int64_t j = j0; j < j1; ++j) {
        const float* kr = kb + j * Dp;
        __m512 acc0 = _mm512_mul_ps(_mm512_loadu_ps(qr), _mm512_loadu_ps(kr));
        __m512 acc1 = _mm512_setzero_ps();
        int64_t c = 1;
        for (; c + 1 < nc; c += 2) {
          acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(qr + c * 16), _mm512_loadu_ps(kr + c * 16), acc1);
          acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(qr + c * 16 + 16),
                                 _mm512_loadu_ps(kr + c * 16 + 16), acc0);
        }
        if (c < nc)
          acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(qr + c * 16), _mm512_loadu_ps(kr + c * 16), acc1);
        sc[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
      }
      __m512 sv = _mm512_mul_ps(_mm512_maskz_loadu_ps(valid, sc), _mm512_set1_ps(a.scale));
      if (a.cap > 0) {
        _mm512_store_ps(sc, sv);
        for (int64_t j = j0; j < j1; ++j) sc[j] = a.cap * std::tanh(sc[j] / a.cap);
        sv = _mm512_load_ps(sc);
      }
      const float mt = _mm512_mask_reduce_max_ps(valid, sv);
      const float mold = s.m[hh];
      const float mnew = std::max(mold, mt);
      const float corr = mold == -std::numeric_limits<float>::infinity() ? 0.0f
                                                                       : std::exp(mold - mnew);
      const __m512 p = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(sv, _mm512_set1_ps(mnew))));
      s.l[hh] = s.l[hh] * corr + _mm512_reduce_add_ps(p);
      s.m[hh] = mnew;
      _mm512_store_ps(pv, p);
      float* acc = s.acc.data() + hh * Dp;
      const __m512 vcorr = _mm512_set1_ps(corr);
      for (int64_t c = 0; c < nc; ++c) {
        __m512 x = _mm512_mul_ps(_mm512_loadu_ps(acc + c * 16), vcorr);
        for (int64_t j = j0; j < j1; ++j)
          x = _mm512_fmadd_ps(_mm512_set1_ps(pv[j]), _mm512_loadu_ps(vb + j * Dp + c * 16), x);
        _mm512_storeu_ps(acc + c * 16, x);
      }
    }
  }
  for (int64_t hh = 0; hh < G; ++hh) {
    float* o = a.out + t * a.out_stride + (g * G + hh) * D;
    const __m512 inv = _mm512_set1_ps(1.0f / s.l[hh]);
    const float* acc = s.acc.data() + hh * Dp;
    for (int64_t d = 0; d < D; d += 16) {
      const int64_t left = D - d;
      const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xffff)
                                     : static_cast<__mmask16>((1u << left) - 1);
      _mm512_mask_storeu_ps(o + d, m, _mm512_mul_ps(_mm512_loadu_ps(acc + d), inv));
    }
  }
}
#endif

std::string i2s(int64_t v) { return std::to_string(v); }

}  // namespace

void paged_attention(const Tensor& out, const Tensor& q, const Tensor& key_cache,
                     const Tensor& value_cache, const Tensor& block_table,
                     const Tensor& query_start_loc, const Tensor& seq_lens, float scale,
                     int64_t sliding_window, float logits_soft_cap, bool reference) {
  check_dtype(q, DType::F32, kOp, "q");
  check_dtype(out, DType::F32, kOp, "out");
  check_ndim(q, 2, kOp, "q");
  check_ndim(out, 2, kOp, "out");
  check(out.shape[0] == q.shape[0] && out.shape[1] == q.shape[1], kOp,
        "out " + out.str() + " does not match q " + q.str());
  check_ndim(key_cache, 4, kOp, "key_cache");
  check_ndim(value_cache, 4, kOp, "value_cache");
  const DType dt = key_cache.dtype;
  check(dt == DType::F16 || dt == DType::BF16 || dt == DType::F32, kOp,
        "cache dtype must be f16, bf16 or f32, got key_cache " + key_cache.str());
  check(value_cache.dtype == dt, kOp,
        "value_cache " + value_cache.str() + " does not match key_cache " + key_cache.str());
  for (int d = 0; d < 4; ++d)
    check(value_cache.shape[d] == key_cache.shape[d], kOp,
          "value_cache " + value_cache.str() + " does not match key_cache " + key_cache.str());
  check_dtype(block_table, DType::I32, kOp, "block_table");
  check_ndim(block_table, 2, kOp, "block_table");
  check_dtype(query_start_loc, DType::I32, kOp, "query_start_loc");
  check_ndim(query_start_loc, 1, kOp, "query_start_loc");
  check_dtype(seq_lens, DType::I32, kOp, "seq_lens");
  check_ndim(seq_lens, 1, kOp, "seq_lens");

  const int64_t num_blocks = key_cache.shape[0], block_size = key_cache.shape[1];
  const int64_t nkv = key_cache.shape[2], D = key_cache.shape[3];
  check(block_size > 0 && nkv > 0 && D > 0 && D <= kMaxHeadSize, kOp,
        "bad cache shape " + key_cache.str() + " (head_size must be 1.." + i2s(kMaxHeadSize) +
            ")");
  const int64_t T = q.shape[0];
  check(q.shape[1] % D == 0 && q.shape[1] > 0, kOp,
        "q " + q.str() + " is not a whole number of heads of size " + i2s(D) + " (cache " +
            key_cache.str() + ")");
  const int64_t nq = q.shape[1] / D;
  check(nq % nkv == 0, kOp,
        "num query heads " + i2s(nq) + " (q " + q.str() + ") is not a multiple of num kv heads " +
            i2s(nkv) + " (cache " + key_cache.str() + ")");
  const int64_t B = seq_lens.shape[0];
  check(query_start_loc.shape[0] == B + 1, kOp,
        "query_start_loc " + query_start_loc.str() + " must have len(seq_lens) + 1 entries (" +
            "seq_lens " + seq_lens.str() + ")");
  check(block_table.shape[0] == B, kOp,
        "block_table " + block_table.str() + " must have one row per sequence (seq_lens " +
            seq_lens.str() + ")");
  check(std::isfinite(scale), kOp, "scale must be finite");
  check(std::isfinite(logits_soft_cap), kOp, "logits_soft_cap must be finite");
  if (T == 0 && B == 0) return;
  const int32_t* qsl = query_start_loc.ptr<int32_t>();
  const int32_t* sl = seq_lens.ptr<int32_t>();
  const int32_t* bt = block_table.ptr<int32_t>();
  const int64_t max_blocks = block_table.shape[1];
  check(qsl[0] == 0, kOp, "query_start_loc[0] must be 0, got " + i2s(qsl[0]));
  check(qsl[B] == T, kOp,
        "query_start_loc[-1] = " + i2s(qsl[B]) + " must equal the number of query rows " +
            i2s(T) + " (q " + q.str() + ")");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = static_cast<int64_t>(qsl[b + 1]) - qsl[b];
    check(q_len >= 0, kOp, "query_start_loc must be non-decreasing (at index " + i2s(b) + ")");
    const int64_t len = sl[b];
    check(len >= q_len, kOp,
          "seq_lens[" + i2s(b) + "] = " + i2s(len) + " is smaller than its " + i2s(q_len) +
              " queries");
    if (q_len == 0) continue;
    const int64_t nblk = (len + block_size - 1) / block_size;
    check(nblk <= max_blocks, kOp,
          "block_table " + block_table.str() + " is too narrow for seq_lens[" + i2s(b) +
              "] = " + i2s(len) + " with block_size " + i2s(block_size));
    // Only the blocks that some query of this sequence can see are read.
    const int64_t first_pos = len - q_len;
    const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, first_pos - sliding_window + 1)
                                          : 0;
    for (int64_t k = lo / block_size; k < nblk; ++k) {
      const int64_t id = bt[b * block_table.stride[0] + k];
      check(id >= 0 && id < num_blocks, kOp,
            "block_table[" + i2s(b) + ", " + i2s(k) + "] = " + i2s(id) +
                " is out of range for a cache of " + i2s(num_blocks) + " blocks " +
                key_cache.str());
    }
  }
  if (T == 0) return;

  Args a;
  a.q = q.ptr<float>();
  a.out = out.ptr<float>();
  a.kc = static_cast<const char*>(key_cache.data);
  a.vc = static_cast<const char*>(value_cache.data);
  a.dtype = static_cast<int>(dt);
  a.esize = dt == DType::F32 ? 4 : 2;
  a.block_size = block_size;
  a.nkv = nkv;
  a.D = D;
  a.nq = nq;
  a.G = nq / nkv;
  a.bt = bt;
  a.bt_stride = block_table.stride[0];
  a.qsl = qsl;
  a.seq_lens = sl;
  a.B = B;
  a.scale = scale;
  a.window = sliding_window;
  a.cap = logits_soft_cap > 0 ? logits_soft_cap : 0.0f;
  a.q_stride = q.stride[0];
  a.out_stride = out.stride[0];

  const int64_t items = T * nkv;
  int path = 0;  // 0 generic, 1 avx512, 2 reference
  if (reference) {
    path = 2;
  } else {
#if VLLMX_X86 && !defined(VLLMX_TEST_NO_AVX512)
    if (cpu_features().avx512) path = 1;
#endif
  }
#pragma omp parallel
  {
    Scratch s;
    std::vector<double> sc;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) {
      const int64_t t = i / nkv, g = i % nkv;
      if (path == 2) {
        attend_reference(a, t, g, sc);
#if VLLMX_X86
      } else if (path == 1) {
        attend_avx512(a, t, g, s);
#endif
      } else {
        attend_generic(a, t, g, s);
      }
    }
  }
}

}  // namespace vllmx
