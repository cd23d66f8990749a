// paged_attention's decode kernel, for sequences with exactly 1 query (flash-decoding; the op,
// its plan and the other kernels are in attention.cu). A CTA of 4 warps takes the query heads of
// one kv head (up to 16: the rows of one m16n8k16 tile) over one partition of the context; K/V
// tiles of 64 keys, three in flight by cp.async; S = QK^T and O += PV on the tensor cores, each
// warp on its own 16 keys of a tile with its own online softmax (the tensor cores read each K/V
// byte once from shared memory, where a CUDA-core loop re-reads q for every key and runs out of
// issue slots before the memory system runs out of bandwidth).
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

// Decode shared memory: kDecStages stages of K and V tiles; the group's q rows. After the loop
// the stages hold the warps' O for the cross-warp sum, then the split-merge weights.
template <int D>
__host__ __device__ constexpr int dec_stage_bytes() {
  return kDecStages * 2 * kDecKeys * (D + 8) * 2;
}
template <int D>
__host__ __device__ constexpr int dec_smem_bytes() {
  return dec_stage_bytes<D>() + kDecMaxG * (D + 8) * 2 + kDecWarps * kDecMaxG * 2 * 4;
}
static_assert(kDecWarps * kDecMaxG * 128 * 4 <= dec_stage_bytes<128>() &&
                  kDecMaxG * kMaxSplits * 4 <= dec_stage_bytes<64>(),
              "the reductions alias the K/V stages");

// grid (nkv * ceil(G / kDecMaxG), B, max_splits), kDecThreads each: the kv heads of a sequence
// are neighbours in launch order, so the CTAs running together read whole cache rows (a token's
// K for every head is one contiguous row), not one head's slice of many rows. The G query
// heads of a kv head are the rows of one 16-row mma tile (GQA packing: K and V are read once
// for all of them; the unused rows of a small group cost tensor-core time, of which decode has
// plenty).
// Each warp takes 16 keys of every 64-key tile with its own online softmax; the warps' states
// are summed once at the end.
template <int D, typename KV>
__global__ void __launch_bounds__(kDecThreads) decode_kernel(AttnArgs a) {
  constexpr int LD = D + 8, CPR = D / 8, NS = kDecStages;

  const int b = blockIdx.y, split = blockIdx.z;
  const int groups = (a.G + kDecMaxG - 1) / kDecMaxG;
  const int g = blockIdx.x / groups, h0 = g * a.G + (blockIdx.x % groups) * kDecMaxG;
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
  KV* Ks = reinterpret_cast<KV*>(dec_smem);  // [NS][kDecKeys][LD]
  KV* Vs = Ks + NS * kDecKeys * LD;
  KV* Qs = Vs + NS * kDecKeys * LD;          // [kDecMaxG][LD]
  float* ml = reinterpret_cast<float*>(Qs + kDecMaxG * LD);  // [warps][rows][m, l]
  float* red = reinterpret_cast<float*>(dec_smem);  // aliases the stages once the loop is done

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t* bt_row = a.bt + static_cast<int64_t>(b) * a.bt_stride;
  const int ntiles = (kend - kbeg + kDecKeys - 1) / kDecKeys;
  auto load = [&](int t, int hole) {
    if (t < ntiles)
      load_kv_tile<D, kDecKeys, kDecThreads>(a, bt_row, g, kbeg + t * kDecKeys, kend,
                                             Ks + (t % NS) * kDecKeys * LD,
                                             Vs + (t % NS) * kDecKeys * LD, hole);
    else
      cp_async_commit();  // an empty group: the waits below count groups
  };
  // Before waiting for the previous kernel (PDL): the step's inputs (block table, lengths) were
  // copied before any kernel ran, and every key but this step's own (pos, which the previous
  // kernel writes) is already in the cache, so the first tiles' loads start now.
#pragma unroll
  for (int t = 0; t < NS - 1; ++t) load(t, pos);
  pdl_begin();
  const int hole_tile = (pos - kbeg) / kDecKeys;
  if (pos < kend && hole_tile < NS - 1 && tid < CPR) {  // this step's key, in a first tile
    const int64_t off =
        ((static_cast<int64_t>(bt_row[pos / a.block_size]) * a.block_size + pos % a.block_size) *
             a.nkv + g) * D + tid * 8;
    const int row = (hole_tile % NS) * kDecKeys + (pos - kbeg) % kDecKeys;
    cp_async16(Ks + row * LD + tid * 8, static_cast<const KV*>(a.kc) + off, true);
    cp_async16(Vs + row * LD + tid * 8, static_cast<const KV*>(a.vc) + off, true);
  }
  cp_async_commit();

  stage_q_rows<D, LD, kDecThreads>(a, static_cast<const uint16_t*>(a.q) + q0 * a.q_stride +
                                        static_cast<int64_t>(h0) * D, nh, Qs);

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows lane / 4 and lane / 4 + 8
  uint32_t qf[D / 16][4];
  const float scale_log2 = a.scale * kLog2e;

  for (int t = 0; t < ntiles; ++t) {
    load(t + NS - 1, -1);
    // Tile t landed: groups after it are the NS - 1 loads ahead (t = 0: also the hole's group,
    // which must land too, and the NS - 2 other first tiles).
    if (t == 0)
      cp_async_wait<1>();
    else
      cp_async_wait<NS - 1>();
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk], Qs + (lane % 16) * LD + kk * 16 + (lane / 16) * 8);
    }

    // S = Q K^T: the 16 rows x this warp's 16 keys.
    const int kw = (t % NS) * kDecKeys + warp * 16;  // the warp's first key row in the stage
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t r4[4];
      ldmatrix_x4(r4, Ks + (kw + lane % 8 + (lane / 16) * 8) * LD + kk * 16 +
                          ((lane / 8) % 2) * 8);
      mma16816<KV>(s[0], qf[kk], r4[0], r4[1]);
      mma16816<KV>(s[1], qf[kk], r4[2], r4[3]);
    }
    const int k0 = kbeg + t * kDecKeys + warp * 16;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e];
        x = a.cap > 0.f ? a.cap * tanhf(x * a.scale / a.cap) * kLog2e : x * scale_log2;
        s[nt][e] = k0 + nt * 8 + (lane % 4) * 2 + (e & 1) < kend ? x : -INFINITY;
      }

    // Online softmax: a row's 16 scores sit in the 4 lanes of a quad.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mnew = fmaxf(m[h], mx);
      const float base = mnew == -INFINITY ? 0.f : mnew;  // nothing visible to this warp yet
      const float corr = exp2f(m[h] - base);
      m[h] = mnew;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
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

    // O += P V: the two score octets are one A fragment.
    uint32_t pa[4];
    pa[0] = F16Ops<KV>::pack2(s[0][0], s[0][1]);
    pa[1] = F16Ops<KV>::pack2(s[0][2], s[0][3]);
    pa[2] = F16Ops<KV>::pack2(s[1][0], s[1][1]);
    pa[3] = F16Ops<KV>::pack2(s[1][2], s[1][3]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t r4[4];
      ldmatrix_x4_trans(r4, Vs + (kw + lane % 8 + ((lane / 8) % 2) * 8) * LD + dp * 16 +
                                (lane / 16) * 8);
      mma16816<KV>(o[2 * dp], pa, r4[0], r4[1]);
      mma16816<KV>(o[2 * dp + 1], pa, r4[2], r4[3]);
    }
    __syncthreads();  // the next iteration's loads overwrite the oldest stage
  }
  cp_async_wait<0>();  // (only empty groups are left; the stages become the reduction area)

  // The warps' states -> one per row: M = max of the warps' maxima, each warp's O and l
  // weighted by exp2(m_w - M).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (lane % 4 == 0) {
      float* p = ml + (warp * kDecMaxG + lane / 4 + h * 8) * 2;
      p[0] = m[h], p[1] = l[h];
    }
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lane / 4 + h * 8;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) mx = fmaxf(mx, ml[(w * kDecMaxG + r) * 2]);
    const float wt = m[h] == -INFINITY ? 0.f : exp2f(m[h] - mx);
    float* dst = red + (warp * kDecMaxG + r) * D + (lane % 4) * 2;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * h] * wt, o[dt][2 * h + 1] * wt);
  }
  __syncthreads();
  const bool direct = nsplit == 1;
  uint16_t* out = static_cast<uint16_t*>(a.out) + q0 * a.out_stride;
  const int64_t slot0 = (static_cast<int64_t>(b) * a.nq + h0) * a.max_splits;  // head h0
  for (int i = tid; i < nh * D; i += kDecThreads) {
    const int r = i / D, d = i % D;
    float mx = -INFINITY, sum_l = 0.f, v = 0.f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) mx = fmaxf(mx, ml[(w * kDecMaxG + r) * 2]);
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float mw = ml[(w * kDecMaxG + r) * 2];
      if (mw != -INFINITY) sum_l += ml[(w * kDecMaxG + r) * 2 + 1] * exp2f(mw - mx);
      v += red[(w * kDecMaxG + r) * D + d];
    }
    if (direct)  // (partitions merged below add the sink once, to their sum)
      sum_l += sink_term(a, h0 + r, mx);
    v /= sum_l;
    if (direct)
      out[static_cast<int64_t>(h0) * D + i] = float_to_bits(v, a.out_bf16);
    else
      a.part_o[(slot0 + r * a.max_splits + split) * D + d] = v;
    if (!direct && d == 0) a.part_lse[slot0 + r * a.max_splits + split] = mx + log2f(sum_l);
  }
  if (direct) return;
  merge_partials<D, kDecWarps>(a, a.done + static_cast<int64_t>(b) * gridDim.x + blockIdx.x,
                               slot0, nh, nsplit, h0, out, red);
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
  dispatch_head_kv(D, bf16_cache, [&](auto d, auto kv) {
    launch_one<decltype(d)::value, decltype(kv)>(a, grid, s);
  });
}

}  // namespace vllmx::cuda::attn
