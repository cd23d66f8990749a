// sample on the GPU: one thread block per row of logits, the semantics of csrc/sampling/sampler.cpp
// (read there): greedy = argmax with the lowest index on ties (NaN ignored, generator not
// advanced); otherwise w = exp(l / t - max / t) with min_p applied, then top_k and top_p cuts
// ranked by (weight descending, index ascending), then one inverse-CDF draw in index order using
// exactly one output of the row's xoroshiro128++ generator. Same seed, same probabilities ->
// same token as on the CPU (expf may differ from the CPU's in the last bit, which moves a draw
// only when it lands that close to a boundary).
//
// How, without sorting the vocabulary: the weights are recomputed from the logits in each pass
// (no scratch memory, so the op can be captured in a CUDA graph); top_k and top_p cuts come from
// a 4-pass radix select over the float bits of the weights (8-bit digits, shared-memory
// histograms); ties at the cut are resolved in index order by a block scan. Masses are summed in
// 64-bit fixed point (w * 2^S with S chosen so that V weights cannot overflow), so every sum is
// exact and independent of the order the threads add in: the result is deterministic.
//
// Parameters live on the GPU and are not validated here (a host check would need a sync); the
// Python layer validates SamplingParams. logprobs: log_softmax of the raw logits at the token.
#include <cfloat>
#include <climits>
#include <cmath>

#include "core/op_table.h"
#include "cuda_util.cuh"
#include "sampling/rng.h"

namespace vllmx::cuda {

namespace {

constexpr int kT = 1024;  // threads per row
constexpr int kWarps = kT / 32;

using rng::uniform01;  // csrc/sampling/rng.h: the same stream as the CPU sampler

// Exclusive prefix sum over the threads in thread order.
__device__ uint64_t block_exclusive_scan(uint64_t v) {
  __shared__ uint64_t warp_total[kWarps];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_total[warp] = x;
  __syncthreads();
  if (warp == 0) {
    uint64_t t = warp_total[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t y = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += y;
    }
    warp_total[lane] = t;
  }
  __syncthreads();
  return (warp == 0 ? 0 : warp_total[warp - 1]) + x - v;
}

// The first index i (in index order) at which sum_{j <= i} val(j) > target; -1 if none. Each
// thread owns a contiguous segment, so the prefix follows index order exactly.
template <typename Val>
__device__ int64_t find_prefix_exceeds(int64_t V, Val val, uint64_t target) {
  __shared__ int64_t found;
  const int64_t seg = (V + kT - 1) / kT;
  const int64_t begin = min(V, static_cast<int64_t>(threadIdx.x) * seg);
  const int64_t end = min(V, begin + seg);
  uint64_t local = 0;
  for (int64_t i = begin; i < end; ++i) local += val(i);
  if (threadIdx.x == 0) found = -1;
  const uint64_t excl = block_exclusive_scan(local);  // (its barriers order the store above)
  if (local > 0 && excl <= target && target - excl < local) {
    uint64_t cum = excl;
    for (int64_t i = begin; i < end; ++i) {
      cum += val(i);
      if (cum > target) {
        found = i;
        break;
      }
    }
  }
  __syncthreads();
  const int64_t r = found;
  __syncthreads();
  return r;
}

// f(l[i], i) for this thread's share of the row l[0, V), in the same order every call. One CTA
// reads the whole row, so it reads it in 16-byte loads, several in flight per thread: a
// vocabulary of 150k read one float at a time is bound by the latency of each load (tens of
// microseconds).
template <typename F>
__device__ __forceinline__ void scan_row(const float* l, int64_t V, F&& f) {
  const int64_t v4 = (reinterpret_cast<uintptr_t>(l) & 15) == 0 ? V / 4 : 0;
#pragma unroll 4
  for (int64_t c = threadIdx.x; c < v4; c += kT) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(l) + c);
    f(q.x, 4 * c);
    f(q.y, 4 * c + 1);
    f(q.z, 4 * c + 2);
    f(q.w, 4 * c + 3);
  }
  for (int64_t i = 4 * v4 + threadIdx.x; i < V; i += kT) f(l[i], i);
}

struct Row {
  const float* l;
  int64_t V;
  float t, m, min_p;
  float scale;  // 2^S: fixed-point mass = w * 2^S, truncated
  __device__ float weight(int64_t i) const {
    const float e = expf(l[i] / t - m);
    return (e >= min_p && e != 0.0f) ? e : 0.0f;  // NaN -> 0
  }
  __device__ uint64_t fixed(float w) const { return static_cast<uint64_t>(w * scale); }
};

// The kept set so far: positive weights ranked at or before the cut (w, i); no cut: all.
struct Cut {
  float w;
  int64_t i;  // -1: no cut
  __device__ bool keeps(float x, int64_t j) const {
    return x > 0.0f && (i < 0 || x > w || (x == w && j <= i));
  }
};

// Radix select over the float bits of the kept weights, most significant digit first.
// kByMass = false: the key of the need-th largest weight (need >= 1, <= the kept count).
// kByMass = true: the largest key at which the mass of the weights with key >= it reaches
// target (target < the kept mass); *mass_above gets the mass of weights with a larger key and
// *ties the number of kept weights with exactly this key.
template <bool kByMass>
__device__ uint32_t radix_select(const Row& row, const Cut& kept, uint64_t need_or_target,
                                 uint64_t* mass_above, uint32_t* ties) {
  __shared__ unsigned int cnt[256];
  __shared__ unsigned long long mass[256];
  __shared__ uint32_t s_prefix;
  __shared__ uint64_t s_rem, s_above;
  __shared__ uint32_t s_ties;
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_rem = need_or_target;
    s_above = 0;
  }
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    const uint32_t hi_mask = pass == 0 ? 0u : ~0u << (shift + 8);
    __syncthreads();
    if (threadIdx.x < 256) {
      cnt[threadIdx.x] = 0;
      mass[threadIdx.x] = 0;
    }
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int64_t i = threadIdx.x; i < row.V; i += kT) {
      const float w = row.weight(i);
      if (!kept.keeps(w, i)) continue;
      const uint32_t key = __float_as_uint(w);
      if ((key & hi_mask) != prefix) continue;
      const uint32_t d = (key >> shift) & 0xFFu;
      atomicAdd(&cnt[d], 1u);
      if constexpr (kByMass) atomicAdd(&mass[d], static_cast<unsigned long long>(row.fixed(w)));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint64_t rem = s_rem;
      uint64_t above = 0;
      int sel = -1, lowest = -1;
      for (int d = 255; d >= 0; --d) {
        if (cnt[d] == 0) continue;
        lowest = d;
        const uint64_t here = kByMass ? mass[d] : cnt[d];
        if (above + here >= rem) {
          sel = d;
          break;
        }
        above += here;
      }
      if (sel < 0) sel = lowest;  // (rounding guard: keep the least-ranked bucket)
      if (kByMass) {
        s_rem = rem > above ? rem - above : 0;
        s_above += above;
      } else {
        s_rem = rem - above;
      }
      s_prefix = prefix | (static_cast<uint32_t>(sel) << shift);
      s_ties = cnt[sel];
    }
  }
  __syncthreads();
  const uint32_t key = s_prefix;
  if (mass_above) *mass_above = kByMass ? s_above : s_rem;  // count mode: ties still needed
  if (ties) *ties = s_ties;
  __syncthreads();
  return key;
}

// log(sum exp(l)) of a row whose largest logit is lmax, NaN ignored: one function for the
// sampling kernel's log-prob and compute_logprobs', so a token's log-prob has the same bits
// whichever computed it (a request's logprobs do not depend on its neighbours' settings).
__device__ double row_log_sum_exp(const float* l, int64_t V, float lmax) {
  double s = 0.0;
  scan_row(l, V, [&](float v, int64_t) {
    if (v == v) s += expf(v - lmax);
  });
  s = block_reduce<kT>(s, Sum{});
  return static_cast<double>(lmax) + log(s);
}

__device__ float row_max(const float* l, int64_t V) {
  float best = -INFINITY;
  scan_row(l, V, [&](float v, int64_t) {
    if (v > best) best = v;  // NaN never compares greater
  });
  return block_reduce<kT>(best, Max{});
}

__global__ void __launch_bounds__(kT) sample_kernel(
    int32_t* out_ids, float* out_logprobs, const float* logits, int64_t V, int64_t ls,
    const float* temperature, const int32_t* top_k, const float* top_p, const float* min_p,
    uint64_t* rng_state, int shift) {
  pdl_begin();
  const int64_t b = blockIdx.x;
  const float* l = logits + b * ls;

  // Max and argmax (lowest index on ties; NaN never compares greater).
  float best = -INFINITY;
  int64_t arg = LLONG_MAX;
  scan_row(l, V, [&](float v, int64_t i) {
    if (v > best || (v == best && i < arg)) {
      best = v;
      arg = i;
    }
  });
  const float lmax = block_reduce<kT>(best, Max{});
  arg = block_reduce<kT>(best == lmax ? arg : LLONG_MAX, [](int64_t a, int64_t c) {
    return a < c ? a : c;
  });
  if (arg == LLONG_MAX) arg = 0;  // every logit NaN

  int64_t token = arg;
  const float t = temperature[b];
  if (t > 0.0f && fabsf(lmax) < INFINITY) {
    Row row{l, V, t, lmax / t, min_p[b], ldexpf(1.0f, shift)};
    Cut kept{0.0f, -1};
    // Total mass and candidate count.
    uint64_t z = 0, n_pos = 0;
    for (int64_t i = threadIdx.x; i < V; i += kT) {
      const float w = row.weight(i);
      z += row.fixed(w);
      n_pos += w > 0.0f;
    }
    z = block_reduce<kT>(z, Sum{});
    n_pos = block_reduce<kT>(n_pos, Sum{});

    const int32_t k = top_k[b];
    if (k > 0 && static_cast<uint64_t>(k) < n_pos) {
      uint64_t need = 0;
      const uint32_t key = radix_select<false>(row, kept, static_cast<uint64_t>(k), &need, nullptr);
      const float tw = __uint_as_float(key);
      const int64_t ti = find_prefix_exceeds(
          V, [&](int64_t i) -> uint64_t { return row.weight(i) == tw; }, need - 1);
      kept = Cut{tw, ti};
      uint64_t zk = 0;
      for (int64_t i = threadIdx.x; i < V; i += kT) {
        const float w = row.weight(i);
        if (kept.keeps(w, i)) zk += row.fixed(w);
      }
      z = block_reduce<kT>(zk, Sum{});
    }

    const float p = top_p[b];
    if (p < 1.0f) {
      const double target_d = ceil(static_cast<double>(p) * static_cast<double>(z));
      const uint64_t target = static_cast<uint64_t>(target_d);
      if (target < z) {
        uint64_t above = 0;
        uint32_t ties = 0;
        const uint32_t key = radix_select<true>(row, kept, target, &above, &ties);
        const float tw = __uint_as_float(key);
        const uint64_t q = row.fixed(tw);
        const uint64_t rest = target > above ? target - above : 0;
        uint64_t j = q > 0 ? (rest + q - 1) / q : ties;
        j = j < 1 ? 1 : (j > ties ? ties : j);
        const Cut prev = kept;
        const int64_t ti = find_prefix_exceeds(
            V,
            [&](int64_t i) -> uint64_t {
              const float w = row.weight(i);
              return w == tw && prev.keeps(w, i);
            },
            j - 1);
        kept = Cut{tw, ti};
        z = above + j * q;
      }
    }

    // One draw, inverse CDF over the kept set in index order.
    __shared__ double s_u;
    if (threadIdx.x == 0) s_u = uniform01(rng_state + 2 * b);
    __syncthreads();
    const uint64_t target = static_cast<uint64_t>(floor(s_u * static_cast<double>(z)));
    token = find_prefix_exceeds(
        V,
        [&](int64_t i) -> uint64_t {
          const float w = row.weight(i);
          return kept.keeps(w, i) ? row.fixed(w) : 0;
        },
        target < z ? target : z - 1);
    if (token < 0) {  // (rounding guard) the last kept token
      int64_t last = -1;
      for (int64_t i = threadIdx.x; i < V; i += kT)
        if (kept.keeps(row.weight(i), i)) last = i;
      token = block_reduce<kT>(last, Max{});
      if (token < 0) token = arg;
    }
  } else if (t > 0.0f && threadIdx.x == 0) {
    uniform01(rng_state + 2 * b);  // a random row's one draw, unused (the fallback to greedy)
  }

  if (out_logprobs) {
    const double lse = row_log_sum_exp(l, V, lmax);
    if (threadIdx.x == 0) out_logprobs[b] = static_cast<float>(l[token] - lse);
  }
  if (threadIdx.x == 0) out_ids[b] = static_cast<int32_t>(token);
}

}  // namespace

void sample(const Tensor& out_ids, const Tensor& out_logprobs, const Tensor& logits,
            const Tensor& temperature, const Tensor& top_k, const Tensor& top_p,
            const Tensor& min_p, const Tensor& rng_state) {
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs.
  const char* op = "sample";
  check_rows(logits, op, "logits");
  const int64_t B = logits.shape[0], V = logits.shape[1];
  if (B == 0) return;
  // Fixed-point scale: V weights <= 1 each sum below 2^62.
  int log2v = 0;
  while ((int64_t{1} << log2v) < V) ++log2v;
  const int shift = 62 - log2v;
  launch(sample_kernel, static_cast<unsigned int>(B), kT, 0, stream(),
      out_ids.ptr<int32_t>(), out_logprobs.defined() ? out_logprobs.ptr<float>() : nullptr,
      logits.ptr<float>(), V, logits.stride[0], temperature.ptr<float>(),
      top_k.ptr<int32_t>(), top_p.ptr<float>(), min_p.ptr<float>(),
      rng_state.ptr<uint64_t>(), shift);
  check_launch("sample kernel");
}

// ---- compute_logprobs ----

namespace {

// The most top logprobs per row computed here: each takes a pass over the row, fine for the
// handful requests ask for; vllmx/layers/sampler.py (MAX_DEVICE_TOP_LOGPROBS) sends rows asking
// for more to the host.
constexpr int64_t kMaxDeviceTopLogprobs = 64;

// A logit and its id as one key ordered as the ranking is: the larger logit first, then the
// lower id; NaN ranks as -inf. 0 is below every key.
__device__ __forceinline__ uint64_t rank_key(float v, int64_t i) {
  if (v != v) v = -INFINITY;
  uint32_t u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

__global__ void __launch_bounds__(kT) logprobs_kernel(
    float* out_lp, int32_t* out_rank, int32_t* top_ids, float* top_lps, int K,
    const float* logits, int64_t ls, int64_t V, const int32_t* token_ids,
    const int32_t* num_logprobs) {
  pdl_begin();
  const int64_t n = blockIdx.x;
  const float* l = logits + n * ls;
  const double lse = row_log_sum_exp(l, V, row_max(l, V));
  const int32_t tok = token_ids[n];
  const float x = tok >= 0 && tok < V ? l[tok] : NAN;
  const int64_t k = min(static_cast<int64_t>(num_logprobs[n]), V);
  int64_t above = 0;
  scan_row(l, V, [&](float v, int64_t) { above += v > x; });
  above = block_reduce<kT>(above, Sum{});
  if (threadIdx.x == 0) {
    out_lp[n] = static_cast<float>(x - lse);
    out_rank[n] = k < 0 ? 0 : static_cast<int32_t>(1 + above);
  }
  // The k best in rank order, a pass each: the next is the best key below the previous one.
  uint64_t prev = ~uint64_t{0};
  for (int r = 0; r < K; ++r) {
    if (r < k) {
      uint64_t best = 0;
      scan_row(l, V, [&](float v, int64_t i) {
        const uint64_t key = rank_key(v, i);
        if (key < prev && key > best) best = key;
      });
      prev = block_reduce<kT>(best, Max{});
    }
    if (threadIdx.x == 0) {
      const int64_t id = 0xFFFFFFFFu - static_cast<uint32_t>(prev);
      top_ids[n * K + r] = r < k ? static_cast<int32_t>(id) : -1;
      top_lps[n * K + r] = r < k ? static_cast<float>(l[id] - lse) : -INFINITY;
    }
  }
}

void compute_logprobs(const Tensor& out_token_logprob, const Tensor& out_rank,
                      const Tensor& out_top_ids, const Tensor& out_top_logprobs,
                      const Tensor& logits, const Tensor& token_ids,
                      const Tensor& num_logprobs) {
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs.
  const char* op = "compute_logprobs";
  check_rows(logits, op, "logits");
  const int64_t N = logits.shape[0], V = logits.shape[1];
  const int64_t K = out_top_ids.defined() ? out_top_ids.shape[1] : 0;
  VLLMX_CHECK(K <= kMaxDeviceTopLogprobs, op,
              "at most " + std::to_string(kMaxDeviceTopLogprobs) +
                  " top logprobs per row on the GPU, got K = " + std::to_string(K));
  if (N == 0) return;
  launch(logprobs_kernel, static_cast<unsigned int>(N), kT, 0, stream(),
         out_token_logprob.ptr<float>(), out_rank.ptr<int32_t>(),
         K ? out_top_ids.ptr<int32_t>() : nullptr, K ? out_top_logprobs.ptr<float>() : nullptr,
         static_cast<int>(K), logits.ptr<float>(), logits.stride[0], V,
         token_ids.ptr<int32_t>(), num_logprobs.ptr<int32_t>());
  check_launch("compute_logprobs kernel");
}

}  // namespace

VLLMX_KERNEL(sample, kCUDA, sample);
VLLMX_KERNEL(compute_logprobs, kCUDA, compute_logprobs);

}  // namespace vllmx::cuda
