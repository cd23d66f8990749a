// sample: one token per row of logits, rows independent and run in parallel; and
// compute_logprobs (at the end of the file), which shares the row kernels.
//
// Per row b:
//   temperature == 0 -> greedy: argmax, lowest index on ties (NaN logits are ignored); the
//                       row's generator is NOT advanced.
//   otherwise (vLLM V1 order) x = logits / temperature; min_p drops tokens whose probability is
//   below min_p * max probability; top_k keeps the k most probable (ties broken by lower index);
//   top_p keeps the smallest set of most probable tokens whose cumulative probability (under the
//   min_p/top_k-filtered distribution) is >= top_p, at least one; then one draw by inverse CDF
//   over the kept tokens in index order, using exactly one 64-bit output of the row's generator.
//   NaN logits are never drawn; a row without a finite maximum falls back to greedy. A random
//   row (temperature > 0) always takes its one draw, fallback or not, so that its generator
//   after a step is known without the logits (the engine advances it on the host when it
//   schedules ahead of the step's tokens).
//
// Generator: xoroshiro128++ (Blackman & Vigna), state = rng_state[b] (two u64 words, advanced in
// place). Seed it with two splitmix64 outputs of the request seed; an all-zero state (invalid for
// xoroshiro) is replaced by the splitmix64 expansion of 0. u = (next() >> 11) * 2^-53 in [0, 1).
// A row's draw depends only on its own logits, parameters and state, never on the batch.
//
// out_logprobs[b] (optional) = log_softmax(original logits[b])[chosen]. The logits are left
// unmodified (a per-thread scratch row holds the weights).
//
// Fast path: vectorised (AVX-512) max / exp / sums, and for top_k / top_p a partial selection
// (std::nth_element, O(V)) of the candidates, growing geometrically for top_p: no full sort of
// the vocabulary. Reference twin: scalar double precision with a full sort.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif
// GCC 12 false positive on the _mm512_undefined_* inside the intrinsic headers (PR 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "core/cpu_features.h"
#include "sampling/rng.h"
#include "core/simd_math.h"
#include "core/op_table.h"

namespace vllmx {

namespace {

constexpr const char* kOp = "sample";
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// RNG
using rng::uniform01;

// ---------------------------------------------------------------------------------------------
// Row kernels (scalar / AVX-512).
struct Kernels {
  float (*max)(const float* x, int64_t n);                         // NaN ignored; -inf if none
  int64_t (*first_eq)(const float* x, int64_t n, float v);         // first i with x[i] == v
  double (*exp_sum)(const float* x, int64_t n, float m);           // sum exp(x - m)
  double (*exp_store)(float* w, const float* x, int64_t n, float t, float m, float min_p);
  int64_t (*pick)(const float* w, int64_t n, double target);       // inverse CDF, -1 if none
  int64_t (*next_above)(const float* w, int64_t i, int64_t n, float thr);  // first j >= i, w > thr
  int64_t (*count_above)(const float* x, int64_t n, float thr);            // #{i: x[i] > thr}
};

float max_scalar(const float* x, int64_t n) {
  float m = -kInf;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > m) m = x[i];
  return m;
}
int64_t first_eq_scalar(const float* x, int64_t n, float v) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] == v) return i;
  return 0;
}
double exp_sum_scalar(const float* x, int64_t n, float m) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] == x[i]) s += std::exp(x[i] - m);
  return s;
}
// w[i] = exp(x[i] / t - m), 0 where below min_p (or NaN); returns the sum.
double exp_store_scalar(float* w, const float* x, int64_t n, float t, float m, float min_p) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    float e = std::exp(x[i] / t - m);
    if (!(e >= min_p) || e == 0.0f) e = 0.0f;  // also catches NaN
    w[i] = e;
    s += e;
  }
  return s;
}
int64_t pick_scalar(const float* w, int64_t n, double target) {
  double cum = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (w[i] > 0) {
      cum += w[i];
      last = i;
      if (cum > target) return i;
    }
  }
  return last;
}

int64_t next_above_scalar(const float* w, int64_t i, int64_t n, float thr) {
  for (; i < n; ++i)
    if (w[i] > thr) return i;
  return n;
}
int64_t count_above_scalar(const float* x, int64_t n, float thr) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += x[i] > thr;
  return c;
}

#if VLLMX_X86
// exp(x) for x <= 0, and exactly 0 below kExpLo. exp512 would make a subnormal there, or
// underflow through one, and on Intel each such vector is a microcode assist: a grammar-masked
// row (-inf but for the allowed tokens) took 8x as long as a free one (32 x 49152 logits'
// greedy log-probs 4.1 against 0.53 ms). What is dropped is below 2^-126 of the row's maximum,
// whose own term is 1, so no sum or draw changes.
constexpr float kExpLo = -87.0f;
VLLMX_TARGET_AVX512 inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}
VLLMX_TARGET_AVX512 inline __m512d sum16_pd(__m512 v) {
  return _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)),
                       _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
VLLMX_TARGET_AVX512 inline __m512 exp_or_zero(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLo), _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(keep, exp512(x, kExpLo));
}
VLLMX_TARGET_AVX512 float max_avx512(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-kInf);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-kInf), tail_mask(n - i), x + i);
    m = _mm512_max_ps(v, m);  // NaN in v -> keeps m
  }
  return _mm512_reduce_max_ps(m);
}
VLLMX_TARGET_AVX512 int64_t first_eq_avx512(const float* x, int64_t n, float v) {
  const __m512 vv = _mm512_set1_ps(v);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = _mm512_mask_cmp_ps_mask(tail_mask(n - i), _mm512_maskz_loadu_ps(tail_mask(n - i), x + i), vv, _CMP_EQ_OQ);
    if (k) return i + __builtin_ctz(static_cast<unsigned>(k));
  }
  return 0;
}
VLLMX_TARGET_AVX512 double exp_sum_avx512(const float* x, int64_t n, float m) {
  __m512d s = _mm512_setzero_pd();
  const __m512 vm = _mm512_set1_ps(m);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-kInf), k, x + i);
    s = _mm512_add_pd(s, sum16_pd(exp_or_zero(_mm512_sub_ps(v, vm))));
  }
  return _mm512_reduce_add_pd(s);
}
VLLMX_TARGET_AVX512 double exp_store_avx512(float* w, const float* x, int64_t n, float t, float m,
                                            float min_p) {
  __m512d s = _mm512_setzero_pd();
  const __m512 vm = _mm512_set1_ps(m), vt = _mm512_set1_ps(t), vp = _mm512_set1_ps(min_p);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-kInf), k, x + i);
    __m512 e = exp_or_zero(_mm512_sub_ps(_mm512_div_ps(v, vt), vm));
    e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(e, vp, _CMP_GE_OQ), e);
    _mm512_mask_storeu_ps(w + i, k, e);
    s = _mm512_add_pd(s, sum16_pd(e));
  }
  return _mm512_reduce_add_pd(s);
}
VLLMX_TARGET_AVX512 int64_t next_above_avx512(const float* w, int64_t i, int64_t n, float thr) {
  const __m512 vt = _mm512_set1_ps(thr);
  for (; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, w + i), vt, _CMP_GT_OQ);
    if (hit) return i + __builtin_ctz(static_cast<unsigned>(hit));
  }
  return n;
}
VLLMX_TARGET_AVX512 int64_t count_above_avx512(const float* x, int64_t n, float thr) {
  const __m512 vt = _mm512_set1_ps(thr);
  int64_t c = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    c += __builtin_popcount(
        _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), vt, _CMP_GT_OQ));
  }
  return c;
}
VLLMX_TARGET_AVX512 int64_t pick_avx512(const float* w, int64_t n, double target) {
  double cum = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(k, w + i);
    const __mmask16 pos = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
    if (!pos) continue;
    const double cs = _mm512_reduce_add_pd(sum16_pd(v));
    if (cum + cs > target) {
      const int64_t e = std::min<int64_t>(n, i + 16);
      for (int64_t j = i; j < e; ++j) {
        if (w[j] > 0) {
          cum += w[j];
          last = j;
          if (cum > target) return j;
        }
      }
    } else {
      cum += cs;
      last = i + 31 - __builtin_clz(static_cast<unsigned>(pos));
    }
  }
  return last;
}
#endif

Kernels pick_kernels() {
#if VLLMX_X86
  if (simd_level() >= 2)
    return {max_avx512,  first_eq_avx512,   exp_sum_avx512,    exp_store_avx512,
            pick_avx512, next_above_avx512, count_above_avx512};
#endif
  return {max_scalar,  first_eq_scalar,   exp_sum_scalar,   exp_store_scalar,
          pick_scalar, next_above_scalar, count_above_scalar};
}

struct RowParams {
  float temperature, top_p, min_p;
  int32_t top_k;
};

// Candidate order: more probable first, lower index first on ties.
struct Cand {
  float w;
  int32_t i;
};
inline bool before(const Cand& a, const Cand& b) { return a.w > b.w || (a.w == b.w && a.i < b.i); }

// Finds the top_p cut among n candidates (weights wv, token ids iv or, if null, the position):
// the least probable member of the smallest most-probable set whose mass reaches target. A
// histogram of the mass over the top 16 bits of the (positive) float weights finds the boundary
// bucket in O(n); only that bucket is sorted. kept_mass gets the mass of the kept set.
Cand top_p_cut(const float* wv, const int32_t* iv, size_t n, double target, double& kept_mass,
               std::vector<double>& hist, std::vector<Cand>& tmp) {
  constexpr int kBuckets = 0x3F81;  // keys of floats in (0, 1]
  hist.assign(kBuckets, 0.0);
  auto key = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return static_cast<int>(u >> 16);
  };
  int lowest = kBuckets;
  for (size_t j = 0; j < n; ++j)
    if (wv[j] > 0) {
      const int kk = key(wv[j]);
      hist[kk] += wv[j];
      lowest = std::min(lowest, kk);
    }
  double cum = 0;
  int kb = lowest;
  for (int kk = kBuckets - 1; kk >= lowest; --kk) {
    if (cum + hist[kk] >= target) {
      kb = kk;
      break;
    }
    cum += hist[kk];
  }
  if (kb == lowest) {  // (also the rounding fallback) recompute the mass above the bucket
    cum = 0;
    for (int kk = kBuckets - 1; kk > kb; --kk) cum += hist[kk];
  }
  tmp.clear();
  for (size_t j = 0; j < n; ++j)
    if (wv[j] > 0 && key(wv[j]) == kb)
      tmp.push_back({wv[j], iv ? iv[j] : static_cast<int32_t>(j)});
  std::sort(tmp.begin(), tmp.end(), before);
  Cand cut = tmp.back();
  for (const Cand& c : tmp) {
    cum += c.w;
    if (cum >= target) {
      cut = c;
      break;
    }
  }
  kept_mass = cum;
  return cut;
}

struct RowScratch {
  std::vector<float> w;
  std::vector<Cand> c, tmp;
  std::vector<float> cw;
  std::vector<int32_t> ci;
  std::vector<double> hist;
};

// Fast row. Returns the chosen token.
int64_t sample_row_fast(const Kernels& K, const float* l, int64_t V, const RowParams& p,
                        uint64_t* rng, RowScratch& s) {
  const float lmax = K.max(l, V);
  if (p.temperature == 0.0f) return K.first_eq(l, V, lmax);
  if (!(std::fabs(lmax) < kInf)) {
    uniform01(rng);  // the row's one draw, unused
    return K.first_eq(l, V, lmax);
  }
  const float t = p.temperature;
  const float m = lmax / t;
  s.w.resize(static_cast<size_t>(V));
  float* w = s.w.data();
  // w = exp(x - max) with min_p applied (the max token has weight exactly 1).
  const double z = K.exp_store(w, l, V, t, m, p.min_p);
  const double u = uniform01(rng);
  bool use_k = p.top_k > 0 && p.top_k < V;
  const bool use_p = p.top_p < 1.0f;
  if (!use_k && !use_p) return K.pick(w, V, u * z);

  std::vector<Cand>& c = s.c;
  c.clear();
  double zk = z;
  Cand cut{0.0f, -1};  // no cut yet: every positive weight is kept
  if (use_k) {
    const size_t k = static_cast<size_t>(p.top_k);
    if (k <= 1024) {
      // Streaming top-k: a heap whose top is the worst-ranked member. Later tokens only enter
      // with a strictly larger weight (on a tie the earlier index ranks first).
      int64_t i = 0;
      for (; i < V && c.size() < k; ++i)
        if (w[i] > 0) c.push_back({w[i], static_cast<int32_t>(i)});
      if (c.size() < k) {
        use_k = false;
      } else {
        std::make_heap(c.begin(), c.end(), before);
        float thr = c.front().w;
        for (i = K.next_above(w, i, V, thr); i < V; i = K.next_above(w, i + 1, V, thr)) {
          std::pop_heap(c.begin(), c.end(), before);
          c.back() = {w[i], static_cast<int32_t>(i)};
          std::push_heap(c.begin(), c.end(), before);
          thr = c.front().w;
        }
      }
    } else {
      for (int64_t i = 0; i < V; ++i)
        if (w[i] > 0) c.push_back({w[i], static_cast<int32_t>(i)});
      if (c.size() <= k) {
        use_k = false;
      } else {
        std::nth_element(c.begin(), c.begin() + (k - 1), c.end(), before);
        c.resize(k);
      }
    }
    if (use_k) {
      zk = 0;
      cut = c[0];
      for (const Cand& x : c) {
        zk += x.w;
        if (before(cut, x)) cut = x;
      }
    } else {
      c.clear();
    }
  }
  if (use_p) {
    const double target = static_cast<double>(p.top_p) * zk;
    if (use_k && c.size() <= 4096) {
      std::sort(c.begin(), c.end(), before);
      double cum = 0;
      for (const Cand& x : c) {
        cum += x.w;
        if (cum >= target) {
          cut = x;
          break;
        }
      }
      zk = std::min(cum, zk);
    } else if (use_k) {
      s.cw.resize(c.size());
      s.ci.resize(c.size());
      for (size_t j = 0; j < c.size(); ++j) {
        s.cw[j] = c[j].w;
        s.ci[j] = c[j].i;
      }
      cut = top_p_cut(s.cw.data(), s.ci.data(), c.size(), target, zk, s.hist, s.tmp);
    } else {
      cut = top_p_cut(w, nullptr, static_cast<size_t>(V), target, zk, s.hist, s.tmp);
    }
  }
  if (cut.i < 0) return K.pick(w, V, u * zk);
  // Inverse CDF over the kept set (ranked at or before the cut), in index order.
  const double target = u * zk;
  double cum = 0;
  int64_t last = cut.i;
  for (int64_t i = 0; i < V; ++i) {
    if (w[i] > 0 && (w[i] > cut.w || (w[i] == cut.w && i <= cut.i))) {
      cum += w[i];
      last = i;
      if (cum > target) return i;
    }
  }
  return last;
}

// Reference row: double precision, full sort.
int64_t sample_row_reference(const float* l, int64_t V, const RowParams& p, uint64_t* rng) {
  float lmax = -kInf;
  int64_t arg = 0;
  bool found = false;
  for (int64_t i = 0; i < V; ++i)
    if (l[i] > lmax || (!found && l[i] == lmax)) {
      lmax = l[i];
      arg = i;
      found = true;
    }
  if (p.temperature == 0.0f) return arg;
  if (!(std::fabs(lmax) < kInf)) {
    uniform01(rng);  // the row's one draw, unused
    return arg;
  }
  const float t = p.temperature;
  const double m = static_cast<double>(lmax / t);
  std::vector<double> pr(static_cast<size_t>(V));
  std::vector<int32_t> idx;
  for (int64_t i = 0; i < V; ++i) {
    const float x = l[i] / t;
    double e = x == x ? std::exp(static_cast<double>(x) - m) : 0.0;
    if (e < p.min_p) e = 0;
    pr[i] = e;
    if (e > 0) idx.push_back(static_cast<int32_t>(i));
  }
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return pr[a] > pr[b] || (pr[a] == pr[b] && a < b);
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < idx.size()) idx.resize(p.top_k);
  if (p.top_p < 1.0f) {
    double z = 0;
    for (int32_t i : idx) z += pr[i];
    double cum = 0;
    size_t keep = 0;
    while (keep < idx.size()) {
      cum += pr[idx[keep]];
      ++keep;
      if (cum >= static_cast<double>(p.top_p) * z) break;
    }
    idx.resize(keep);
  }
  std::vector<char> kept(static_cast<size_t>(V), 0);
  double z = 0;
  for (int32_t i : idx) {
    kept[i] = 1;
    z += pr[i];
  }
  const double target = uniform01(rng) * z;
  double cum = 0;
  int64_t last = idx.empty() ? arg : idx.back();
  for (int64_t i = 0; i < V; ++i) {
    if (!kept[i]) continue;
    cum += pr[i];
    last = i;
    if (cum > target) return i;
  }
  return last;
}

}  // namespace

void sample(const Tensor& out_ids, const Tensor& out_logprobs, const Tensor& logits,
            const Tensor& temperature, const Tensor& top_k, const Tensor& top_p,
            const Tensor& min_p, const Tensor& rng_state, bool reference) {
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs; here the
  // per-row values, which the CPU reads where they are.
  const int64_t B = logits.shape[0], V = logits.shape[1];
  if (B == 0) return;
  const float* tp = temperature.ptr<float>();
  const int32_t* kp = top_k.ptr<int32_t>();
  const float* pp = top_p.ptr<float>();
  const float* mp = min_p.ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    VLLMX_CHECK(std::isfinite(tp[b]) && tp[b] >= 0, kOp,
          "temperature[" + std::to_string(b) + "] = " + std::to_string(tp[b]) +
              " must be finite and >= 0");
    VLLMX_CHECK(pp[b] > 0 && pp[b] <= 1, kOp,
          "top_p[" + std::to_string(b) + "] = " + std::to_string(pp[b]) + " must be in (0, 1]");
    VLLMX_CHECK(mp[b] >= 0 && mp[b] <= 1, kOp,
          "min_p[" + std::to_string(b) + "] = " + std::to_string(mp[b]) + " must be in [0, 1]");
  }
  const float* lg = logits.ptr<float>();
  const int64_t ls = logits.stride[0];
  int32_t* ids = out_ids.ptr<int32_t>();
  float* lps = out_logprobs.defined() ? out_logprobs.ptr<float>() : nullptr;
  uint64_t* rng = rng_state.ptr<uint64_t>();
  const Kernels K = pick_kernels();
#pragma omp parallel if (B > 1)
  {
    RowScratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      const float* l = lg + b * ls;
      const RowParams p{tp[b], pp[b], mp[b], kp[b]};
      int64_t tok;
      if (reference)
        tok = sample_row_reference(l, V, p, rng + 2 * b);
      else
        tok = sample_row_fast(K, l, V, p, rng + 2 * b, scratch);
      ids[b] = static_cast<int32_t>(tok);
      if (lps) {
        double lp;
        if (reference) {
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t i = 0; i < V; ++i)
            if (l[i] > m) m = l[i];
          double s = 0;
          for (int64_t i = 0; i < V; ++i)
            if (l[i] == l[i]) s += std::exp(l[i] - m);
          lp = l[tok] - (m + std::log(s));
        } else {
          const float m = K.max(l, V);
          lp = l[tok] - (m + std::log(K.exp_sum(l, V, m)));
        }
        lps[b] = static_cast<float>(lp);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// compute_logprobs: log_softmax of the raw logits, the given token's log-prob and rank, and the
// top-k. Fast path: vectorised max / exp-sum / count, streaming heap (or partial selection) for
// the top-k. Reference twin: double precision, full sort.
namespace {

constexpr const char* kLpOp = "compute_logprobs";

inline float nan_to_ninf(float x) { return x == x ? x : -kInf; }

void top_k_fast(const Kernels& K, const float* l, int64_t V, int64_t k, std::vector<Cand>& c) {
  c.clear();
  if (k <= 1024) {
    int64_t i = 0;
    for (; i < V && static_cast<int64_t>(c.size()) < k; ++i)
      c.push_back({nan_to_ninf(l[i]), static_cast<int32_t>(i)});
    std::make_heap(c.begin(), c.end(), before);  // front: the worst-ranked member
    float thr = c.front().w;
    for (i = K.next_above(l, i, V, thr); i < V; i = K.next_above(l, i + 1, V, thr)) {
      std::pop_heap(c.begin(), c.end(), before);
      c.back() = {l[i], static_cast<int32_t>(i)};
      std::push_heap(c.begin(), c.end(), before);
      thr = c.front().w;
    }
  } else {
    c.resize(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) c[i] = {nan_to_ninf(l[i]), static_cast<int32_t>(i)};
    if (k < V) std::nth_element(c.begin(), c.begin() + (k - 1), c.end(), before);
    c.resize(static_cast<size_t>(k));
  }
  std::sort(c.begin(), c.end(), before);
}

}  // namespace

void compute_logprobs(const Tensor& out_token_logprob, const Tensor& out_rank,
                      const Tensor& out_top_ids, const Tensor& out_top_logprobs,
                      const Tensor& logits, const Tensor& token_ids, const Tensor& num_logprobs,
                      bool reference) {
  // The shapes are the op's contract (csrc/ops.cpp); here the host-side contents.
  const int64_t N = logits.shape[0], V = logits.shape[1];
  const int64_t Kmax = out_top_ids.defined() ? out_top_ids.shape[1] : 0;
  const int32_t* tok = token_ids.ptr<int32_t>();
  const int32_t* nl = num_logprobs.ptr<int32_t>();
  for (int64_t n = 0; n < N; ++n) {
    VLLMX_CHECK(tok[n] >= 0 && tok[n] < V, kLpOp,
          "token_ids[" + std::to_string(n) + "] = " + std::to_string(tok[n]) +
              " is outside the vocabulary of " + std::to_string(V));
    VLLMX_CHECK(std::min<int64_t>(nl[n], V) <= Kmax, kLpOp,
          "num_logprobs[" + std::to_string(n) + "] = " + std::to_string(nl[n]) +
              " exceeds the K of the top arrays (" + std::to_string(Kmax) + ")");
  }
  if (N == 0) return;
  const float* lg = logits.ptr<float>();
  const int64_t ls = logits.stride[0];
  float* out_lp = out_token_logprob.ptr<float>();
  int32_t* out_r = out_rank.ptr<int32_t>();
  int32_t* top_ids = Kmax ? out_top_ids.ptr<int32_t>() : nullptr;
  float* top_lps = Kmax ? out_top_logprobs.ptr<float>() : nullptr;
  const Kernels K = pick_kernels();
#pragma omp parallel if (N > 1)
  {
    std::vector<Cand> c;
    std::vector<int32_t> order;
#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < N; ++n) {
      const float* l = lg + n * ls;
      const int64_t k = std::min<int64_t>(nl[n], V);
      const float x = l[tok[n]];
      double lse;
      if (reference) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < V; ++i)
          if (l[i] > m) m = l[i];
        double s = 0;
        for (int64_t i = 0; i < V; ++i)
          if (l[i] == l[i]) s += std::exp(l[i] - m);
        lse = m + std::log(s);
      } else {
        const float m = K.max(l, V);
        lse = m + std::log(K.exp_sum(l, V, m));
      }
      out_lp[n] = static_cast<float>(x - lse);
      if (k < 0) {
        out_r[n] = 0;
      } else if (reference) {
        int64_t above = 0;
        for (int64_t i = 0; i < V; ++i) above += l[i] > x;
        out_r[n] = static_cast<int32_t>(1 + above);
      } else {
        out_r[n] = static_cast<int32_t>(1 + K.count_above(l, V, x));
      }
      int64_t filled = 0;
      if (k > 0) {
        if (reference) {
          order.resize(static_cast<size_t>(V));
          for (int64_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return nan_to_ninf(l[a]) > nan_to_ninf(l[b]);
          });
          for (; filled < k; ++filled) {
            top_ids[n * Kmax + filled] = order[filled];
            top_lps[n * Kmax + filled] = static_cast<float>(l[order[filled]] - lse);
          }
        } else {
          top_k_fast(K, l, V, k, c);
          for (; filled < k; ++filled) {
            top_ids[n * Kmax + filled] = c[filled].i;
            top_lps[n * Kmax + filled] = static_cast<float>(l[c[filled].i] - lse);
          }
        }
      }
      for (int64_t j = filled; j < Kmax; ++j) {
        top_ids[n * Kmax + j] = -1;
        top_lps[n * Kmax + j] = -kInf;
      }
    }
  }
}

VLLMX_KERNEL(sample, kCPU, sample);
VLLMX_KERNEL(compute_logprobs, kCPU, compute_logprobs);

}  // namespace vllmx
