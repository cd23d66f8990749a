// gated_delta_rule on the CPU (Gated DeltaNet's linear attention: Qwen3-Next, Qwen3.5). Contract
// in csrc/ops.def. Per sequence and value head the recurrence runs token by token over the
// head's [dk, dv] state, which stays in cache (64 KiB at dk = dv = 128): decay, read the
// memory for the key, write the corrected value, read for the query. A chunked form (FLA's)
// regroups the same recurrence for matrix units; on the CPU the token-by-token form keeps each
// token's arithmetic fixed (batch invariant).
#include "core/kernel_pragmas.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/cpu_features.h"
#include "core/op_table.h"
#include "linear_attn/spec_slots.h"

namespace vllmx {

namespace {

template <typename F>
F softplus(F x) {
  return x > F(20) ? x : std::log1p(std::exp(x));  // torch's threshold 20
}

// x / sqrt(sum x^2 + 1e-6) * scale into dst (FLA's l2norm, as transformers writes it).
template <typename F>
void l2norm(const float* x, int64_t n, F scale, F* dst) {
  F ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += F(x[i]) * F(x[i]);
  const F inv = F(1) / std::sqrt(ss + F(1e-6)) * scale;
  for (int64_t i = 0; i < n; ++i) dst[i] = F(x[i]) * inv;
}

struct Dims {
  int64_t hk, hv, dk, dv;
};

// One column block of w state columns (S [dk, w], rows ld apart) through the sequence's n tokens:
// decay, read the memory for the key, write the corrected value, read for the query. vt / o:
// the block's first v and out columns of the first token (rows vs / os apart). After a token
// whose spec slot is set, the block goes to that slot's state (saved: the block's first column
// in slot 0's, slots `stride` apart, rows dv apart). Also inlined into an AVX2 clone (below),
// whose vectorized column loops round as this scalar form does (no FMA contraction:
// kernel_pragmas.h).
template <typename F>
__attribute__((always_inline)) inline void block_tokens(
    int64_t dk, int64_t w, int64_t n, const F* kn, const F* qn, const F* decay, const F* beta,
    F* S, int64_t ld, F* mem, F* acc, const float* vt, int64_t vs, float* o, int64_t os,
    const int32_t* spec, float* saved, int64_t stride, int64_t dv) {
  for (int64_t t = 0; t < n; ++t) {
    const F* kt = kn + t * dk;
    const F* qt = qn + t * dk;
    const F dec = decay[t];
    std::fill(mem, mem + w, F(0));
    for (int64_t i = 0; i < dk; ++i) {
      F* row = S + i * ld;
      for (int64_t j = 0; j < w; ++j) {
        row[j] *= dec;
        mem[j] += row[j] * kt[i];
      }
    }
    const float* vr = vt + t * vs;
    for (int64_t j = 0; j < w; ++j) mem[j] = (F(vr[j]) - mem[j]) * beta[t];  // the delta
    std::fill(acc, acc + w, F(0));
    for (int64_t i = 0; i < dk; ++i) {
      F* row = S + i * ld;
      for (int64_t j = 0; j < w; ++j) {
        row[j] += kt[i] * mem[j];
        acc[j] += row[j] * qt[i];
      }
    }
    float* orow = o + t * os;
    for (int64_t j = 0; j < w; ++j) orow[j] = static_cast<float>(acc[j]);
    if (spec != nullptr && spec[t] >= 0) {
      float* dst = saved + spec[t] * stride;
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < w; ++j) dst[i * dv + j] = static_cast<float>(S[i * ld + j]);
    }
  }
}

#if VLLMX_X86
#include <immintrin.h>

// block_tokens for a block of 64 columns in AVX-512 registers: the memory and output sums of a
// token stay in four registers through its dk rows (the compiled loop reloaded and stored them
// a row, ~3.9 us a token and head of 128 x 128 on the 2-core EPYC). The same operations in the
// same order as block_tokens, so the same bits.
VLLMX_TARGET_AVX512 void block64_avx512(int64_t dk, int64_t n, const float* kn, const float* qn,
                                        const float* decay, const float* beta, float* S,
                                        int64_t ld, const float* vt, int64_t vs, float* o,
                                        int64_t os, const int32_t* spec, float* saved,
                                        int64_t stride, int64_t dv) {
  for (int64_t t = 0; t < n; ++t) {
    const float* kt = kn + t * dk;
    const float* qt = qn + t * dk;
    const __m512 dec = _mm512_set1_ps(decay[t]);
    __m512 m[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
    for (int64_t i = 0; i < dk; ++i) {
      float* row = S + i * ld;
      const __m512 kk = _mm512_set1_ps(kt[i]);
      for (int c = 0; c < 4; ++c) {
        const __m512 r = _mm512_mul_ps(_mm512_loadu_ps(row + 16 * c), dec);
        _mm512_storeu_ps(row + 16 * c, r);
        m[c] = _mm512_add_ps(m[c], _mm512_mul_ps(r, kk));
      }
    }
    const __m512 bt = _mm512_set1_ps(beta[t]);
    const float* vr = vt + t * vs;
    for (int c = 0; c < 4; ++c)  // the delta
      m[c] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(vr + 16 * c), m[c]), bt);
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
    for (int64_t i = 0; i < dk; ++i) {
      float* row = S + i * ld;
      const __m512 kk = _mm512_set1_ps(kt[i]), qq = _mm512_set1_ps(qt[i]);
      for (int c = 0; c < 4; ++c) {
        const __m512 r = _mm512_add_ps(_mm512_loadu_ps(row + 16 * c), _mm512_mul_ps(kk, m[c]));
        _mm512_storeu_ps(row + 16 * c, r);
        a[c] = _mm512_add_ps(a[c], _mm512_mul_ps(r, qq));
      }
    }
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + t * os + 16 * c, a[c]);
    if (spec != nullptr && spec[t] >= 0) {
      float* dst = saved + spec[t] * stride;
      for (int64_t i = 0; i < dk; ++i)
        for (int c = 0; c < 4; ++c)
          _mm512_storeu_ps(dst + i * dv + 16 * c, _mm512_loadu_ps(S + i * ld + 16 * c));
    }
  }
}

VLLMX_TARGET_AVX2 void block_tokens_avx2(int64_t dk, int64_t w, int64_t n, const float* kn,
                                         const float* qn, const float* decay,
                                         const float* beta, float* S, int64_t ld, float* mem,
                                         float* acc, const float* vt, int64_t vs, float* o,
                                         int64_t os, const int32_t* spec, float* saved,
                                         int64_t stride, int64_t dv) {
  block_tokens<float>(dk, w, n, kn, qn, decay, beta, S, ld, mem, acc, vt, vs, o, os, spec, saved,
                      stride, dv);
}
#endif

// A block of w columns in f32 on the best path the CPU has (the generic loop: the
// baseline's, or compiled for AVX2).
void block_tokens_f32(int64_t dk, int64_t w, int64_t n, const float* kn, const float* qn,
                      const float* decay, const float* beta, float* S, int64_t ld, float* mem,
                      float* acc, const float* vt, int64_t vs, float* o, int64_t os,
                      const int32_t* spec, float* saved, int64_t stride, int64_t dv) {
#if VLLMX_X86
  static const int level = simd_level();
  if (level >= 2 && w == 64)
    return block64_avx512(dk, n, kn, qn, decay, beta, S, ld, vt, vs, o, os, spec, saved, stride,
                          dv);
  if (level >= 1)
    return block_tokens_avx2(dk, w, n, kn, qn, decay, beta, S, ld, mem, acc, vt, vs, o, os, spec,
                             saved, stride, dv);
#endif
  block_tokens<float>(dk, w, n, kn, qn, decay, beta, S, ld, mem, acc, vt, vs, o, os, spec, saved,
                      stride, dv);
}

// State columns a pass keeps: the recurrence never mixes S's columns, so a head runs its
// sequence's tokens over one block of columns after another, in place in the request's slot,
// the block (dk x kCols: 32 KiB at dk = 128) staying in L1 through every token, where the
// whole [dk, dv] state (64 KiB) went through L2 twice a token. Each element's arithmetic and
// summation order are unchanged.
constexpr int64_t kCols = 64;
constexpr int64_t kInPlaceTokens = 8;

template <typename F>
void run_head(const Dims& d, int64_t h, int64_t t0, int64_t n, const Tensor& q, const Tensor& k,
              const Tensor& v, const Tensor& a, const Tensor& b, float a_log, float dt_bias,
              float* state, bool init, const Tensor& out, const int32_t* spec, float* base,
              int64_t stride) {
  const int64_t dk = d.dk, dv = d.dv, kh = h / (d.hv / d.hk);
  // Each token's normalized q and k, decay and beta, once for every column block.
  std::vector<F> qn(static_cast<size_t>(n * dk)), kn(static_cast<size_t>(n * dk)), decay(n),
      beta(n);
  const F neg_a = -std::exp(F(a_log)), qscale = F(1) / std::sqrt(F(dk));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = t0 + t;
    l2norm<F>(q.ptr<float>() + row * q.stride[0] + kh * dk, dk, qscale, qn.data() + t * dk);
    l2norm<F>(k.ptr<float>() + row * k.stride[0] + kh * dk, dk, F(1), kn.data() + t * dk);
    decay[t] = std::exp(neg_a * softplus(F(a.ptr<float>()[row * a.stride[0] + h]) + F(dt_bias)));
    beta[t] = F(1) / (F(1) + std::exp(-F(b.ptr<float>()[row * b.stride[0] + h])));
  }
  std::vector<F> mem(kCols), acc(kCols);
  // A few tokens (decode, verify steps) run in place in the slot; more copy each block into a
  // dense buffer first, since the slot's rows, dv apart, crowd a few sets of L1 (a 128 x 128
  // head in place: 1.2 us a token, 0.8 in the buffer).
  const bool in_place = std::is_same_v<F, float> && n < kInPlaceTokens;
  if (in_place && !init) std::fill(state, state + dk * dv, 0.f);
  std::vector<F> S(in_place ? 0 : static_cast<size_t>(dk * kCols));
  for (int64_t j0 = 0; j0 < dv; j0 += kCols) {
    const int64_t w = std::min(kCols, dv - j0), ld = in_place ? dv : w;
    F* blk = in_place ? reinterpret_cast<F*>(state + j0) : S.data();
    if (!in_place)
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < w; ++j) S[i * w + j] = init ? F(state[i * dv + j0 + j]) : F(0);
    const float* vt = v.ptr<float>() + t0 * v.stride[0] + h * dv + j0;
    float* o = out.ptr<float>() + t0 * out.stride[0] + h * dv + j0;
    const int32_t* sp = spec == nullptr ? nullptr : spec + t0;
    if constexpr (std::is_same_v<F, float>)
      block_tokens_f32(dk, w, n, kn.data(), qn.data(), decay.data(), beta.data(), blk, ld,
                       mem.data(), acc.data(), vt, v.stride[0], o, out.stride[0], sp, base + j0,
                       stride, dv);
    else  // (the f64 reference)
      block_tokens<F>(dk, w, n, kn.data(), qn.data(), decay.data(), beta.data(), blk, ld,
                      mem.data(), acc.data(), vt, v.stride[0], o, out.stride[0], sp, base + j0,
                      stride, dv);
    if (!in_place)
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < w; ++j)
          state[i * dv + j0 + j] = static_cast<float>(S[i * w + j]);
  }
}

void gated_delta_rule(const Tensor& out, const Tensor& recurrent_state, const Tensor& q,
                      const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                      const Tensor& A_log, const Tensor& dt_bias, const Tensor& query_start_loc,
                      const Tensor& state_indices, const Tensor& has_initial_state,
                      const Tensor& spec_state_indices, bool reference) {
  const char* op = "gated_delta_rule";
  for (const Tensor* t : {&out, &q, &k, &v, &a, &b}) check_dtype(*t, DType::F32, op, "activations");
  const Dims d{q.shape[1] / recurrent_state.shape[2], recurrent_state.shape[1],
               recurrent_state.shape[2], recurrent_state.shape[3]};
  const int64_t B = state_indices.shape[0], slots = recurrent_state.shape[0];
  const int32_t* qsl = query_start_loc.ptr<int32_t>();
  const int32_t* idx = state_indices.ptr<int32_t>();
  const int32_t* init = has_initial_state.ptr<int32_t>();
  for (int64_t s = 0; s < B; ++s) {
    VLLMX_CHECK(idx[s] >= 0 && idx[s] < slots, op,
                "state_indices[" + std::to_string(s) + "] = " + std::to_string(idx[s]) +
                    " is not a slot of recurrent_state " + recurrent_state.str());
    VLLMX_CHECK(qsl[s + 1] >= qsl[s] && qsl[s + 1] <= q.shape[0], op,
                "query_start_loc must rise within the " + std::to_string(q.shape[0]) + " rows");
  }
  const int32_t* spec = spec_slots(spec_state_indices, slots, op, "recurrent_state");
  const float* al = A_log.ptr<float>();
  const float* db = dt_bias.ptr<float>();
  const int64_t items = B * d.hv;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t s = it / d.hv, h = it % d.hv;
    const int64_t n = qsl[s + 1] - qsl[s];
    if (n == 0) continue;
    float* st = recurrent_state.ptr<float>() + idx[s] * recurrent_state.stride[0] +
                h * d.dk * d.dv;
    float* base = recurrent_state.ptr<float>() + h * d.dk * d.dv;
    const int64_t stride = recurrent_state.stride[0];
    if (reference)
      run_head<double>(d, h, qsl[s], n, q, k, v, a, b, al[h], db[h], st, init[s] != 0, out,
                       spec, base, stride);
    else
      run_head<float>(d, h, qsl[s], n, q, k, v, a, b, al[h], db[h], st, init[s] != 0, out,
                      spec, base, stride);
  }
}

}  // namespace

VLLMX_KERNEL(gated_delta_rule, kCPU, gated_delta_rule);

}  // namespace vllmx
