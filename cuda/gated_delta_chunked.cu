// gated_delta_rule's prefill on the tensor cores: Gated DeltaNet's recurrence over chunks of
// kC tokens in the form FLA's chunk_gated_delta_rule runs (WY representation), for the
// sequences of a step with at least kChunkedMinTokens tokens; linear_attn.cu's kernel walks the
// others (decode rows, speculative verify steps) token by token. Token by token a warp takes
// ~1 us a token whatever the batch: 1.1 ms a Qwen3.5-35B-A3B layer for one 1024-token prompt,
// 2.9 ms for eight, on an H100.
//
// Within a chunk (tokens t = 0..C-1, state S0 [dk, dv] before it, G_t the cumulative log decay,
// beta_t the write strength, q and k L2-normalized, q / sqrt(dk)):
//   A[t][s] = beta_t e^(G_t - G_s) k_t.k_s for s < t, else 0;  T = (I + A)^-1
//   U = T (beta (V - e^G (K S0)))                 the chunk's delta-rule writes
//   O = e^G (Q S0) + P U,  P[t][s] = e^(G_t - G_s) q_t.k_s for s <= t, else 0
//   S = e^(G_last) S0 + (e^(G_last - G) K)^T U
// which is the token-by-token recurrence exactly (checked in f64). One CTA a (value head,
// sequence, kNv state columns): a state's columns never mix, so the columns split across CTAs
// (each computes the chunk's A, P and T again: a small share). Eight warps (four, one a
// scheduler, ran ~30 us a chunk on an H100, five times its mma count's time); the state slice,
// the chunk's q, k and v and the C x C matrices in shared memory as f32; every product on
// mma.sync m16n8k8 in TF32 with f32 accumulation (10-bit mantissas: outputs within ~1e-3 and
// states within ~5e-4 of the f32 recurrence for random inputs, on bf16 / f16 activations whose
// own rounding is 4e-3 / 5e-4; f32 activations keep the exact token-by-token kernel). T by
// 16 x 16 blocks (block_solve; a thread a column of the whole took 387 us where this takes 352
// for one 1024-token sequence of Qwen3.5-35B-A3B's heads on an H100, 1,540 / 1,434 for eight,
// at 142 registers instead of 214). The next chunk's q, k and v come in by cp.async while one
// is worked on.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda_ops.h"
#include "cuda_util.cuh"
#include "mma.cuh"

namespace vllmx::cuda {
namespace {

using namespace detail;

constexpr int kC = 64;        // tokens a chunk
constexpr int kDk = 128;      // key rows (a smaller key head size: zero rows)
constexpr int kNv = 64;       // state columns a CTA
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Row strides in floats: 4 mod 32 where a warp's fragment loads step down rows (A operands, and
// B operands read transposed), 8 mod 32 where they step along a row (row-major B operands), so
// that the 32 lanes' loads fall in 32 banks.
constexpr int kQK = kDk + 4, kCC = kC + 4, kSV = kNv + 8;
// The warps' tiles: 16 x 32 of the C x C and C x kNv products (four row tiles by two column
// halves), 16 state rows each of the update.
static_assert(kC == 64 && kNv == 64 && kWarps == 8 && kWarps * 16 == kDk, "the warps' tiles");

struct Smem {
  float q[kC][kQK];   // normalized q / sqrt(dk)
  float k[kC][kQK];   // normalized k; row s times e^(G_last - G_s) for the state's update
  float s[kDk][kSV];  // the state slice
  float v[kC][kSV];   // v, then R = beta (V - e^G K S0), then U
  float a[kC][kCC];   // A
  float tm[kC][kCC];  // T = (I + A)^-1
  float p[kC][kCC];   // P
  float g[kC], beta[kC];
  uint32_t raw_q[kC][kDk / 2], raw_k[kC][kDk / 2], raw_v[kC][kNv / 2];  // the next chunk
};

// acc[n] += A[16, K] B[K, 8n..8n+7] for one warp, A(r, c) = a[r AR + c AC] and B(r, c) =
// b[r BR + c BC] in shared memory; acc[n] is an m16n8 accumulator (mma1688_tf32's layout).
template <int NT, int K, int AR, int AC, int BR, int BC>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const float* a, const float* b) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    const uint32_t af[4] = {to_tf32(a[g * AR + (k0 + t) * AC]),
                            to_tf32(a[(g + 8) * AR + (k0 + t) * AC]),
                            to_tf32(a[g * AR + (k0 + t + 4) * AC]),
                            to_tf32(a[(g + 8) * AR + (k0 + t + 4) * AC])};
#pragma unroll
    for (int n = 0; n < NT; ++n)
      mma1688_tf32(acc[n], af, to_tf32(b[(k0 + t) * BR + (n * 8 + g) * BC]),
                   to_tf32(b[(k0 + t + 4) * BR + (n * 8 + g) * BC]));
  }
}

// f(n, e, row, col) for each value of a warp's 16 x 8 NT accumulators (rows from r0, columns
// from c0).
template <int NT, typename F>
__device__ __forceinline__ void for_acc(int r0, int c0, F&& f) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      f(n, e, r0 + (lane >> 2) + (e >> 1) * 8, c0 + n * 8 + 2 * (lane & 3) + (e & 1));
}

// T = (I + A)^-1 by 16 x 16 blocks (A strictly lower triangular, so T is lower triangular
// with unit diagonal blocks' inverses on its diagonal): the four diagonal blocks by forward
// substitution, a thread a column of one (16 steps where one thread a column of the whole
// takes 64), then the blocks below them a block diagonal at a time,
//   T_ij = -T_ii X_ij,  X_ij = sum_{j <= m < i} A_im T_mj,
// each entry a short dot by one of all the CTA's threads. X goes to A's zero blocks above the
// diagonal in block row 0 (A is read nowhere after T; the next chunk writes them zero again);
// T's blocks above the diagonal stay as the kernel's start left them, zero.
constexpr int kB = 16;  // block_solve's block size
__device__ __forceinline__ void block_solve(Smem& sm, int tid) {
  if (tid < kC) {
    const int base = (tid / kB) * kB, c = tid % kB;
    float x[kB];
#pragma unroll
    for (int t = 0; t < kB; ++t) {
      float p2[2] = {t == c ? 1.f : 0.f, 0.f};
#pragma unroll
      for (int u = 0; u < t; ++u)
        p2[u & 1] = fmaf(-sm.a[base + t][base + u], x[u], p2[u & 1]);
      x[t] = p2[0] + p2[1];
      sm.tm[base + t][base + c] = x[t];
    }
  }
  __syncthreads();
#pragma unroll 1
  for (int d = 1; d < kC / kB; ++d) {
    const int entries = (kC / kB - d) * kB * kB;  // blocks (i, i - d), i = d .. 3
    for (int e = tid; e < entries; e += kThreads) {
      const int j = e / (kB * kB), i = j + d, r = (e / kB) % kB, c = e % kB;
      float acc = 0.f;
      for (int m = j; m < i; ++m) {
#pragma unroll
        for (int u = 0; u < kB; ++u)
          acc = fmaf(sm.a[i * kB + r][m * kB + u], sm.tm[m * kB + u][j * kB + c], acc);
      }
      sm.a[r][(j + 1) * kB + c] = acc;  // X_ij in block (0, j + 1)
    }
    __syncthreads();
    for (int e = tid; e < entries; e += kThreads) {
      const int j = e / (kB * kB), i = j + d, r = (e / kB) % kB, c = e % kB;
      float acc = 0.f;
#pragma unroll
      for (int u = 0; u < kB; ++u)
        acc = fmaf(sm.tm[i * kB + r][i * kB + u], sm.a[u][(j + 1) * kB + c], acc);
      sm.tm[i * kB + r][j * kB + c] = -acc;
    }
    __syncthreads();
  }
}

// ST: the state's element type, f32 or T (linear_attn.cu's kernel: why).
template <typename T, typename ST>
__global__ void __launch_bounds__(kThreads, 1) gated_delta_chunked_kernel(
    T* __restrict__ out, int64_t out_stride, ST* __restrict__ state, int64_t slots,
    const T* __restrict__ q, const T* __restrict__ k, int64_t qk_stride, const T* __restrict__ v,
    int64_t v_stride, const T* __restrict__ a, const T* __restrict__ b, int64_t ab_stride,
    const float* __restrict__ A_log, const float* __restrict__ dt_bias, int hv, int hk, int dk,
    int dv, const int32_t* __restrict__ qsl, const int32_t* __restrict__ idx,
    const int32_t* __restrict__ init) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  extern __shared__ float4 gdn_smem[];
  Smem& sm = *reinterpret_cast<Smem*>(gdn_smem);
  pdl_begin();
  const int h = blockIdx.x, seq = blockIdx.y, j0 = blockIdx.z * kNv;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // A warp's tile of the C x C and C x kNv products: 16 rows, 32 columns.
  const int r0 = (warp % 4) * 16, cb = (warp / 4) * 32;
  const int64_t t0 = qsl[seq], n = qsl[seq + 1] - t0, slot = idx[seq];
  if (n < kChunkedMinTokens || slot < 0 || slot >= slots) return;  // (the other kernel's)
  const int64_t kcol = static_cast<int64_t>(h / (hv / hk)) * dk;
  const T* qh = q + t0 * qk_stride + kcol;
  const T* kh = k + t0 * qk_stride + kcol;
  const T* vh = v + t0 * v_stride + static_cast<int64_t>(h) * dv + j0;
  ST* st = state + (slot * hv + h) * static_cast<int64_t>(dk) * dv + j0;

  // Chunk c0's q, k and v rows as stored, in pairs (dk and dv even), zeros past the sequence
  // and the head sizes; its a and b in registers of threads 0..kC-1.
  float a_next = 0.f, b_next = 0.f;
  auto fetch = [&](int64_t c0) {
    for (int e = tid; e < kC * kDk / 2; e += kThreads) {
      const int r = e / (kDk / 2), c = e % (kDk / 2);
      const bool ok = c0 + r < n && 2 * c < dk;
      const int64_t off = ok ? (c0 + r) * qk_stride + 2 * c : 0;
      cp_async4(&sm.raw_q[r][c], qh + off, ok);
      cp_async4(&sm.raw_k[r][c], kh + off, ok);
    }
    for (int e = tid; e < kC * kNv / 2; e += kThreads) {
      const int r = e / (kNv / 2), c = e % (kNv / 2);
      const bool ok = c0 + r < n && j0 + 2 * c < dv;
      cp_async4(&sm.raw_v[r][c], vh + (ok ? (c0 + r) * v_stride + 2 * c : 0), ok);
    }
    cp_async_commit();
    if (tid < kC && c0 + tid < n) {
      a_next = to_f32(a[(t0 + c0 + tid) * ab_stride + h]);
      b_next = to_f32(b[(t0 + c0 + tid) * ab_stride + h]);
    }
  };
  fetch(0);
  const bool from_slot = init[seq] != 0;
  for (int e = tid; e < kDk * kNv; e += kThreads) {
    const int i = e / kNv, j = e % kNv;
    sm.s[i][j] =
        from_slot && i < dk && j0 + j < dv ? to_f32(st[static_cast<int64_t>(i) * dv + j]) : 0.f;
  }
  const float neg_a = -expf(A_log[h]), qscale = rsqrtf(static_cast<float>(dk)), dtb = dt_bias[h];
  // (block_solve writes T's blocks on and below the diagonal; those above stay zero)
  for (int e = tid; e < kC * kC; e += kThreads) sm.tm[e / kC][e % kC] = 0.f;

  for (int64_t c0 = 0; c0 < n; c0 += kC) {
    const int m = static_cast<int>(n - c0 < kC ? n - c0 : kC);
    cp_async_wait<0>();
    __syncthreads();
    // q and k normalized (FLA's l2norm as transformers writes it: x / sqrt(sum x^2 + 1e-6)),
    // v to f32: a warp a row, a lane two pairs of q and k and one of v.
    for (int r = warp; r < kC; r += kWarps) {
      float qf[4], kf[4], ssq = 0.f, ssk = 0.f;
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        unpack2(sm.raw_q[r][lane + 32 * p], kBf16, qf[2 * p], qf[2 * p + 1]);
        unpack2(sm.raw_k[r][lane + 32 * p], kBf16, kf[2 * p], kf[2 * p + 1]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) ssq = fmaf(qf[i], qf[i], ssq), ssk = fmaf(kf[i], kf[i], ssk);
      const float iq = qscale / sqrtf(warp_sum(ssq) + 1e-6f);
      const float ik = 1.f / sqrtf(warp_sum(ssk) + 1e-6f);
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const int c = 2 * (lane + 32 * p);
        *reinterpret_cast<float2*>(&sm.q[r][c]) = make_float2(qf[2 * p] * iq, qf[2 * p + 1] * iq);
        *reinterpret_cast<float2*>(&sm.k[r][c]) = make_float2(kf[2 * p] * ik, kf[2 * p + 1] * ik);
      }
      float v0, v1;
      unpack2(sm.raw_v[r][lane], kBf16, v0, v1);
      *reinterpret_cast<float2*>(&sm.v[r][2 * lane]) = make_float2(v0, v1);
    }
    // Log decays (their prefix sums) and write strengths; rows past the sequence neither decay
    // nor write.
    if (tid < kC) {
      float gl = 0.f, bt = 0.f;
      if (tid < m) {
        const float x = a_next + dtb;
        gl = neg_a * softplus(x);
        bt = 1.f / (1.f + expf(-b_next));
      }
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, gl, o);
        if (lane >= o) gl += y;
      }
      sm.g[tid] = gl;
      sm.beta[tid] = bt;
    }
    __syncthreads();
    if (tid >= 32 && tid < kC) sm.g[tid] += sm.g[31];
    if (c0 + kC < n) fetch(c0 + kC);  // (the raw rows are read)
    __syncthreads();

    // A and P: the warp's tile of K K^T and Q K^T, decayed and masked.
    {
      float kk[4][4] = {}, qk[4][4] = {};
      warp_mma<4, kDk, kQK, 1, 1, kQK>(kk, &sm.k[r0][0], &sm.k[cb][0]);
      warp_mma<4, kDk, kQK, 1, 1, kQK>(qk, &sm.q[r0][0], &sm.k[cb][0]);
      for_acc<4>(r0, cb, [&](int nt, int e, int row, int col) {
        const float d = expf(fminf(sm.g[row] - sm.g[col], 0.f));  // (col > row: masked)
        sm.a[row][col] = col < row ? sm.beta[row] * d * kk[nt][e] : 0.f;
        sm.p[row][col] = col <= row ? d * qk[nt][e] : 0.f;
      });
    }
    // R = beta (V - e^G K S0), in place of the warp's tile of V.
    {
      float ks[4][4] = {};
      warp_mma<4, kDk, kQK, 1, kSV, 1>(ks, &sm.k[r0][0], &sm.s[0][cb]);
      for_acc<4>(r0, cb, [&](int nt, int e, int row, int col) {
        sm.v[row][col] = sm.beta[row] * (sm.v[row][col] - expf(sm.g[row]) * ks[nt][e]);
      });
    }
    __syncthreads();
    block_solve(sm, tid);
    __syncthreads();
    // U = T R, into V's place once every warp has read R.
    {
      float u[4][4] = {};
      warp_mma<4, kC, kCC, 1, kSV, 1>(u, &sm.tm[r0][0], &sm.v[0][cb]);
      __syncthreads();
      for_acc<4>(r0, cb, [&](int nt, int e, int row, int col) { sm.v[row][col] = u[nt][e]; });
    }
    __syncthreads();
    // O = e^G (Q S0) + P U for the warp's tile.
    {
      float o[4][4] = {};
      warp_mma<4, kDk, kQK, 1, kSV, 1>(o, &sm.q[r0][0], &sm.s[0][cb]);
      for_acc<4>(r0, cb, [&](int nt, int e, int row, int) { o[nt][e] *= expf(sm.g[row]); });
      warp_mma<4, kC, kCC, 1, kSV, 1>(o, &sm.p[r0][0], &sm.v[0][cb]);
      for_acc<4>(r0, cb, [&](int nt, int e, int row, int col) {
        if (row < m && j0 + col < dv)
          out[(t0 + c0 + row) * out_stride + static_cast<int64_t>(h) * dv + j0 + col] =
              from_f32<T>(o[nt][e]);
      });
    }
    const float glast = sm.g[kC - 1];
    __syncthreads();  // every warp has read S0 and K
    for (int r = warp; r < kC; r += kWarps) {
      const float f = expf(glast - sm.g[r]);
      for (int i = lane; i < kDk; i += 32) sm.k[r][i] *= f;
    }
    __syncthreads();
    // S = e^(G_last) S0 + (e^(G_last - G) K)^T U: the warp's 16 state rows.
    {
      const float dlast = expf(glast);
      const int i0 = warp * 16;
      float ns[8][4];
      for_acc<8>(i0, 0,
                 [&](int nt, int e, int row, int col) { ns[nt][e] = dlast * sm.s[row][col]; });
      warp_mma<8, kC, 1, kQK, kSV, 1>(ns, &sm.k[0][i0], &sm.v[0][0]);
      for_acc<8>(i0, 0, [&](int nt, int e, int row, int col) { sm.s[row][col] = ns[nt][e]; });
    }
    __syncthreads();  // the state and the chunk's buffers, before the next chunk
  }
  for (int e = tid; e < kDk * kNv; e += kThreads) {
    const int i = e / kNv, j = e % kNv;
    if (i < dk && j0 + j < dv) st[static_cast<int64_t>(i) * dv + j] = from_f32<ST>(sm.s[i][j]);
  }
}

}  // namespace

bool gated_delta_rule_chunked(const Tensor& out, const Tensor& recurrent_state, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                              const Tensor& A_log, const Tensor& dt_bias,
                              const Tensor& query_start_loc, const Tensor& state_indices,
                              const Tensor& has_initial_state) {
  const int hv = static_cast<int>(recurrent_state.shape[1]);
  const int dk = static_cast<int>(recurrent_state.shape[2]);
  const int dv = static_cast<int>(recurrent_state.shape[3]);
  const int64_t B = state_indices.shape[0], T = q.shape[0];
  // A sequence of kChunkedMinTokens tokens needs T >= B - 1 + kChunkedMinTokens: never a
  // decode step's batch (one token a sequence, a CUDA graph's).
  if (q.dtype == DType::F32 || T < B - 1 + kChunkedMinTokens || dk > kDk || dk % 2 != 0 ||
      dv % 2 != 0)
    return false;
  for (const Tensor* t : {&q, &k, &v})
    if (!aligned(t->data, 4) || t->stride[0] % 2 != 0) return false;
  const dim3 grid(hv, static_cast<unsigned>(B), static_cast<unsigned>((dv + kNv - 1) / kNv));
  const int smem = static_cast<int>(sizeof(Smem));
  if (smem > detail::max_smem_optin()) return false;  // (211 KB: Hopper's 227 KB, not an A100's)
  dispatch_float(q.dtype, "cuda.gated_delta_rule", [&](auto e) {
    using T_ = decltype(e);
    if constexpr (!std::is_same_v<T_, float>) {
      auto go = [&](auto st) {
        using ST = decltype(st);
        static const bool smem_ok =
            (allow_smem(gated_delta_chunked_kernel<T_, ST>, smem), true);
        (void)smem_ok;
        launch(gated_delta_chunked_kernel<T_, ST>, grid, kThreads, smem, stream(),
               out.ptr<T_>(), out.stride[0], recurrent_state.ptr<ST>(), recurrent_state.shape[0],
               q.ptr<T_>(), k.ptr<T_>(), q.stride[0], v.ptr<T_>(), v.stride[0], a.ptr<T_>(),
               b.ptr<T_>(), a.stride[0], A_log.ptr<float>(), dt_bias.ptr<float>(), hv,
               static_cast<int>(q.shape[1] / dk), dk, dv, query_start_loc.ptr<int32_t>(),
               state_indices.ptr<int32_t>(), has_initial_state.ptr<int32_t>());
      };
      dispatch_state<T_>(recurrent_state.dtype, go);
    }
  });
  return true;
}

}  // namespace vllmx::cuda
