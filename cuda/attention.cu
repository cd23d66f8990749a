// paged_attention on the GPU: varlen causal attention over vLLM's flash-layout paged cache
// [num_blocks, block_size, num_kv_heads, head_size], GQA, sliding window, logits soft cap.
//
// The query rows of one (sequence, kv head) are flattened as (token, head of the group), so the
// G query heads sharing a kv head share every K/V tile load. A tile of 16 * WARPS such rows runs
// FlashAttention-2 style (attend_rows): K/V tiles of 64 keys double-buffered by cp.async, S = QK^T
// and O += PV on the tensor cores (mma.sync m16n8k16, f32 accumulate), online softmax in f32
// registers (base-2 exponent).
// - prefill_kernel: sequences with >= 2 queries, 4 warps per CTA; the CTAs' (sequence, row
//   tile) list is built on the device by schedule_kernel, so the host never reads
//   query_start_loc / seq_lens (no sync; the op can be captured in a CUDA graph).
// - decode_kernel (attention_decode.cu): sequences with exactly 1 query, flash-decoding in one
//   kernel.
// - attention_generic_kernel: f32 caches or q/out, other head sizes, unaligned tensors; plain f32
//   CUDA-core code, one CTA per (query row, head): the scalar twin.
// All policy (which path, how many splits, scratch sizes) lives in plan_attention() on the host.
#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attention.cuh"
#include "core/op_table.h"
#include "cuda_util.cuh"
#include "mma.cuh"

namespace vllmx::cuda {

namespace {

using namespace detail;
using namespace attn;

constexpr const char* kOp = "paged_attention";
constexpr int kBN = 64;             // keys per K/V tile
constexpr int kPrefillWarps = 4;    // prefill CTA: 64 query rows
constexpr int kGenericThreads = 128;
constexpr int kGenericMaxD = 1024;

// ------------------------------------------------------------------ the tensor-core tile

template <int D, int WARPS>
constexpr int attn_smem_bytes() {
  return (WARPS * 16 + 4 * kBN) * (D + 8) * 2;  // Q + 2 stages of K and V
}

// Rows row_start .. row_start + 16 * WARPS of (sequence b, kv head g) against keys
// [kbeg, kend) (kbeg < kend), normalized output to out.
template <int D, typename KV, int WARPS>
__device__ __forceinline__ void attend_rows(const AttnArgs& a, int b, int g, int row_start,
                                            int q_len, int kbeg, int kend) {
  constexpr int NT = WARPS * 32, BM = WARPS * 16, LD = D + 8, CPR = D / 8;
  constexpr bool kKvBf = std::is_same_v<KV, __nv_bfloat16>;
  extern __shared__ uint4 attn_smem[];
  KV* Qs = reinterpret_cast<KV*>(attn_smem);
  KV* Ks = Qs + BM * LD;
  KV* Vs = Ks + 2 * kBN * LD;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int G = a.G;
  const int seq_len = a.seq_lens[b], q0 = a.qsl[b], ctx_start = seq_len - q_len;
  const int R = q_len * G;

  // Q tile -> shared memory, converted to the cache dtype (the mma takes one type).
  for (int i = tid; i < BM * CPR; i += NT) {
    const int r = i / CPR, c = i % CPR, f = row_start + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (f < R) {
      const int tok = f / G, head = g * G + f % G;
      const uint16_t* src = static_cast<const uint16_t*>(a.q) + (q0 + tok) * a.q_stride +
                            static_cast<int64_t>(head) * D + c * 8;
      v = *reinterpret_cast<const uint4*>(src);
      if (a.q_bf16 != kKvBf) {
        float f8[8];
        unpack8(v, a.q_bf16, f8);
        v = pack8(f8, kKvBf);
      }
    }
    *reinterpret_cast<uint4*>(Qs + r * LD + c * 8) = v;
  }

  const int32_t* bt_row = a.bt + static_cast<int64_t>(b) * a.bt_stride;
  auto load_kv = [&](int k0, int st) {
    load_kv_tile<D, kBN, NT>(a, bt_row, g, k0, kend, Ks + st * kBN * LD, Vs + st * kBN * LD);
  };

  // This thread's two rows (lane / 4 and lane / 4 + 8 of its warp's 16).
  int pos[2], lo[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int f = row_start + warp * 16 + lane / 4 + h * 8;
    pos[h] = ctx_start + f / G;
    lo[h] = visible_lo(pos[h], a.window);
  }
  // CTA-uniform bounds that let whole tiles skip the mask.
  const int pos_first = ctx_start + row_start / G;
  const int lo_last = visible_lo(ctx_start + min(R - 1, row_start + BM - 1) / G, a.window);

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t qf[D / 16][4];
  const float scale_log2 = a.scale * kLog2e;

  const int ntiles = (kend - kbeg + kBN - 1) / kBN;
  load_kv(kbeg, 0);
  for (int t = 0; t < ntiles; ++t) {
    const int st = t & 1, k0 = kbeg + t * kBN;
    if (t + 1 < ntiles) {
      load_kv(k0 + kBN, st ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk], Qs + (warp * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
    }

    // S = Q K^T for this warp's 16 rows x 64 keys.
    float s[kBN / 8][4];
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = 0.f;
    const KV* kt = Ks + st * kBN * LD;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < kBN / 16; ++np) {
        uint32_t r4[4];
        ldmatrix_x4(r4, kt + (np * 16 + lane % 8 + (lane / 16) * 8) * LD + kk * 16 +
                            ((lane / 8) % 2) * 8);
        mma16816<KV>(s[2 * np], qf[kk], r4[0], r4[1]);
        mma16816<KV>(s[2 * np + 1], qf[kk], r4[2], r4[3]);
      }

    // Scale (base 2), soft cap, mask.
    const bool need_mask =
        k0 + kBN > kend || k0 + kBN - 1 > pos_first || (a.window > 0 && k0 < lo_last);
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e];
        x = a.cap > 0.f ? a.cap * tanhf(x * a.scale / a.cap) * kLog2e : x * scale_log2;
        if (need_mask) {
          const int col = k0 + nt * 8 + (lane % 4) * 2 + (e & 1), h = e / 2;
          if (!(col < kend && col <= pos[h] && col >= lo[h])) x = -INFINITY;
        }
        s[nt][e] = x;
      }

    // Online softmax: a row's 64 scores sit in the 4 lanes of a quad.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mnew = fmaxf(m[h], mx);
      const float base = mnew == -INFINITY ? 0.f : mnew;  // a row with nothing visible yet
      const float corr = exp2f(m[h] - base);
      m[h] = mnew;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) {
        s[nt][2 * h] = exp2f(s[nt][2 * h] - base);
        s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - base);
        sum += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      l[h] = l[h] * corr + sum;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * h] *= corr;
        o[dt][2 * h + 1] *= corr;
      }
    }

    // O += P V: the S accumulators of two adjacent key octets are an A fragment.
    const KV* vt = Vs + st * kBN * LD;
#pragma unroll
    for (int j = 0; j < kBN / 16; ++j) {
      uint32_t pa[4];
      pa[0] = F16Ops<KV>::pack2(s[2 * j][0], s[2 * j][1]);
      pa[1] = F16Ops<KV>::pack2(s[2 * j][2], s[2 * j][3]);
      pa[2] = F16Ops<KV>::pack2(s[2 * j + 1][0], s[2 * j + 1][1]);
      pa[3] = F16Ops<KV>::pack2(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t r4[4];
        ldmatrix_x4_trans(r4, vt + (j * 16 + lane % 8 + ((lane / 8) % 2) * 8) * LD + dp * 16 +
                                  (lane / 16) * 8);
        mma16816<KV>(o[2 * dp], pa, r4[0], r4[1]);
        mma16816<KV>(o[2 * dp + 1], pa, r4[2], r4[3]);
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this stage
  }

  store_rows<D>(
      a, [&](int dt, int h) { return make_float2(o[dt][2 * h], o[dt][2 * h + 1]); }, l, m, 1.f,
      row_start + warp * 16, R, G, g, q0, lane);
}

// ------------------------------------------------------------------ kernels

// One CTA: prefix sum over sequences of their prefill row tiles (q_len >= 2).
__global__ void __launch_bounds__(1024) schedule_kernel(AttnArgs a, int bm) {
  pdl_begin();
  __shared__ int warp_sums[32];
  __shared__ int carry;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
  if (tid == 0) carry = 0;
  __syncthreads();
  for (int base = 0; base < a.B; base += blockDim.x) {
    const int b = base + tid;
    int cnt = 0, q_len = 0;
    if (b < a.B) {
      q_len = a.qsl[b + 1] - a.qsl[b];
      if (q_len >= 2) cnt = (q_len * a.G + bm - 1) / bm;
    }
    int v = cnt;  // inclusive scan within the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += n;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
      int ws = lane < nwarps ? warp_sums[lane] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, ws, o);
        if (lane >= o) ws += n;
      }
      warp_sums[lane] = ws;
    }
    __syncthreads();
    const int start = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + v - cnt;
    for (int i = 0; i < cnt; ++i) a.tiles[start + i] = make_int2(b, i * bm);
    __syncthreads();
    if (tid == 0) carry += warp_sums[nwarps - 1];
    __syncthreads();
  }
  if (tid == 0) {
    a.num_tiles[0] = carry;
    a.num_tiles[1] = 0;
  }
}

template <int D, typename KV>
__global__ void __launch_bounds__(kPrefillWarps * 32) prefill_kernel(AttnArgs a) {
  pdl_begin();
  if (static_cast<int>(blockIdx.x) >= *a.num_tiles) return;
  const int2 tile = a.tiles[blockIdx.x];
  const int b = tile.x, row_start = tile.y, g = blockIdx.y;
  const int q_len = a.qsl[b + 1] - a.qsl[b];
  const int ctx_start = a.seq_lens[b] - q_len;
  const int R = q_len * a.G;
  const int first_tok = row_start / a.G;
  const int last_tok = min(R - 1, row_start + kPrefillWarps * 16 - 1) / a.G;
  const int kbeg = visible_lo(ctx_start + first_tok, a.window);
  const int kend = ctx_start + last_tok + 1;
  attend_rows<D, KV, kPrefillWarps>(a, b, g, row_start, q_len, kbeg, kend);
}

// One element of an f32 / f16 / bf16 array as f32.
__device__ __forceinline__ float load_any(const void* p, int64_t i, DType dt) {
  if (dt == DType::F32) return static_cast<const float*>(p)[i];
  return bits_to_float(static_cast<const uint16_t*>(p)[i], dt == DType::BF16);
}

__device__ float block_reduce(float v, bool is_max, float* red) {
  v = is_max ? warp_max(v) : warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red is reused across calls
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kGenericThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

// grid (T, nq), kGenericThreads each; dynamic smem: D floats of q.
__global__ void __launch_bounds__(kGenericThreads) attention_generic_kernel(AttnArgs a,
                                                                           DType cache_code,
                                                                           DType q_code,
                                                                           DType out_code) {
  pdl_begin();
  extern __shared__ float q_s[];
  __shared__ float p_s[kGenericThreads];
  __shared__ int64_t off_s[kGenericThreads];
  __shared__ float red[kGenericThreads / 32];
  const int t = blockIdx.x, head = blockIdx.y, tid = threadIdx.x, D = a.D;
  // The sequence owning row t: the last b with qsl[b] <= t (qsl is non-decreasing).
  int lo_b = 0, hi_b = a.B;  // invariant: qsl[lo_b] <= t < qsl[hi_b]
  while (hi_b - lo_b > 1) {
    const int mid = (lo_b + hi_b) / 2;
    if (a.qsl[mid] <= t) lo_b = mid; else hi_b = mid;
  }
  const int b = lo_b, g = head / a.G;
  const int q_len = a.qsl[b + 1] - a.qsl[b];
  const int pos = a.seq_lens[b] - q_len + (t - a.qsl[b]);
  const int lo = visible_lo(pos, a.window);
  for (int d = tid; d < D; d += kGenericThreads)
    q_s[d] = load_any(a.q, t * a.q_stride + static_cast<int64_t>(head) * D + d, q_code);
  constexpr int kPer = kGenericMaxD / kGenericThreads;
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int32_t* bt_row = a.bt + static_cast<int64_t>(b) * a.bt_stride;
  for (int k0 = lo; k0 <= pos; k0 += kGenericThreads) {
    const int j = k0 + tid;
    float s = -INFINITY;
    __syncthreads();  // q_s written / p_s and off_s of the previous chunk consumed
    if (j <= pos) {
      const int64_t blk = bt_row[j / a.block_size];
      const int64_t off = ((blk * a.block_size + j % a.block_size) * a.nkv + g) * D;
      off_s[tid] = off;
      float dot = 0.f;
      for (int d = 0; d < D; ++d) dot = fmaf(q_s[d], load_any(a.kc, off + d, cache_code), dot);
      s = dot * a.scale;
      if (a.cap > 0.f) s = a.cap * tanhf(s / a.cap);
    }
    const float mnew = fmaxf(m, block_reduce(s, true, red));  // finite: key k0 is visible
    const float p = j <= pos ? expf(s - mnew) : 0.f;
    const float corr = expf(m - mnew);
    p_s[tid] = p;
    l = l * corr + block_reduce(p, false, red);
    m = mnew;
    __syncthreads();
    const int n = min(kGenericThreads, pos - k0 + 1);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int d = tid + i * kGenericThreads;
      if (d < D) {
        float x = acc[i] * corr;
        for (int jj = 0; jj < n; ++jj)
          x = fmaf(p_s[jj], load_any(a.vc, off_s[jj] + d, cache_code), x);
        acc[i] = x;
      }
    }
  }
  // (natural units here: the sink's own logit)
  const float inv = 1.f / (l + (a.sinks == nullptr ? 0.f : expf(a.sinks[head] - m)));
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = tid + i * kGenericThreads;
    if (d >= D) continue;
    const int64_t idx = t * a.out_stride + static_cast<int64_t>(head) * D + d;
    if (out_code == DType::F32)
      static_cast<float*>(a.out)[idx] = acc[i] * inv;
    else
      static_cast<uint16_t*>(a.out)[idx] = float_to_bits(acc[i] * inv, out_code == DType::BF16);
  }
}

// ------------------------------------------------------------------ host: plan and launch

std::string i2s(int64_t v) { return std::to_string(v); }

struct AttnPlan {
  bool tensor_cores = false;
  bool prefill_sm90 = false;  // prefill on wgmma (attention_prefill_sm90.cu)
  bool prefill_ws = false;    // long prompts' prefill kernel (attention_prefill_ws_sm90.cu)
  bool mla = false;           // multi-head latent attention's kernel (attention_mla.cu)
  int prefill_rows = kPrefillWarps * 16;  // flattened query rows per prefill CTA
  int max_splits = 1;      // decode partitions per sequence at most
  int balanced_ctas = 0;   // > 0: the balanced decode kernel on this many CTAs
  int head_groups = 1;     // decode CTAs per kv head (kDecMaxG query heads each)
  int prefill_tiles = 0;   // upper bound on prefill CTAs along x
  size_t tiles_bytes = 0;  // scratch: tile list + its count
  size_t part_bytes = 0;   // scratch: split partials
};

// set_attention_tuning's decode kernel (-1: the planner's).
constexpr int kDecodeSplit = 0, kDecodeBalanced = 1;
int g_decode_kernel = -1;

AttnPlan plan_attention(const Tensor& out, const Tensor& q, const Tensor& kc, const Tensor& vc,
                        const AttnArgs& a, int64_t max_ctx, int64_t max_query_len) {
  AttnPlan p;
  const int64_t T = a.T, B = a.B, nq = a.nq, nkv = a.nkv, D = a.D, window = a.window;
  const bool half_io = (q.dtype == DType::F16 || q.dtype == DType::BF16) &&
                       (out.dtype == DType::F16 || out.dtype == DType::BF16);
  const bool half_cache = kc.dtype == DType::F16 || kc.dtype == DType::BF16;
  const bool tc_io = half_io && half_cache && aligned(q.data, 16) && q.stride[0] % 8 == 0 &&
                     aligned(out.data, 4) && out.stride[0] % 2 == 0 && aligned(kc.data, 16);
  // MLA: one kv head whose rows are the keys and the values (one cache), no window, cap or
  // sinks (DeepSeek's and Kimi's have none). A CTA a token's 16 heads, one an SM (171 KB of
  // shared memory): partitions only while the tokens' CTAs leave SMs idle.
  p.head_groups = static_cast<int>((nq + kDecMaxG - 1) / kDecMaxG);
  p.mla = tc_io && D == kMlaHeadSize && nkv == 1 && vc.data == kc.data && window == 0 &&
          a.cap == 0.f && a.sinks == nullptr && T * p.head_groups < INT_MAX;
  if (p.mla) {
    int64_t splits = num_sms() / std::max<int64_t>(1, T * p.head_groups);
    splits = std::min(splits, (max_ctx + kMinPartition - 1) / kMinPartition);
    p.max_splits = static_cast<int>(std::clamp<int64_t>(splits, 1, kMaxSplits));
    if (p.max_splits > 1)
      p.part_bytes = static_cast<size_t>(T) * nq * p.max_splits * (D + 1) * sizeof(float);
    return p;
  }
  bool sm90 = false;
#ifdef VLLMX_WITH_SM90_ATTENTION
  sm90 = sm90_kernels();
#endif
  // Head size 256 (Gemma 2 / 3, Qwen3-Next, Qwen3.5) on Hopper only: its wgmma prefill tile
  // and its decode stages (165 and 207 KB of shared memory) fit no other GPU's CTA.
  p.tensor_cores = tc_io && (D == 64 || D == 128 || (D == 256 && sm90)) && B <= 65535 &&
                   nkv * ((nq / nkv + kDecMaxG - 1) / kDecMaxG) <= 65535;
  if (!p.tensor_cores) return p;
  const int64_t G = nq / nkv;
  if (sm90) {
    p.prefill_sm90 = true;
    p.prefill_rows = kSm90PrefillRows;
    // Long prompts: the warp-specialized kernel, whose pipeline needs many key tiles a CTA to
    // pay off (a batch whose longest query is unknown, 0, keeps the other) and its K/V tiles
    // as TMA boxes of a block's rows.
    if (D == 128 && max_query_len >= kWsPrefillMinQueryLen && ws_box_rows(a.block_size) > 0) {
      p.prefill_ws = true;
      p.prefill_rows = kWsPrefillRows;
    }
  }
  // Prefill CTAs: sum over sequences of ceil(q_len * G / bm) <= T * G / bm + (sequences with
  // q_len >= 2, at most T / 2).
  const int64_t bm = p.prefill_rows;
  p.prefill_tiles = T >= 2 ? static_cast<int>((T * G + bm - 1) / bm + std::min(B, T / 2)) : 0;
  // (rounded to 16 bytes: the decode partials that follow are read as float4)
  p.tiles_bytes = ((static_cast<size_t>(p.prefill_tiles) + 1) * sizeof(int2) + 15) / 16 * 16;
  // Decode: as many partitions as keep every CTA resident at once, two an SM (109 KB of shared
  // memory and 184 registers a thread each), when every sequence decodes. Fewer CTAs leave
  // bandwidth unused (a CTA keeps two 32 KB tiles in flight: six stages instead of three gained
  // <= 4%), more queue behind the first wave. Measured (bench/attention_decode_bench.cu,
  // Llama-3-8B's heads, caches out of L2), partitions: µs: b8 x 1088 keys 3: 15.4 (the rule
  // before, one CTA an SM rounded up), 4: 13.9, 6: 18.6; b4 x 8000 4: 44.1, 5: 49.0, 8: 37.8;
  // b1 x 32000 16: 45.0, 33: 39.1, 66: 44.7; b16 x 8000 1: 152.6, 2: 136.0, 3: 159.6. (One an SM
  // measured best while the merge read its partials one L2 round trip after another, a cost
  // that grew with the partitions.) Llama-3-8B's 8 kv heads on the H200: batch 1, 17
  // partitions (its 1088 keys / kMinPartition); batch 8, 4; batch 32 and up, 1.
  p.head_groups = static_cast<int>((G + kDecMaxG - 1) / kDecMaxG);  // (of a kv head)
  const int64_t base_ctas = std::max<int64_t>(1, B * nkv * p.head_groups);
  const int64_t visible = window > 0 ? std::min(max_ctx, window) : max_ctx;
  const int64_t ctas_per_sm = D == 256 ? 1 : kDecCtasPerSm;  // (256: 207 KB a CTA)
  // The balanced kernel (attention_decode.cu: a CTA per resident slot, each streaming an equal
  // run of the batch's K/V tiles, so no wave runs part-empty at the end and a CTA's pipeline
  // runs on from one item to the next) where set_attention_tuning forces it; the planner
  // keeps the split kernel until the two are timed against each other on a GPU.
  if (D <= 128 && g_decode_kernel == kDecodeBalanced) {
    p.balanced_ctas = balanced_grid(static_cast<int>(ctas_per_sm * num_sms()),
                                    static_cast<int>(nkv * p.head_groups));
    p.part_bytes = static_cast<size_t>(2) * p.balanced_ctas * kDecMaxG * (D + 1) * sizeof(float);
    return p;
  }
  int64_t splits = ctas_per_sm * num_sms() / base_ctas;
  splits = std::min(splits, (visible + kMinPartition - 1) / kMinPartition);
  p.max_splits = static_cast<int>(std::clamp<int64_t>(splits, 1, kMaxSplits));
  if (p.max_splits > 1)
    p.part_bytes = static_cast<size_t>(B) * nq * p.max_splits * (D + 1) * sizeof(float);
  return p;
}

// The prefill tile list and the decode partials (runtime.h: GrowOnlyBuffer).
void* scratch(size_t bytes) {
  static GrowOnlyBuffer buf;
  return buf.get(bytes);
}

template <int D, typename KV>
void launch_tc(const AttnPlan& p, const AttnArgs& a, int64_t cache_slots, cudaStream_t s) {
  constexpr bool kBf = std::is_same_v<KV, __nv_bfloat16>;
  if (p.prefill_tiles > 0) {
    launch(schedule_kernel, 1, 1024, 0, s, a, p.prefill_rows);
    if (p.prefill_ws) {
      launch_prefill_ws_sm90(a, p.prefill_tiles, kBf, cache_slots, s);
    } else if (p.prefill_sm90) {
      launch_prefill_sm90(a, p.prefill_tiles, D, kBf, s);
    } else if constexpr (D <= 128) {  // (plan_attention takes 256 only with the sm90 kernel)
      constexpr int kPrefillSmem = attn_smem_bytes<D, kPrefillWarps>();
      static const bool smem_ok = (allow_smem(prefill_kernel<D, KV>, kPrefillSmem), true);
      (void)smem_ok;
      launch(prefill_kernel<D, KV>, dim3(p.prefill_tiles, a.nkv), kPrefillWarps * 32,
             kPrefillSmem, s, a);
    }
  }
  if (p.balanced_ctas > 0) {
    launch_decode_balanced(a, p.balanced_ctas, D, kBf, s);
    return;
  }
  const dim3 grid(a.nkv * p.head_groups, a.B, p.max_splits);
  launch_decode(a, grid, D, kBf, s);
}


}  // namespace

void paged_attention(const Tensor& out, const Tensor& q, const Tensor& key_cache,
                     const Tensor& value_cache, const Tensor& block_table,
                     const Tensor& query_start_loc, const Tensor& seq_lens, float scale,
                     int64_t sliding_window, float logits_soft_cap, int64_t max_query_len,
                     const Tensor& sinks) {
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs; here what the
  // GPU adds (activation dtypes, layouts, index ranges). The contents of block_table /
  // query_start_loc / seq_lens live on the GPU and are trusted (reading them would need a host
  // sync).
  const DType qt = q.dtype;
  VLLMX_CHECK(qt == DType::F16 || qt == DType::BF16 || qt == DType::F32, kOp,
        "q must be f16, bf16 or f32, got " + q.str());
  const DType dt = key_cache.dtype;
  check_rows(out, kOp, "out");
  check_rows(q, kOp, "q");
  check_rows(block_table, kOp, "block_table");
  for (const Tensor* c : {&key_cache, &value_cache}) {
    const int64_t* sh = c->shape;
    VLLMX_CHECK(c->stride[3] == 1 && c->stride[2] == sh[3] && c->stride[1] == sh[2] * sh[3] &&
              c->stride[0] == sh[1] * sh[2] * sh[3],
          kOp, "the caches must be contiguous, got " + c->str());
  }

  const int64_t block_size = key_cache.shape[1], nkv = key_cache.shape[2], D = key_cache.shape[3];
  VLLMX_CHECK(D <= kGenericMaxD, kOp,
        "bad cache shape " + key_cache.str() + " (head_size must be 1.." + i2s(kGenericMaxD) + ")");
  const int64_t T = q.shape[0];
  const int64_t nq = q.shape[1] / D;
  const int64_t B = seq_lens.shape[0];
  const int64_t max_ctx = block_table.shape[1] * block_size;
  VLLMX_CHECK(T < INT_MAX / std::max<int64_t>(1, nq) && max_ctx < INT_MAX && B < INT_MAX &&
            nq < 65536,
        kOp, "too large: q " + q.str() + ", block_table " + block_table.str());
  if (T == 0 || B == 0) return;

  AttnArgs a{};
  a.q = q.data;
  a.out = out.data;
  a.kc = key_cache.data;
  a.vc = value_cache.data;
  a.bt = block_table.ptr<int32_t>();
  a.qsl = query_start_loc.ptr<int32_t>();
  a.seq_lens = seq_lens.ptr<int32_t>();
  a.q_stride = q.stride[0];
  a.out_stride = out.stride[0];
  a.bt_stride = block_table.stride[0];
  a.B = static_cast<int>(B);
  a.T = static_cast<int>(T);
  a.nq = static_cast<int>(nq);
  a.nkv = static_cast<int>(nkv);
  a.G = static_cast<int>(nq / nkv);
  a.D = static_cast<int>(D);
  a.block_size = static_cast<int>(block_size);
  a.scale = scale;
  a.cap = logits_soft_cap > 0 ? logits_soft_cap : 0.f;
  a.window = sliding_window > 0 ? static_cast<int>(std::min<int64_t>(sliding_window, INT_MAX)) : 0;
  a.q_bf16 = qt == DType::BF16;
  a.out_bf16 = qt == DType::BF16;
  if (sinks.defined()) {
    check_on_device(sinks, kOp, "sinks");
    VLLMX_CHECK(sinks.dtype == DType::F32 && sinks.stride[0] == 1, kOp,
                "sinks must be contiguous f32 [nq], got " + sinks.str());
    a.sinks = sinks.ptr<float>();
  }
  cudaStream_t s = stream();

  // vLLM's max_query_len (0: not known): a decode-only batch skips the prefill kernels, which
  // otherwise run to find (on the device) that no sequence has two queries; a long one takes
  // the long prompts' prefill kernel.
  VLLMX_CHECK(max_query_len >= 0, kOp, "max_query_len must be >= 0 (0: unknown)");
  AttnPlan p = plan_attention(out, q, key_cache, value_cache, a, max_ctx, max_query_len);
  if (max_query_len == 1) p.prefill_tiles = 0;
  if (p.mla) {
    a.max_splits = p.max_splits;
    if (p.part_bytes > 0) {
      a.part_o = static_cast<float*>(scratch(p.part_bytes));
      a.part_lse = a.part_o + static_cast<size_t>(T) * nq * p.max_splits * D;
      a.done = done_counters(static_cast<size_t>(T) * p.head_groups);
    }
    launch_mla(a, dim3(static_cast<unsigned>(T * p.head_groups), p.max_splits),
               dt == DType::BF16, s);
    check_launch(kOp);
    return;
  }
  if (!p.tensor_cores) {
    launch(attention_generic_kernel, dim3(static_cast<unsigned>(T), static_cast<unsigned>(nq)),
           kGenericThreads, static_cast<size_t>(D) * sizeof(float), s, a, dt, qt, qt);
    check_launch(kOp);
    return;
  }
  char* buf = static_cast<char*>(scratch(p.tiles_bytes + p.part_bytes));
  a.tiles = reinterpret_cast<int2*>(buf);
  a.num_tiles = reinterpret_cast<int*>(buf + p.tiles_bytes - sizeof(int2));
  a.max_splits = p.max_splits;
  a.part_o = reinterpret_cast<float*>(buf + p.tiles_bytes);
  a.part_lse = a.part_o + (p.balanced_ctas > 0
                               ? static_cast<size_t>(2) * p.balanced_ctas * kDecMaxG
                               : static_cast<size_t>(B) * nq * p.max_splits) * D;
  a.done = done_counters(static_cast<size_t>(B) * nkv * p.head_groups);
  const bool bf_cache = dt == DType::BF16;
  dispatch_head_kv(static_cast<int>(D), bf_cache, [&](auto d, auto kv) {
    launch_tc<decltype(d)::value, decltype(kv)>(p, a, key_cache.shape[0] * block_size, s);
  });
  check_launch(kOp);
}

VLLMX_KERNEL(paged_attention, kCUDA, paged_attention);

void set_attention_tuning(int decode_kernel) {
  if (decode_kernel != -1 && decode_kernel != kDecodeSplit && decode_kernel != kDecodeBalanced)
    throw std::invalid_argument("set_attention_tuning: decode kernel " +
                                std::to_string(decode_kernel) + " out of range (-1, 0, 1)");
  g_decode_kernel = decode_kernel;
}

}  // namespace vllmx::cuda
