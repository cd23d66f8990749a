// The hybrid mixers' sequential ops on the GPU (contracts in csrc/ops.def; the CPU twins in
// csrc/linear_attn/), token by token as the CPU runs them (gated_delta_rule's longer sequences
// in chunks on the tensor cores: gated_delta_chunked.cu). causal_conv1d: one thread a
// (sequence, channel), walking the sequence's tokens in order with the window's K - 1 previous
// inputs in registers (from the request's conv_state slot, or zeros at its first tokens),
// which go back to the slot at the end; prefill batches of few sequences token-parallel
// instead. A token's output depends on its input and the K - 1 before it only: the same
// whatever the batch or the chunking. The sequences' offsets, slots and flags live on the
// device and are trusted as the attention kernels trust theirs (a slot outside the state is
// skipped), as are spec_state_indices' (a row's extra slot for the state after it, -1 none:
// speculative decoding's rollback, worker/state_slots.py), which each kernel writes as it
// passes the row.
// rms_norm_gated (the mixers' gated RMSNorm) is here too.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/op_table.h"
#include "cuda_ops.h"
#include "cuda_util.cuh"
#include "mma.cuh"  // allow_smem

namespace vllmx::cuda {
namespace {

constexpr int kConvMaxK = 8;  // the mixers' windows: 4 (Qwen3-Next, Mamba2), at most a few
constexpr int kConvThreads = 128;
constexpr int kConvAhead = 8;  // tokens whose inputs a thread loads together

template <typename T, int K>
__global__ void causal_conv1d_kernel(T* __restrict__ out, int64_t out_stride,
                                     const T* __restrict__ x, int64_t x_stride,
                                     const float* __restrict__ w, const float* __restrict__ bias,
                                     float* __restrict__ state, int64_t slots, int64_t D,
                                     const int32_t* __restrict__ qsl,
                                     const int32_t* __restrict__ idx,
                                     const int32_t* __restrict__ init,
                                     const int32_t* __restrict__ spec, bool silu) {
  pdl_begin();
  const int b = blockIdx.y;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int64_t t0 = qsl[b], n = qsl[b + 1] - t0;
  const int64_t slot = idx[b];
  if (d >= D || n <= 0 || slot < 0 || slot >= slots) return;
  float* st = state + (slot * D + d) * (K - 1);
  float hist[K - 1], wk[K];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) hist[j] = init[b] != 0 ? st[j] : 0.f;
#pragma unroll
  for (int j = 0; j < K; ++j) wk[j] = w[d * K + j];
  const float b0 = bias != nullptr ? bias[d] : 0.f;
  // kConvAhead tokens' inputs loaded before any is used: the loads are independent, and one
  // at a time a prefill's thread waited out a memory round trip a token.
  for (int64_t t1 = 0; t1 < n; t1 += kConvAhead) {
    float xs[kConvAhead];
#pragma unroll
    for (int u = 0; u < kConvAhead; ++u)
      xs[u] = t1 + u < n ? to_f32(x[(t0 + t1 + u) * x_stride + d]) : 0.f;
#pragma unroll
    for (int u = 0; u < kConvAhead; ++u) {
      if (t1 + u >= n) break;
      const float xv = xs[u];
      float acc = b0;
#pragma unroll
      for (int j = 0; j < K - 1; ++j) acc = fmaf(wk[j], hist[j], acc);
      acc = fmaf(wk[K - 1], xv, acc);
      if (silu) acc = activate<Act::kSilu>(acc);
      out[(t0 + t1 + u) * out_stride + d] = from_f32<T>(acc);
#pragma unroll
      for (int j = 0; j + 1 < K - 1; ++j) hist[j] = hist[j + 1];
      hist[K - 2] = xv;
      const int64_t saved = spec != nullptr ? spec[t0 + t1 + u] : -1;
      if (saved >= 0 && saved < slots) {
#pragma unroll
        for (int j = 0; j < K - 1; ++j) state[(saved * D + d) * (K - 1) + j] = hist[j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < K - 1; ++j) st[j] = hist[j];
}

// Prefill batches of few sequences: the outputs token-parallel, then the windows left in the
// slots. A thread a (sequence, channel) walks its tokens one after another: 178 us a Qwen3.5
// layer on an H100 for one 1024-token prompt (64 blocks), where this pair takes 59 + 23 us.
// With many sequences that kernel has the threads to fill the GPU and wins (8 x 1024 tokens:
// 226 us, this pair 380 + 24), so the pair runs where it would have at most two blocks an SM.
// causal_conv1d_tokens_kernel: a thread a (channel, kConvTile consecutive rows of the batch),
// each row's window from x's rows of its sequence or, before the sequence's first row, from the
// slot's old window (read only: the window kernel writes the slots after it). Same fused
// multiply-adds in the same order as the kernel above: the same outputs, bit for bit.
constexpr int kConvTile = 16;

template <typename T, int K>
__global__ void causal_conv1d_tokens_kernel(T* __restrict__ out, int64_t out_stride,
                                            const T* __restrict__ x, int64_t x_stride,
                                            const float* __restrict__ w,
                                            const float* __restrict__ bias,
                                            const float* __restrict__ state, int64_t slots,
                                            int64_t D, int64_t rows, int B,
                                            const int32_t* __restrict__ qsl,
                                            const int32_t* __restrict__ idx,
                                            const int32_t* __restrict__ init, bool silu) {
  pdl_begin();
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kConvTile;
  if (d >= D || r0 >= rows) return;
  // The sequence of row r0: the last b with qsl[b] <= r0 (rows past qsl[B]: none).
  int lo = 0, hi = B;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (qsl[mid] <= r0) lo = mid; else hi = mid - 1;
  }
  float wk[K];
#pragma unroll
  for (int j = 0; j < K; ++j) wk[j] = w[d * K + j];
  const float b0 = bias != nullptr ? bias[d] : 0.f;
  int b = lo;
  for (int64_t r = r0; r < r0 + kConvTile && r < rows; ++r) {
    while (b < B && qsl[b + 1] <= r) ++b;  // (empty sequences skipped)
    if (b >= B) return;                     // rows past the batch's
    const int64_t first = qsl[b], slot = idx[b];
    if (slot < 0 || slot >= slots) continue;
    const float* st = state + (slot * D + d) * (K - 1);
    const bool from_slot = init[b] != 0;
    float acc = b0;
#pragma unroll
    for (int j = 0; j < K; ++j) {
      const int64_t src = r - (K - 1) + j;  // a row of x, or before the sequence: the window's
      const float xv = src >= first ? to_f32(x[src * x_stride + d])
                       : from_slot   ? st[K - 1 + (src - first)]
                                     : 0.f;
      acc = fmaf(wk[j], xv, acc);
    }
    if (silu) acc = activate<Act::kSilu>(acc);
    out[r * out_stride + d] = from_f32<T>(acc);
  }
}

// The windows after the tokens kernel: a thread a (sequence, channel) writes the slot's new
// window (the last K - 1 inputs, older ones from the old window) and those after the rows that
// save one (spec_state_indices), the slot's own last.
template <typename T, int K>
__global__ void causal_conv1d_window_kernel(const T* __restrict__ x, int64_t x_stride,
                                            float* __restrict__ state, int64_t slots, int64_t D,
                                            const int32_t* __restrict__ qsl,
                                            const int32_t* __restrict__ idx,
                                            const int32_t* __restrict__ init,
                                            const int32_t* __restrict__ spec) {
  pdl_begin();
  const int b = blockIdx.y;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int64_t t0 = qsl[b], n = qsl[b + 1] - t0, slot = idx[b];
  if (d >= D || n <= 0 || slot < 0 || slot >= slots) return;
  float* st = state + (slot * D + d) * (K - 1);
  const bool from_slot = init[b] != 0;
  // The window after row `end` - 1 of the sequence: inputs end - K + 1 .. end - 1.
  auto window = [&](int64_t end, float (&hist)[K - 1]) {
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
      const int64_t pos = end - (K - 1) + j;
      hist[j] = pos >= 0 ? to_f32(x[(t0 + pos) * x_stride + d])
                : from_slot ? st[K - 1 + pos]
                            : 0.f;
    }
  };
  float hist[K - 1];
  if (spec != nullptr) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t saved = spec[t0 + r];
      if (saved < 0 || saved >= slots) continue;
      window(r + 1, hist);
#pragma unroll
      for (int j = 0; j < K - 1; ++j) state[(saved * D + d) * (K - 1) + j] = hist[j];
    }
  }
  window(n, hist);
#pragma unroll
  for (int j = 0; j < K - 1; ++j) st[j] = hist[j];
}

template <typename T, int K>
void launch_conv(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                 const Tensor& conv_state, const Tensor& qsl, const Tensor& idx,
                 const Tensor& init, const Tensor& spec, bool silu) {
  const int64_t D = x.shape[1], B = idx.shape[0], rows = x.shape[0];
  const unsigned dblocks = static_cast<unsigned>((D + kConvThreads - 1) / kConvThreads);
  // Prefill batches (rows >= 2 B) of few sequences, out not x's memory: the token-parallel
  // pair; else one thread a (sequence, channel), one launch.
  if (rows >= 2 * B && B * D <= 2 * int64_t{detail::num_sms()} * kConvThreads &&
      out.data != x.data) {
    launch(causal_conv1d_tokens_kernel<T, K>,
           dim3(dblocks, static_cast<unsigned>((rows + kConvTile - 1) / kConvTile)),
           kConvThreads, 0, stream(), out.ptr<T>(), out.stride[0], x.ptr<T>(), x.stride[0],
           weight.ptr<float>(), bias.defined() ? bias.ptr<float>() : nullptr,
           conv_state.ptr<float>(), conv_state.shape[0], D, rows, static_cast<int>(B),
           qsl.ptr<int32_t>(), idx.ptr<int32_t>(), init.ptr<int32_t>(), silu);
    launch(causal_conv1d_window_kernel<T, K>, dim3(dblocks, static_cast<unsigned>(B)),
           kConvThreads, 0, stream(), x.ptr<T>(), x.stride[0], conv_state.ptr<float>(),
           conv_state.shape[0], D, qsl.ptr<int32_t>(), idx.ptr<int32_t>(), init.ptr<int32_t>(),
           spec.defined() ? spec.ptr<int32_t>() : nullptr);
    return;
  }
  launch(causal_conv1d_kernel<T, K>, dim3(dblocks, static_cast<unsigned>(B)), kConvThreads, 0,
         stream(), out.ptr<T>(), out.stride[0], x.ptr<T>(), x.stride[0], weight.ptr<float>(),
         bias.defined() ? bias.ptr<float>() : nullptr, conv_state.ptr<float>(),
         conv_state.shape[0], D, qsl.ptr<int32_t>(), idx.ptr<int32_t>(), init.ptr<int32_t>(),
         spec.defined() ? spec.ptr<int32_t>() : nullptr, silu);
}

template <int K = 2>
void dispatch_k(int64_t k, const char* op, auto&& run) {
  if constexpr (K <= kConvMaxK) {
    if (k == K) return run(std::integral_constant<int, K>{});
    return dispatch_k<K + 1>(k, op, run);
  } else {
    fail(op, "a window of " + std::to_string(k) + " taps (the GPU runs 2.." +
                 std::to_string(kConvMaxK) + ")");
  }
}

// spec_state_indices where the kernels read it: on the device, one entry a row, contiguous.
void check_spec(const Tensor& spec, const char* op) {
  if (!spec.defined()) return;
  check_on_device(spec, op, "spec_state_indices");
  VLLMX_CHECK(spec.stride[0] == 1, op, "spec_state_indices must be contiguous");
}

void causal_conv1d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& conv_state, const Tensor& query_start_loc,
                   const Tensor& state_indices, const Tensor& has_initial_state,
                   const Tensor& spec_state_indices, bool silu) {
  // The shapes are the op's contract (csrc/ops.cpp); here the GPU's dtypes and layouts.
  const char* op = "cuda.causal_conv1d";
  check_spec(spec_state_indices, op);
  check_rows(out, op, "out");
  check_rows(x, op, "x");
  check_act(x, op, "x");
  VLLMX_CHECK(out.dtype == x.dtype, op, "out " + out.str() + " must have x's dtype " + x.str());
  for (const Tensor* t : {&weight, &conv_state, &query_start_loc, &state_indices,
                          &has_initial_state})
    check_on_device(*t, op, "weight, conv_state and the sequence arrays");
  check_on_device(bias, op, "bias");
  VLLMX_CHECK(weight.is_contiguous() && query_start_loc.stride[0] == 1 &&
                  state_indices.stride[0] == 1 && has_initial_state.stride[0] == 1,
              op, "weight and the sequence arrays must be contiguous");
  if (x.shape[1] == 0 || state_indices.shape[0] == 0) return;
  dispatch_float(x.dtype, op, [&](auto v) {
    using T = decltype(v);
    dispatch_k(weight.shape[1], op, [&](auto k) {
      launch_conv<T, decltype(k)::value>(out, x, weight, bias, conv_state, query_start_loc,
                                         state_indices, has_initial_state, spec_state_indices,
                                         silu);
    });
  });
  check_launch(op);
}

// gated_delta_rule: one warp a (sequence, value head, 16 state columns): the recurrence never
// mixes a state's columns (column j of S decays, is read for the key into mem[j], takes
// k * delta[j] and is read for the query into out[j]), so a head's dv columns split across
// warps, eight a 128-wide head, which a prefill of one sequence needs to fill the GPU (one block
// a head ran 32 blocks a Qwen3.5 layer, token after token). A column is two lanes' (lane and
// lane + 16), each holding half its rows in registers (at most kGdnMaxDk rows: Qwen3-Next's and
// Qwen3.5's 128), their dot products summed by one shuffle; the next token's q, k, v, a and b
// are loaded while this one is worked on. A step is then a chain of register FMAs and warp
// sums, where a lane's whole column in shared memory with the token's loads in line took
// ~5.8 us a token (6 ms a Qwen3.5 layer for 8 x 1024 tokens on an H100). Per token the lanes
// take q's and k's norms with a warp sum and leave them normalized in shared memory for every
// lane (the second half of the rows 4 floats further on, so that the two halves' reads fall in
// different banks); the dot products run in four partial sums.
constexpr int kGdnCols = 16;
constexpr int kGdnMaxDk = 128;

// DK: the key head size, or 0 for any up to kGdnMaxDk (rows past dk held at zero: their k and
// q are zero, so they stay zero and add nothing). ST: the state's element type, f32 or the
// activations' (vLLM's mamba_ssm_cache_dtype; the recurrence runs in f32 registers either way,
// the state rounded where it is stored).
template <typename T, typename ST, int DK>
__global__ void __launch_bounds__(32) gated_delta_rule_kernel(
    T* __restrict__ out, int64_t out_stride, ST* __restrict__ state, int64_t slots,
    const T* __restrict__ q, const T* __restrict__ k, int64_t qk_stride, const T* __restrict__ v,
    int64_t v_stride, const T* __restrict__ a, const T* __restrict__ b, int64_t ab_stride,
    const float* __restrict__ A_log, const float* __restrict__ dt_bias, int hv, int hk, int dk,
    int dv, const int32_t* __restrict__ qsl, const int32_t* __restrict__ idx,
    const int32_t* __restrict__ init, const int32_t* __restrict__ spec, int64_t chunked_from) {
  constexpr int kN = DK > 0 ? DK : kGdnMaxDk;  // rows of a column, unrolled
  constexpr int kR = kN / 2;                    // a lane's rows
  constexpr int kPer = kN / 32;                 // q and k elements a lane loads
  static_assert(kN % 32 == 0 && kR % 4 == 0 && kN <= kGdnMaxDk, "whole float4s a lane");
  // This token's normalized q [kN + 4], then k: row i at i, or i + 4 in the second half.
  __shared__ float4 qk4[(kN + 4) / 2];
  pdl_begin();
  const int h = blockIdx.x, s = blockIdx.y, lane = threadIdx.x, half = lane / kGdnCols;
  const int j = blockIdx.z * kGdnCols + lane % kGdnCols;  // the column (< dv: a live one)
  const int r0 = half * kR;                                 // this lane's first row
  const int64_t t0 = qsl[s], n = qsl[s + 1] - t0, slot = idx[s];
  // (sequences of chunked_from tokens or more: gated_delta_chunked.cu's kernel)
  if (n <= 0 || n >= chunked_from || slot < 0 || slot >= slots) return;
  auto in_k = [&](int row) { return DK > 0 || row < dk; };
  ST* st = state + (slot * hv + h) * static_cast<int64_t>(dk) * dv;
  const bool live = j < dv, from_slot = init[s] != 0;
  float S[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i)
    S[i] = live && from_slot && in_k(r0 + i) ? to_f32(st[(r0 + i) * dv + j]) : 0.f;
  const int kh = h / (hv / hk);
  const float neg_a = -expf(A_log[h]), qscale = rsqrtf(static_cast<float>(dk)), dtb = dt_bias[h];
  float* const qw = reinterpret_cast<float*>(qk4);
  const float* const qs = qw + half * (kR + 4);  // this lane's rows of q, then of k
  const float* const ks = qs + kN + 4;

  // Token t's inputs for this lane (q and k at rows lane + 32 p), fetched a token ahead.
  float qn[kPer], kn[kPer], vn, an, bn;
  auto fetch = [&](int64_t t) {
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int i = lane + p * 32;
      qn[p] = in_k(i) ? to_f32(q[t * qk_stride + kh * dk + i]) : 0.f;
      kn[p] = in_k(i) ? to_f32(k[t * qk_stride + kh * dk + i]) : 0.f;
    }
    vn = live ? to_f32(v[t * v_stride + static_cast<int64_t>(h) * dv + j]) : 0.f;
    an = to_f32(a[t * ab_stride + h]);
    bn = to_f32(b[t * ab_stride + h]);
  };
  fetch(t0);
  for (int64_t t = t0; t < t0 + n; ++t) {
    float qc[kPer], kc[kPer];
#pragma unroll
    for (int p = 0; p < kPer; ++p) qc[p] = qn[p], kc[p] = kn[p];
    const float vj = vn, x = an + dtb, bt = bn;
    if (t + 1 < t0 + n) fetch(t + 1);
    // (FLA's l2norm as transformers writes it: x / sqrt(sum x^2 + 1e-6); q also / sqrt(dk))
    float ssq = 0.f, ssk = 0.f;
#pragma unroll
    for (int p = 0; p < kPer; ++p) ssq = fmaf(qc[p], qc[p], ssq), ssk = fmaf(kc[p], kc[p], ssk);
    const float iq = qscale / sqrtf(detail::warp_sum(ssq) + 1e-6f);
    const float ik = 1.f / sqrtf(detail::warp_sum(ssk) + 1e-6f);
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int i = lane + p * 32, at = i + (i >= kR ? 4 : 0);
      qw[at] = qc[p] * iq;
      qw[kN + 4 + at] = kc[p] * ik;
    }
    __syncwarp();
    const float decay = expf(neg_a * softplus(x));
    const float beta = 1.f / (1.f + expf(-bt));
    float m4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kR; i += 4) {
      const float4 kk = *reinterpret_cast<const float4*>(ks + i);
      S[i] *= decay, S[i + 1] *= decay, S[i + 2] *= decay, S[i + 3] *= decay;
      m4[0] = fmaf(S[i], kk.x, m4[0]);
      m4[1] = fmaf(S[i + 1], kk.y, m4[1]);
      m4[2] = fmaf(S[i + 2], kk.z, m4[2]);
      m4[3] = fmaf(S[i + 3], kk.w, m4[3]);
    }
    float mem = (m4[0] + m4[1]) + (m4[2] + m4[3]);
    mem += __shfl_xor_sync(0xffffffffu, mem, kGdnCols);  // the column's other half
    const float delta = (vj - mem) * beta;
    float a4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kR; i += 4) {
      const float4 kk = *reinterpret_cast<const float4*>(ks + i);
      const float4 qq = *reinterpret_cast<const float4*>(qs + i);
      S[i] = fmaf(kk.x, delta, S[i]);
      S[i + 1] = fmaf(kk.y, delta, S[i + 1]);
      S[i + 2] = fmaf(kk.z, delta, S[i + 2]);
      S[i + 3] = fmaf(kk.w, delta, S[i + 3]);
      a4[0] = fmaf(S[i], qq.x, a4[0]);
      a4[1] = fmaf(S[i + 1], qq.y, a4[1]);
      a4[2] = fmaf(S[i + 2], qq.z, a4[2]);
      a4[3] = fmaf(S[i + 3], qq.w, a4[3]);
    }
    float acc = (a4[0] + a4[1]) + (a4[2] + a4[3]);
    acc += __shfl_xor_sync(0xffffffffu, acc, kGdnCols);
    if (live && half == 0)
      out[t * out_stride + static_cast<int64_t>(h) * dv + j] = from_f32<T>(acc);
    const int64_t saved = spec != nullptr ? spec[t] : -1;
    if (live && saved >= 0 && saved < slots) {
      ST* dst = state + (saved * hv + h) * static_cast<int64_t>(dk) * dv;
#pragma unroll
      for (int i = 0; i < kR; ++i)
        if (in_k(r0 + i)) dst[(r0 + i) * dv + j] = from_f32<ST>(S[i]);
    }
    __syncwarp();  // every lane has read this token's q and k
  }
  if (live) {
#pragma unroll
    for (int i = 0; i < kR; ++i)
      if (in_k(r0 + i)) st[(r0 + i) * dv + j] = from_f32<ST>(S[i]);
  }
}

void gated_delta_rule(const Tensor& out, const Tensor& recurrent_state, const Tensor& q,
                      const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                      const Tensor& A_log, const Tensor& dt_bias, const Tensor& query_start_loc,
                      const Tensor& state_indices, const Tensor& has_initial_state,
                      const Tensor& spec_state_indices) {
  // The shapes are the op's contract (csrc/ops.cpp); here the GPU's dtypes and layouts.
  const char* op = "cuda.gated_delta_rule";
  check_spec(spec_state_indices, op);
  for (const Tensor* t : {&out, &q, &k, &v, &a, &b}) {
    check_rows(*t, op, "the activations");
    VLLMX_CHECK(t->dtype == q.dtype, op, "the activations must share q's dtype, got " +
                                             t->str());
  }
  check_act(q, op, "q");
  VLLMX_CHECK(q.stride[0] == k.stride[0], op, "q and k must have one row stride");
  for (const Tensor* t : {&recurrent_state, &A_log, &dt_bias, &query_start_loc, &state_indices,
                          &has_initial_state})
    check_on_device(*t, op, "the state, A_log, dt_bias and the sequence arrays");
  const int hv = static_cast<int>(recurrent_state.shape[1]);
  const int dk = static_cast<int>(recurrent_state.shape[2]);
  const int dv = static_cast<int>(recurrent_state.shape[3]);
  const int hk = static_cast<int>(q.shape[1] / dk);
  const int64_t B = state_indices.shape[0];
  VLLMX_CHECK(dk >= 1 && dk <= kGdnMaxDk, op,
              "a key head size of " + std::to_string(dk) + " (the CUDA kernel keeps a state "
              "column of at most " + std::to_string(kGdnMaxDk) + " rows in registers)");
  if (B == 0 || out.shape[0] == 0) return;
  const bool chunked = !spec_state_indices.defined() &&
                       gated_delta_rule_chunked(out, recurrent_state, q, k, v, a, b, A_log,
                                                dt_bias, query_start_loc, state_indices,
                                                has_initial_state);
  const int64_t chunked_from = chunked ? kChunkedMinTokens : INT64_MAX;
  const dim3 grid(hv, static_cast<unsigned>(B), static_cast<unsigned>((dv + kGdnCols - 1) /
                                                                      kGdnCols));
  dispatch_float(q.dtype, op, [&](auto e) {
    using T = decltype(e);
    auto go = [&](auto kernel, auto st) {
      using ST = decltype(st);
      launch(kernel, grid, 32, 0, stream(), out.ptr<T>(), out.stride[0],
             recurrent_state.ptr<ST>(), recurrent_state.shape[0], q.ptr<T>(), k.ptr<T>(),
             q.stride[0], v.ptr<T>(), v.stride[0], a.ptr<T>(), b.ptr<T>(), a.stride[0],
             A_log.ptr<float>(), dt_bias.ptr<float>(), hv, hk, dk, dv,
             query_start_loc.ptr<int32_t>(), state_indices.ptr<int32_t>(),
             has_initial_state.ptr<int32_t>(),
             spec_state_indices.defined() ? spec_state_indices.ptr<int32_t>() : nullptr,
             chunked_from);
    };
    auto by_dk = [&](auto st) {
      using ST = decltype(st);
      if (dk == kGdnMaxDk)
        go(gated_delta_rule_kernel<T, ST, kGdnMaxDk>, st);
      else
        go(gated_delta_rule_kernel<T, ST, 0>, st);
    };
    dispatch_state<T>(recurrent_state.dtype, by_dk);
  });
  check_launch(op);
}

// mamba2_scan: one block a (sequence, head, kScanRows state rows): a state's rows never mix
// (row p decays, takes dt x_p B and is read against C for out_p), so a head's P rows split
// across blocks, which a prefill of one sequence needs to fill the GPU. The block's [rows, N]
// slice of the state lives in shared memory, a warp a row at a time (its lanes over N): per
// token the block loads its rows of x's head and its group's B and C; each row decays and takes
// dt x_p B, and its dot with C (summed across the warp) plus D x_p is the output.
constexpr int kScanThreads = 256;
constexpr int kScanRows = 16;  // state rows a block (two a warp)

// ST: the state's element type, f32 or T (the gated delta rule's kernel: why).
template <typename T, typename ST>
__global__ void mamba2_scan_kernel(T* __restrict__ out, int64_t out_stride,
                                   ST* __restrict__ state, int64_t slots,
                                   const T* __restrict__ x, int64_t x_stride,
                                   const T* __restrict__ dt, int64_t dt_stride,
                                   const T* __restrict__ Bm, const T* __restrict__ Cm,
                                   int64_t bc_stride, const float* __restrict__ A_log,
                                   const float* __restrict__ Dp,
                                   const float* __restrict__ dt_bias, int H, int G, int P, int N,
                                   float dt_min, float dt_max, const int32_t* __restrict__ qsl,
                                   const int32_t* __restrict__ idx,
                                   const int32_t* __restrict__ init,
                                   const int32_t* __restrict__ spec) {
  extern __shared__ float smem[];  // S's rows [rows][N], then x [rows], B [N], C [N]
  pdl_begin();
  const int s = blockIdx.y, h = blockIdx.x, p0 = blockIdx.z * kScanRows;
  const int rows = min(kScanRows, P - p0);
  const int64_t t0 = qsl[s], n = qsl[s + 1] - t0, slot = idx[s];
  if (n <= 0 || slot < 0 || slot >= slots) return;
  float* S = smem;
  float* xs = S + static_cast<int64_t>(kScanRows) * N;
  float* bs = xs + kScanRows;
  float* cs = bs + N;
  ST* st = state + ((slot * H + h) * static_cast<int64_t>(P) + p0) * N;
  const bool from_slot = init[s] != 0;
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(rows) * N; i += blockDim.x)
    S[i] = from_slot ? to_f32(st[i]) : 0.f;
  const int g = h / (H / G), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;
  const float A = -expf(A_log[h]), d = Dp[h];
  for (int64_t t = t0; t < t0 + n; ++t) {
    __syncthreads();  // the state loaded / the last token's x, B, C read
    for (int i = threadIdx.x; i < rows; i += blockDim.x)
      xs[i] = to_f32(x[t * x_stride + static_cast<int64_t>(h) * P + p0 + i]);
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
      bs[i] = to_f32(Bm[t * bc_stride + static_cast<int64_t>(g) * N + i]);
      cs[i] = to_f32(Cm[t * bc_stride + static_cast<int64_t>(g) * N + i]);
    }
    __syncthreads();
    const float step = fminf(fmaxf(softplus(to_f32(dt[t * dt_stride + h]) + dt_bias[h]), dt_min),
                             dt_max);
    const float decay = expf(step * A);
    for (int p = warp; p < rows; p += warps) {
      float* row = S + static_cast<int64_t>(p) * N;
      const float xp = step * xs[p];
      float part = 0.f;
      for (int i = lane; i < N; i += 32) {
        const float sv = fmaf(row[i], decay, xp * bs[i]);
        row[i] = sv;
        part = fmaf(sv, cs[i], part);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
      if (lane == 0)
        out[t * out_stride + static_cast<int64_t>(h) * P + p0 + p] =
            from_f32<T>(fmaf(d, xs[p], part));
    }
    const int64_t saved = spec != nullptr ? spec[t] : -1;  // (the same for the whole block)
    if (saved >= 0 && saved < slots) {
      __syncthreads();  // every row of this token updated
      ST* dst = state + ((saved * H + h) * static_cast<int64_t>(P) + p0) * N;
      for (int64_t i = threadIdx.x; i < static_cast<int64_t>(rows) * N; i += blockDim.x)
        dst[i] = from_f32<ST>(S[i]);
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(rows) * N; i += blockDim.x)
    st[i] = from_f32<ST>(S[i]);
}

void mamba2_scan(const Tensor& out, const Tensor& ssm_state, const Tensor& x, const Tensor& dt,
                 const Tensor& B, const Tensor& C, const Tensor& A_log, const Tensor& D,
                 const Tensor& dt_bias, const Tensor& query_start_loc,
                 const Tensor& state_indices, const Tensor& has_initial_state,
                 const Tensor& spec_state_indices, float dt_min, float dt_max) {
  // The shapes are the op's contract (csrc/ops.cpp); here the GPU's dtypes and layouts.
  const char* op = "cuda.mamba2_scan";
  check_spec(spec_state_indices, op);
  for (const Tensor* t : {&out, &x, &dt, &B, &C}) {
    check_rows(*t, op, "the activations");
    VLLMX_CHECK(t->dtype == x.dtype, op, "the activations must share x's dtype, got " +
                                             t->str());
  }
  check_act(x, op, "x");
  VLLMX_CHECK(B.stride[0] == C.stride[0], op, "B and C must have one row stride");
  for (const Tensor* t : {&ssm_state, &A_log, &D, &dt_bias, &query_start_loc, &state_indices,
                          &has_initial_state})
    check_on_device(*t, op, "the state, A_log, D, dt_bias and the sequence arrays");
  const int H = static_cast<int>(ssm_state.shape[1]), P = static_cast<int>(ssm_state.shape[2]);
  const int N = static_cast<int>(ssm_state.shape[3]), G = static_cast<int>(B.shape[1] / N);
  const int64_t Bn = state_indices.shape[0];
  const size_t smem = (static_cast<size_t>(kScanRows) * N + kScanRows + 2 * N) * sizeof(float);
  VLLMX_CHECK(smem <= 200 * 1024, op, "a state size of " + std::to_string(N) +
                                          " exceeds shared memory");
  if (Bn == 0 || out.shape[0] == 0) return;
  dispatch_float(x.dtype, op, [&](auto e) {
    using T = decltype(e);
    auto go = [&](auto st) {
      using ST = decltype(st);
      detail::allow_smem(mamba2_scan_kernel<T, ST>, static_cast<int>(smem));
      const dim3 grid(H, static_cast<unsigned>(Bn), (P + kScanRows - 1) / kScanRows);
      launch(mamba2_scan_kernel<T, ST>, grid, kScanThreads, smem,
             stream(), out.ptr<T>(), out.stride[0], ssm_state.ptr<ST>(), ssm_state.shape[0],
             x.ptr<T>(), x.stride[0], dt.ptr<T>(), dt.stride[0], B.ptr<T>(), C.ptr<T>(),
             B.stride[0], A_log.ptr<float>(), D.ptr<float>(), dt_bias.ptr<float>(), H, G, P, N,
             dt_min, dt_max, query_start_loc.ptr<int32_t>(), state_indices.ptr<int32_t>(),
             has_initial_state.ptr<int32_t>(),
             spec_state_indices.defined() ? spec_state_indices.ptr<int32_t>() : nullptr);
    };
    dispatch_state<T>(ssm_state.dtype, go);
  });
  check_launch(op);
}

// The hybrids' gated RMSNorm over each group of d values of a row, one block a (row, group):
// norm_before_gate out = x / rms(x) * w * silu(z) (Gated DeltaNet), else y = x * silu(z),
// out = y / rms(y) * w (Mamba2). w [d] shared by the groups (w_group_stride 0) or [groups * d].
template <typename T, typename W>
__global__ void rms_norm_gated_kernel(T* out, const T* x, const T* z, const W* w, int64_t d,
                                      int64_t groups, int64_t w_group_stride, int64_t out_stride,
                                      int64_t x_stride, int64_t z_stride, float eps,
                                      bool norm_before_gate) {
  pdl_begin();
  const int64_t r = blockIdx.x / groups, g = blockIdx.x % groups;
  const T* xr = x + r * x_stride + g * d;
  const T* zr = z + r * z_stride + g * d;
  const W* wr = w + g * w_group_stride;
  T* orow = out + r * out_stride + g * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float v = to_f32(xr[i]);
    if (!norm_before_gate) v *= activate<Act::kSilu>(to_f32(zr[i]));
    ss += v * v;
  }
  ss = detail::block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    orow[i] = from_f32<T>(to_f32(xr[i]) * activate<Act::kSilu>(to_f32(zr[i])) * inv *
                          to_f32(wr[i]));
}

// The same for groups of at most kGatedWarpMaxD values (Gated DeltaNet's 128): one warp a
// (row, group), kGatedWarps groups a block, a lane's values of x and z kept in registers from
// the sum of squares to the output. (A block a group, reading x and z twice, took 320 us a
// Qwen3.5 layer at 8192 tokens x 32 heads of 128 on an H100, 5x its bytes' time; 11 us in a
// batch-8 decode step.)
constexpr int kGatedWarpMaxD = 256, kGatedWarps = 8;

template <typename T, typename W>
__global__ void rms_norm_gated_warp_kernel(T* out, const T* x, const T* z, const W* w,
                                           int64_t d, int64_t groups, int64_t items,
                                           int64_t w_group_stride, int64_t out_stride,
                                           int64_t x_stride, int64_t z_stride, float eps,
                                           bool norm_before_gate) {
  pdl_begin();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kGatedWarps + threadIdx.x / 32;
  if (item >= items) return;  // (a whole warp: the sum below takes every lane)
  const int lane = threadIdx.x % 32;
  const int64_t r = item / groups, g = item % groups;
  const T* xr = x + r * x_stride + g * d;
  const T* zr = z + r * z_stride + g * d;
  const W* wr = w + g * w_group_stride;
  T* orow = out + r * out_stride + g * d;
  constexpr int kPer = kGatedWarpMaxD / 32;
  float xv[kPer], zv[kPer], ss = 0.0f;
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int64_t i = lane + p * 32;
    xv[p] = i < d ? to_f32(xr[i]) : 0.f;
    zv[p] = i < d ? to_f32(zr[i]) : 0.f;
    const float v = norm_before_gate ? xv[p] : xv[p] * activate<Act::kSilu>(zv[p]);
    ss += v * v;
  }
  ss = detail::warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int64_t i = lane + p * 32;
    if (i < d)
      orow[i] = from_f32<T>(xv[p] * activate<Act::kSilu>(zv[p]) * inv * to_f32(wr[i]));
  }
}

void rms_norm_gated(const Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w,
                    float eps, int64_t group_size, bool norm_before_gate) {
  // The shapes are the op's contract (csrc/ops.cpp); here the GPU's dtypes and layouts.
  const char* op = "cuda.rms_norm_gated";
  for (const Tensor* t : {&out, &x, &z}) check_rows(*t, op, "out, x and z");
  check_act(x, op, "x");
  check_on_device(w, op, "w");
  VLLMX_CHECK(out.dtype == x.dtype && z.dtype == x.dtype, op,
              "out and z must have x's dtype " + x.str());
  VLLMX_CHECK(w.is_contiguous() && (w.dtype == DType::F32 || w.dtype == x.dtype), op,
              "w " + w.str() + " must be contiguous, f32 or x's dtype");
  const int64_t d = group_size, groups = x.shape[1] / d, rows = x.shape[0];
  if (rows == 0 || d == 0) return;
  const int64_t items = rows * groups, w_group_stride = w.shape[0] == d ? int64_t{0} : d;
  dispatch_float(x.dtype, op, [&](auto xv) {
    using T = decltype(xv);
    auto run = [&](auto wv) {
      using W = decltype(wv);
      if (d <= kGatedWarpMaxD) {
        launch(rms_norm_gated_warp_kernel<T, W>,
               static_cast<unsigned>((items + kGatedWarps - 1) / kGatedWarps), kGatedWarps * 32,
               0, stream(), out.ptr<T>(), x.ptr<T>(), z.ptr<T>(), w.ptr<W>(), d, groups, items,
               w_group_stride, out.stride[0], x.stride[0], z.stride[0], eps, norm_before_gate);
        return;
      }
      launch(rms_norm_gated_kernel<T, W>, static_cast<unsigned>(items), threads_for(d / 4), 0,
             stream(), out.ptr<T>(), x.ptr<T>(), z.ptr<T>(), w.ptr<W>(), d, groups,
             w_group_stride, out.stride[0], x.stride[0], z.stride[0], eps, norm_before_gate);
    };
    if (w.dtype == DType::F32)
      run(float{});
    else
      run(T{});
  });
  check_launch(op);
}

}  // namespace

VLLMX_KERNEL(causal_conv1d, kCUDA, causal_conv1d);
VLLMX_KERNEL(gated_delta_rule, kCUDA, gated_delta_rule);
VLLMX_KERNEL(mamba2_scan, kCUDA, mamba2_scan);
VLLMX_KERNEL(rms_norm_gated, kCUDA, rms_norm_gated);

}  // namespace vllmx::cuda
