// paged_attention's decode kernel, for sequences with exactly 1 query (flash-decoding; the op,
// its plan and the other kernels are in attention.cu). A CTA of 128 threads takes up to kDecMaxG
// query heads of one kv head over one partition of the context, K/V tiles double-buffered by
// cp.async; scores, softmax and P @ V in f32 on the CUDA cores (one query row leaves the tensor
// cores idle anyway; what matters is keeping enough K/V loads in flight across the GPU).
// plan_attention sizes the partitions; the last CTA of a (sequence, head group) to finish merges
// the partials by their log-sum-exp, so a decode is one kernel. A sequence whose context fits
// one partition writes its output directly.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attention.cuh"
#include "runtime.h"

namespace vllmx::cuda::attn {

namespace {

// Partition size and count for a decode context of n visible keys: at most max_splits
// partitions, whole K/V tiles, >= kMinPartition keys.
__device__ __forceinline__ void split_plan(int n, int max_splits, int& part, int& nsplit) {
  int per = (n + max_splits - 1) / max_splits;
  per = (per + kDecKeys - 1) / kDecKeys * kDecKeys;
  part = max(per, kMinPartition);
  nsplit = (n + part - 1) / part;
}

// Decode shared memory: two stages of K and V tiles (after the loop: the cross-group reduction
// of O, then the merge weights), q, the tile's probabilities, per-head softmax state.
__host__ __device__ constexpr int cmax(int x, int y) { return x > y ? x : y; }
template <int D>
__host__ __device__ constexpr int dec_stage_bytes() { return 4 * kDecKeys * (D + 8) * 2; }
template <int D>
__host__ __device__ constexpr int dec_red_bytes() {
  return cmax(kDecThreads / (D / 8) * kDecMaxG * D, kDecMaxG * kMaxSplits) * 4;
}
template <int D>
__host__ __device__ constexpr int dec_smem_bytes() {
  return cmax(dec_stage_bytes<D>(), dec_red_bytes<D>()) +
         (kDecMaxG * D + kDecMaxG * kDecKeys + 3 * kDecMaxG) * 4;
}

// grid (B, nkv * ceil(G / kDecMaxG), max_splits), kDecThreads each.
template <int D, typename KV>
__global__ void __launch_bounds__(kDecThreads) decode_kernel(AttnArgs a) {
  constexpr int LD = D + 8, CPR = D / 8;
  constexpr int KG = kDecThreads / CPR;        // P @ V: key groups (a thread: 8 dims of 1 group)
  constexpr int TPK = kDecThreads / kDecKeys;  // Q K^T: threads per key
  constexpr int DPT = D / TPK;                 // Q K^T: dims per thread
  constexpr int kWarps = kDecThreads / 32;
  constexpr int kHeadsPerWarp = kDecMaxG / kWarps;
  static_assert(TPK == 2 && DPT % 8 == 0 && kDecMaxG % kWarps == 0, "decode tile shape");
  constexpr bool kKvBf = std::is_same_v<KV, __nv_bfloat16>;

  const int b = blockIdx.x, split = blockIdx.z;
  const int groups = (a.G + kDecMaxG - 1) / kDecMaxG;
  const int g = blockIdx.y / groups, h0 = g * a.G + (blockIdx.y % groups) * kDecMaxG;
  const int nh = min(kDecMaxG, g * a.G + a.G - h0);  // query heads h0 .. h0 + nh
  // (The three loads issue together: each is a round trip the CTA would otherwise wait out.)
  const int q0 = a.qsl[b], q1 = a.qsl[b + 1], pos = a.seq_lens[b] - 1;
  if (q1 - q0 != 1 || pos < 0) return;
  const int lo = visible_lo(pos, a.window);
  int part, nsplit;
  split_plan(pos - lo + 1, a.max_splits, part, nsplit);
  if (split >= nsplit) return;
  const int kbeg = lo + split * part, kend = min(kbeg + part, pos + 1);

  extern __shared__ uint4 dec_smem[];
  KV* Ks = reinterpret_cast<KV*>(dec_smem);  // [2][kDecKeys][LD]
  KV* Vs = Ks + 2 * kDecKeys * LD;
  float* red = reinterpret_cast<float*>(dec_smem);  // aliases the stages once the loop is done
  float* qs = reinterpret_cast<float*>(reinterpret_cast<char*>(dec_smem) +
                                       cmax(dec_stage_bytes<D>(), dec_red_bytes<D>()));
  float* ps = qs + kDecMaxG * D;          // [kDecMaxG][kDecKeys]
  float* corr_s = ps + kDecMaxG * kDecKeys;  // [kDecMaxG]
  float* m_s = corr_s + kDecMaxG;
  float* l_s = m_s + kDecMaxG;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t* bt_row = a.bt + static_cast<int64_t>(b) * a.bt_stride;
  const int ntiles = (kend - kbeg + kDecKeys - 1) / kDecKeys;
  // Before waiting for the previous kernel (PDL): the step's inputs (block table, lengths) were
  // copied before any kernel ran, and every key but this step's own (pos, which the previous
  // kernel writes) is already in the cache, so the first tile's loads start now.
  load_kv_tile<D, kDecKeys, kDecThreads>(a, bt_row, g, kbeg, kend, Ks, Vs, pos);
  pdl_begin();
  if (pos < kbeg + kDecKeys && tid < CPR) {  // this step's key sits in the first tile
    const int64_t off =
        ((static_cast<int64_t>(bt_row[pos / a.block_size]) * a.block_size + pos % a.block_size) *
             a.nkv + g) * D + tid * 8;
    cp_async16(Ks + (pos - kbeg) * LD + tid * 8, static_cast<const KV*>(a.kc) + off, true);
    cp_async16(Vs + (pos - kbeg) * LD + tid * 8, static_cast<const KV*>(a.vc) + off, true);
  }
  cp_async_commit();  // (an empty group elsewhere: the waits below count groups)

  // q of the group's heads (contiguous in the row) -> f32 in shared memory, 16-byte loads.
  const uint16_t* qrow = static_cast<const uint16_t*>(a.q) + q0 * a.q_stride +
                         static_cast<int64_t>(h0) * D;
  for (int i = tid; i < kDecMaxG * CPR; i += kDecThreads) {
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (i / CPR < nh) unpack8(*reinterpret_cast<const uint4*>(qrow + i * 8), a.q_bf16, f);
    *reinterpret_cast<float4*>(qs + i * 8) = make_float4(f[0], f[1], f[2], f[3]);
    *reinterpret_cast<float4*>(qs + i * 8 + 4) = make_float4(f[4], f[5], f[6], f[7]);
  }

  float m_run[kHeadsPerWarp], l_run[kHeadsPerWarp];
#pragma unroll
  for (int j = 0; j < kHeadsPerWarp; ++j) m_run[j] = -INFINITY, l_run[j] = 0.f;
  float o[kDecMaxG][8];
#pragma unroll
  for (int h = 0; h < kDecMaxG; ++h)
#pragma unroll
    for (int j = 0; j < 8; ++j) o[h][j] = 0.f;
  const int key_a = tid / TPK, d_a = (tid % TPK) * DPT;  // Q K^T: this thread's key and dims
  const int c = tid % CPR, kg = tid / CPR;                // P @ V: its 8 dims and key group
  const float scale_log2 = a.scale * kLog2e;

  for (int t = 0; t < ntiles; ++t) {
    const int st = t & 1, k0 = kbeg + t * kDecKeys;
    if (t + 1 < ntiles) {
      load_kv_tile<D, kDecKeys, kDecThreads>(a, bt_row, g, k0 + kDecKeys, kend,
                                             Ks + (st ^ 1) * kDecKeys * LD,
                                             Vs + (st ^ 1) * kDecKeys * LD);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    // Scores: two threads per key, each half of the dims, for every head of the group.
    float acc[kDecMaxG];
#pragma unroll
    for (int h = 0; h < kDecMaxG; ++h) acc[h] = 0.f;
    const KV* kr = Ks + (st * kDecKeys + key_a) * LD + d_a;
#pragma unroll
    for (int cc = 0; cc < DPT / 8; ++cc) {
      float kf[8];
      unpack8(*reinterpret_cast<const uint4*>(kr + cc * 8), kKvBf, kf);
#pragma unroll
      for (int h = 0; h < kDecMaxG; ++h) {
        if (h < nh) {
          const float4 qa = *reinterpret_cast<const float4*>(qs + h * D + d_a + cc * 8);
          const float4 qb = *reinterpret_cast<const float4*>(qs + h * D + d_a + cc * 8 + 4);
          acc[h] = fmaf(qa.x, kf[0], fmaf(qa.y, kf[1], fmaf(qa.z, kf[2], fmaf(qa.w, kf[3],
                   fmaf(qb.x, kf[4], fmaf(qb.y, kf[5], fmaf(qb.z, kf[6], fmaf(qb.w, kf[7],
                   acc[h]))))))));
        }
      }
    }
    const bool valid = k0 + key_a < kend;
#pragma unroll
    for (int h = 0; h < kDecMaxG; ++h) {
      if (h < nh) {
        float x = acc[h] + __shfl_xor_sync(0xffffffffu, acc[h], 1);
        x = a.cap > 0.f ? a.cap * tanhf(x * a.scale / a.cap) * kLog2e : x * scale_log2;
        if (tid % TPK == 0) ps[h * kDecKeys + key_a] = valid ? x : -INFINITY;
      }
    }
    __syncthreads();

    // Online softmax: warp w owns heads w, w + kWarps, ...; a lane holds two of the 64 keys.
#pragma unroll
    for (int j = 0; j < kHeadsPerWarp; ++j) {
      const int h = warp + j * kWarps;
      if (h < nh) {
        float* pr = ps + h * kDecKeys;
        float s0 = pr[lane], s1 = pr[lane + 32];
        const float mnew = fmaxf(m_run[j], warp_max(fmaxf(s0, s1)));
        const float base = mnew == -INFINITY ? 0.f : mnew;
        const float corr = exp2f(m_run[j] - base);
        s0 = exp2f(s0 - base);
        s1 = exp2f(s1 - base);
        l_run[j] = l_run[j] * corr + warp_sum(s0 + s1);
        m_run[j] = mnew;
        pr[lane] = s0;
        pr[lane + 32] = s1;
        if (lane == 0) corr_s[h] = corr;
      }
    }
    __syncthreads();

    // O += P V: this thread's 8 dims over the keys of its group.
#pragma unroll
    for (int h = 0; h < kDecMaxG; ++h) {
      if (h < nh) {
        const float corr = corr_s[h];
#pragma unroll
        for (int j = 0; j < 8; ++j) o[h][j] *= corr;
      }
    }
#pragma unroll 2
    for (int k = kg; k < kDecKeys; k += KG) {
      float vf[8];
      unpack8(*reinterpret_cast<const uint4*>(Vs + (st * kDecKeys + k) * LD + c * 8), kKvBf, vf);
#pragma unroll
      for (int h = 0; h < kDecMaxG; ++h) {
        if (h < nh) {
          const float p = ps[h * kDecKeys + k];
#pragma unroll
          for (int j = 0; j < 8; ++j) o[h][j] = fmaf(p, vf[j], o[h][j]);
        }
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this stage and ps
  }

  // Sum O over the key groups; normalize.
#pragma unroll
  for (int j = 0; j < kHeadsPerWarp; ++j) {
    const int h = warp + j * kWarps;
    if (h < nh && lane == 0) m_s[h] = m_run[j], l_s[h] = l_run[j];
  }
#pragma unroll
  for (int h = 0; h < kDecMaxG; ++h) {
    if (h < nh) {
      float* r = red + (kg * kDecMaxG + h) * D + c * 8;
      *reinterpret_cast<float4*>(r) = make_float4(o[h][0], o[h][1], o[h][2], o[h][3]);
      *reinterpret_cast<float4*>(r + 4) = make_float4(o[h][4], o[h][5], o[h][6], o[h][7]);
    }
  }
  __syncthreads();
  const bool direct = nsplit == 1;
  uint16_t* out = static_cast<uint16_t*>(a.out) + q0 * a.out_stride;
  const int64_t slot0 = (static_cast<int64_t>(b) * a.nq + h0) * a.max_splits;  // head h0
  for (int i = tid; i < nh * D; i += kDecThreads) {
    const int h = i / D, d = i % D;
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < KG; ++k) v += red[(k * kDecMaxG + h) * D + d];
    v /= l_s[h];
    if (direct)
      out[static_cast<int64_t>(h0) * D + i] = float_to_bits(v, a.out_bf16);
    else
      a.part_o[(slot0 + h * a.max_splits + split) * D + d] = v;
  }
  if (direct) return;
  if (tid < nh) a.part_lse[slot0 + tid * a.max_splits + split] = m_s[tid] + log2f(l_s[tid]);

  // The last partition of this (sequence, head group) to finish merges them all.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    int* done = a.done + static_cast<int64_t>(b) * gridDim.y + blockIdx.y;
    last = atomicAdd(done, 1) == nsplit - 1;
    if (last) *done = 0;  // every partition has counted: ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  float* wts = red;  // [kDecMaxG][kMaxSplits]: each partition's weight in the merge
#pragma unroll
  for (int j = 0; j < kHeadsPerWarp; ++j) {
    const int h = warp + j * kWarps;
    if (h < nh) {
      const float* lse = a.part_lse + slot0 + h * a.max_splits;
      float mx = -INFINITY;
      for (int sp = lane; sp < nsplit; sp += 32) mx = fmaxf(mx, __ldcg(lse + sp));
      mx = warp_max(mx);
      float sum = 0.f;
      for (int sp = lane; sp < nsplit; sp += 32) {
        const float w = exp2f(__ldcg(lse + sp) - mx);
        wts[h * kMaxSplits + sp] = w;
        sum += w;
      }
      const float inv = 1.f / warp_sum(sum);
      for (int sp = lane; sp < nsplit; sp += 32) wts[h * kMaxSplits + sp] *= inv;
    }
  }
  __syncthreads();
  for (int i = tid; i < nh * D; i += kDecThreads) {
    const int h = i / D, d = i % D;
    const float* po = a.part_o + (slot0 + h * a.max_splits) * D + d;
    const float* wh = wts + h * kMaxSplits;
    float v = 0.f;
    // 16 partials in flight at a time: one after another, each would be an L2 round trip.
    for (int sp0 = 0; sp0 < nsplit; sp0 += 16) {
      float pv[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) pv[j] = sp0 + j < nsplit ? __ldcg(po + (sp0 + j) * D) : 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (sp0 + j < nsplit) v = fmaf(wh[sp0 + j], pv[j], v);
    }
    out[static_cast<int64_t>(h0) * D + i] = float_to_bits(v, a.out_bf16);
  }
}

}  // namespace

// Decode: partitions done per sequence and head group; each launch leaves them zero again.
int* done_counters(size_t n) {
  static GrowOnlyBuffer buf(/*zeroed=*/true);
  return static_cast<int*>(buf.get(n * sizeof(int)));
}

namespace {
template <int D, typename KV>
void launch_one(const AttnArgs& a, dim3 grid, cudaStream_t s) {
  static const bool smem_ok = (allow_smem(decode_kernel<D, KV>, dec_smem_bytes<D>()), true);
  (void)smem_ok;
  launch(decode_kernel<D, KV>, grid, kDecThreads, dec_smem_bytes<D>(), s, a);
}
}  // namespace

void launch_decode(const AttnArgs& a, dim3 grid, int D, bool bf16_cache, cudaStream_t s) {
  if (D == 64)
    bf16_cache ? launch_one<64, __nv_bfloat16>(a, grid, s) : launch_one<64, __half>(a, grid, s);
  else
    bf16_cache ? launch_one<128, __nv_bfloat16>(a, grid, s) : launch_one<128, __half>(a, grid, s);
}

}  // namespace vllmx::cuda::attn
