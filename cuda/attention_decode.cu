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
#include <stdexcept>
#include <string>
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

// One 64-key tile of a decode CTA, this warp's 16 keys of it (kw: their first row in the stage,
// k0: their first key; keys at or past kend are masked): S = Q K^T on the tensor cores, the
// online softmax over the row's running maximum m and sum l (rows lane / 4 and lane / 4 + 8),
// O += P V.
template <int D, typename KV>
__device__ __forceinline__ void decode_tile(const AttnArgs& a, const KV* Ks, const KV* Vs, int kw,
                                            int k0, int kend, const uint32_t (&qf)[D / 16][4],
                                            float (&o)[D / 8][4], float (&m)[2], float (&l)[2],
                                            int lane) {
  constexpr int LD = D + 8;
  const float scale_log2 = a.scale * kLog2e;
  float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t r4[4];
    ldmatrix_x4(r4, Ks + (kw + lane % 8 + (lane / 16) * 8) * LD + kk * 16 +
                        ((lane / 8) % 2) * 8);
    mma16816<KV>(s[0], qf[kk], r4[0], r4[1]);
    mma16816<KV>(s[1], qf[kk], r4[2], r4[3]);
  }
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
}

// The end of a decode CTA's (part of a) head group: the warps' states -> one per row (M = the
// maximum of the warps' maxima, each warp's O and l weighted by exp2(m_w - M)), RP rows at a
// time through red (shared memory of kDecWarps x RP x D floats), each row normalized: direct,
// with the sink added to its sum, into out's head h0 + r; else into part_o's row part_row(r),
// its lse (base 2) into part_lse's. ml: shared [kDecWarps][kDecMaxG][m, l]. Ends
// synchronized: red and ml are free again.
template <int D, int RP, class PartRow>
__device__ __forceinline__ void decode_epilogue(const AttnArgs& a, const float (&o)[D / 8][4],
                                                const float (&m)[2], float (&l)[2], float* ml,
                                                float* red, int nh, int h0, bool direct,
                                                uint16_t* out, PartRow part_row) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
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
  float wt[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lane / 4 + h * 8;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) mx = fmaxf(mx, ml[(w * kDecMaxG + r) * 2]);
    wt[h] = m[h] == -INFINITY ? 0.f : exp2f(m[h] - mx);
  }
  for (int r0 = 0; r0 < nh; r0 += RP) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = lane / 4 + h * 8 - r0;
      if (r < 0 || r >= RP) continue;
      float* dst = red + (warp * RP + r) * D + (lane % 4) * 2;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        *reinterpret_cast<float2*>(dst + dt * 8) =
            make_float2(o[dt][2 * h] * wt[h], o[dt][2 * h + 1] * wt[h]);
    }
    __syncthreads();
    const int rows = min(RP, nh - r0);
    for (int i = tid; i < rows * D; i += kDecThreads) {
      const int rr = i / D, d = i % D, r = r0 + rr;
      float mx = -INFINITY, sum_l = 0.f, v = 0.f;
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) mx = fmaxf(mx, ml[(w * kDecMaxG + r) * 2]);
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) {
        const float mw = ml[(w * kDecMaxG + r) * 2];
        if (mw != -INFINITY) sum_l += ml[(w * kDecMaxG + r) * 2 + 1] * exp2f(mw - mx);
        v += red[(w * RP + rr) * D + d];
      }
      if (direct) {  // (parts merged later add the sink once, to their sum)
        sum_l += sink_term(a, h0 + r, mx);
        out[static_cast<int64_t>(h0 + r) * D + d] = float_to_bits(v / sum_l, a.out_bf16);
      } else {
        const int64_t row = part_row(r);
        a.part_o[row * D + d] = v / sum_l;
        if (d == 0) a.part_lse[row] = mx + log2f(sum_l);
      }
    }
    __syncthreads();
  }
}

// Chunk ch (8 elements) of key pos's K and V rows for kv head g of the sequence whose
// block-table row is bt_row -> Ks_row / Vs_row (a stage's row), by cp.async: the step's own key,
// which the previous kernel writes, loaded after the PDL wait where the first tiles left it out.
template <int D, typename KV>
__device__ __forceinline__ void load_key_chunk(const AttnArgs& a, const int32_t* bt_row, int g,
                                               int pos, KV* Ks_row, KV* Vs_row, int ch) {
  const int64_t off = ((static_cast<int64_t>(bt_row[pos / a.block_size]) * a.block_size +
                        pos % a.block_size) * a.nkv + g) * D + ch * 8;
  cp_async16(Ks_row + ch * 8, static_cast<const KV*>(a.kc) + off, true);
  cp_async16(Vs_row + ch * 8, static_cast<const KV*>(a.vc) + off, true);
}

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
    const int row = (hole_tile % NS) * kDecKeys + (pos - kbeg) % kDecKeys;
    load_key_chunk<D>(a, bt_row, g, pos, Ks + row * LD, Vs + row * LD, tid);
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
    decode_tile<D>(a, Ks, Vs, (t % NS) * kDecKeys + warp * 16,
                   kbeg + t * kDecKeys + warp * 16, kend, qf, o, m, l, lane);
    __syncthreads();  // the next iteration's loads overwrite the oldest stage
  }
  cp_async_wait<0>();  // (only empty groups are left; the stages become the reduction area)

  const bool direct = nsplit == 1;
  uint16_t* out = static_cast<uint16_t*>(a.out) + q0 * a.out_stride;
  const int64_t slot0 = (static_cast<int64_t>(b) * a.nq + h0) * a.max_splits;  // head h0
  decode_epilogue<D, kDecMaxG>(a, o, m, l, ml, red, nh, h0, direct, out,
                               [&](int r) { return slot0 + r * a.max_splits + split; });
  if (direct) return;
  merge_partials<D, kDecWarps>(a, a.done + static_cast<int64_t>(b) * gridDim.x + blockIdx.x,
                               slot0, nh, nsplit, h0, out, red);
}

// ---- Balanced decode: batches of more CTAs than stay resident ----
// Each head item x (a kv head's group of query heads, decode_kernel's blockIdx.x) of every
// sequence makes one stream: the sequences' K/V tiles for that head, in order. The CTAs split
// into one set a stream (CTA c takes stream c % X), and each set cuts its stream into runs as
// equal as whole tiles allow, one a CTA: every CTA streams as many bytes, so none is left
// running alone at the end, and a CTA's cp.async ring runs on across the sequences of its run,
// so an item's first tiles arrive under the previous item's math. CTAs c .. c + X - 1 start at
// the same key of the same sequence in their X heads and read whole cache rows together, as
// decode_kernel's neighbours do. An item cut between runs leaves each of its CTAs a partial
// (its O rows and their lse) in a slot of the CTA's own (2 c for the first item of its run,
// 2 c + 1 for its last), and the last of them to finish merges them.

// A sequence's decode: its visible keys lo .. pos in tiles of kDecKeys, n of them (0 unless
// the sequence has exactly one query), its query row q0 (q1: the next sequence's).
struct DecSeq {
  int n, pos, lo, q0, q1;
};
__device__ __forceinline__ DecSeq dec_seq(const AttnArgs& a, int len, int q0, int q1) {
  DecSeq s;
  s.pos = len - 1, s.q0 = q0, s.q1 = q1;
  s.lo = visible_lo(s.pos, a.window);
  s.n = q1 - q0 == 1 && s.pos >= 0 ? (s.pos - s.lo + kDecKeys) / kDecKeys : 0;
  return s;
}

// A walk over a stream's items: sequence b, p the stream index of its first tile; the next
// sequence's length and query end loaded one sequence ahead, so that stepping to it waits for
// nothing.
struct DecWalk {
  int b;
  int64_t p;
  DecSeq seq;
  int next_len = 0, next_q1 = 0;

  __device__ __forceinline__ void start(const AttnArgs& a, int b0, int64_t p0) {
    b = b0, p = p0;
    seq = dec_seq(a, a.seq_lens[b], a.qsl[b], a.qsl[b + 1]);
    prefetch(a);
  }
  __device__ __forceinline__ void prefetch(const AttnArgs& a) {
    if (b + 1 < a.B) next_len = a.seq_lens[b + 1], next_q1 = a.qsl[b + 2];
  }
  // To the next sequence with tiles (past the batch's last, seq.n is 0).
  __device__ __forceinline__ void next(const AttnArgs& a) {
    p += seq.n;
    do {
      if (++b >= a.B) {
        seq.n = 0;
        return;
      }
      seq = dec_seq(a, next_len, seq.q1, next_q1);
      prefetch(a);
    } while (seq.n == 0);
  }
};

// The run of a stream of N tiles cut into R that holds tile t: run r starts at r N / R.
__device__ __forceinline__ int run_of(int64_t t, int64_t N, int R) {
  return static_cast<int>(((t + 1) * R + N - 1) / N - 1);
}

// The balanced kernel's merge of an item's nsplit parts (head rows h0 .. h0 + nh; part sp in
// slot slot_of(sp)) into out, by the last of their CTAs to finish (counted in *done, which it
// leaves zero for the next launch). A thread's weights come straight from the parts' lse, with
// no shared memory: the ring's stages are taken by the run's next tiles. Parts are few (an
// item cut by one run's end: two), so the lse reads repeat little.
template <int D, class SlotOf>
__device__ __forceinline__ void merge_slots(const AttnArgs& a, int* done, int nsplit,
                                            SlotOf slot_of, int nh, int h0, uint16_t* out) {
  const int tid = threadIdx.x;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    last = atomicAdd(done, 1) == nsplit - 1;
    if (last) *done = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  constexpr int V4 = D / 4;
  for (int i = tid; i < nh * V4; i += kDecThreads) {
    const int h = i / V4, c4 = i % V4;
    float mx = -INFINITY;
    for (int sp = 0; sp < nsplit; ++sp)
      mx = fmaxf(mx, __ldcg(a.part_lse + static_cast<int64_t>(slot_of(sp)) * kDecMaxG + h));
    float sum = 0.f;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp = 0; sp < nsplit; ++sp) {
      const int64_t row = static_cast<int64_t>(slot_of(sp)) * kDecMaxG + h;
      const float w = exp2f(__ldcg(a.part_lse + row) - mx);
      const float4 pv = __ldcg(reinterpret_cast<const float4*>(a.part_o + row * D) + c4);
      sum += w;
      v.x = fmaf(w, pv.x, v.x), v.y = fmaf(w, pv.y, v.y);
      v.z = fmaf(w, pv.z, v.z), v.w = fmaf(w, pv.w, v.w);
    }
    const float inv = 1.f / (sum + sink_term(a, h0 + h, mx));
    uint32_t* o = reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(h0 + h) * D + c4 * 4);
    o[0] = pack2_bits(v.x * inv, v.y * inv, a.out_bf16);
    o[1] = pack2_bits(v.z * inv, v.w * inv, a.out_bf16);
  }
}

// grid (balanced_grid(slots, X)), kDecThreads each; the partials: part_o [2 C][kDecMaxG][D],
// part_lse [2 C][kDecMaxG] for C CTAs; a.done [B * X] as decode_kernel's.
template <int D, typename KV>
__global__ void __launch_bounds__(kDecThreads) decode_balanced_kernel(AttnArgs a) {
  constexpr int LD = D + 8, CPR = D / 8, NS = kDecStages;
  constexpr int RP = 2;  // epilogue rows a pass: kDecWarps x 2 rows of f32 fit in Qs
  static_assert(kDecWarps * RP * D * 4 <= kDecMaxG * LD * 2, "the epilogue aliases Qs");
  const int groups = (a.G + kDecMaxG - 1) / kDecMaxG, X = a.nkv * groups;
  // Runs a stream: the grid is whole sets of X CTAs (balanced_grid).
  const int runs = static_cast<int>(gridDim.x) / X;
  const int c = blockIdx.x, x = c % X, r = c / X;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = x / groups, h0 = g * a.G + (x % groups) * kDecMaxG;
  const int nh = min(kDecMaxG, g * a.G + a.G - h0);  // query heads h0 .. h0 + nh

  extern __shared__ uint4 dec_smem[];
  KV* Ks = reinterpret_cast<KV*>(dec_smem);  // [NS][kDecKeys][LD]
  KV* Vs = Ks + NS * kDecKeys * LD;
  KV* Qs = Vs + NS * kDecKeys * LD;          // [kDecMaxG][LD]
  float* ml = reinterpret_cast<float*>(Qs + kDecMaxG * LD);  // [warps][rows][m, l]
  float* red = reinterpret_cast<float*>(Qs);  // the epilogue's, once q is in registers
  __shared__ int64_t warp_tiles[kDecWarps];
  __shared__ int start_b;
  __shared__ int64_t start_base;

  // The tiles of each sequence summed over the sequences before it (the step's lengths were
  // copied before any kernel ran: no wait for the previous one). A thread takes `per`
  // consecutive sequences.
  const int per = (a.B + kDecThreads - 1) / kDecThreads;
  const int b_lo = min(a.B, tid * per), b_hi = min(a.B, b_lo + per);
  int64_t mine = 0;
  for (int b = b_lo; b < b_hi; ++b)
    mine += dec_seq(a, a.seq_lens[b], a.qsl[b], a.qsl[b + 1]).n;
  int64_t incl = mine;  // inclusive scan over the warp, then over the warps
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int64_t v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) warp_tiles[warp] = incl;
  __syncthreads();
  int64_t before = incl - mine, N = 0;
#pragma unroll
  for (int w = 0; w < kDecWarps; ++w) {
    before += w < warp ? warp_tiles[w] : 0;
    N += warp_tiles[w];
  }
  // Runs of at least one tile: a stream of fewer tiles than runs gives the first N runs one
  // each and the rest nothing.
  const int R = static_cast<int>(N < runs ? N : static_cast<int64_t>(runs));
  const int64_t s = r < R ? r * N / R : 0, e = r < R ? (r + 1) * N / R : 0;
  if (s < e) {  // the sequence holding tile s
    int64_t base = before;
    for (int b = b_lo; b < b_hi; ++b) {
      const int n = dec_seq(a, a.seq_lens[b], a.qsl[b], a.qsl[b + 1]).n;
      if (s >= base && s < base + n) start_b = b, start_base = base;
      base += n;
    }
  }
  __syncthreads();
  if (s >= e) return;

  DecWalk ld, cw;  // the loads' walk, NS - 1 tiles ahead, and the math's
  ld.start(a, start_b, start_base);
  cw = ld;
  const int U = static_cast<int>(e - s);
  // Tile u of the run (stream tile s + u) into stage u % NS; past the run an empty group (the
  // waits below count groups). hole: the sequence's own key pos is left for a load after the
  // wait for the previous kernel, which writes it.
  auto load = [&](int u, bool hole) {
    if (u < U) {
      while (s + u >= ld.p + ld.seq.n) ld.next(a);
      const int k0 = ld.seq.lo + static_cast<int>(s + u - ld.p) * kDecKeys;
      load_kv_tile<D, kDecKeys, kDecThreads>(
          a, a.bt + static_cast<int64_t>(ld.b) * a.bt_stride, g, k0, ld.seq.pos + 1,
          Ks + (u % NS) * kDecKeys * LD, Vs + (u % NS) * kDecKeys * LD,
          hole ? ld.seq.pos : -1);
    } else {
      cp_async_commit();
    }
  };
  // Before waiting for the previous kernel (PDL): every key but each sequence's own this step
  // is in the cache, so the first tiles' loads start now; those keys follow after the wait,
  // one group.
#pragma unroll
  for (int u = 0; u < NS - 1; ++u) load(u, true);
  pdl_begin();
  {
    DecWalk hw = cw;
#pragma unroll
    for (int u = 0; u < NS - 1; ++u) {
      if (u >= U) break;
      while (s + u >= hw.p + hw.seq.n) hw.next(a);
      const int pos = hw.seq.pos, k0 = hw.seq.lo + static_cast<int>(s + u - hw.p) * kDecKeys;
      if (pos >= k0 && pos < k0 + kDecKeys && tid >= u * CPR && tid < (u + 1) * CPR) {
        const int row = (u % NS) * kDecKeys + (pos - k0);
        load_key_chunk<D>(a, a.bt + static_cast<int64_t>(hw.b) * a.bt_stride, g, pos,
                          Ks + row * LD, Vs + row * LD, tid - u * CPR);
      }
    }
  }
  cp_async_commit();

  float o[D / 8][4];
  float m[2], l[2];  // rows lane / 4 and lane / 4 + 8
  uint32_t qf[D / 16][4];
  bool first_item = true;  // the run's first item (slot 2 c) or a later one (2 c + 1)
  for (int u = 0; u < U; ++u) {
    while (s + u >= cw.p + cw.seq.n) {
      cw.next(a);
      first_item = false;
    }
    const int t = static_cast<int>(s + u - cw.p);
    const bool item_start = u == 0 || t == 0;
    if (item_start)  // (the last item's epilogue ended synchronized: Qs is free)
      stage_q_rows<D, LD, kDecThreads>(a, static_cast<const uint16_t*>(a.q) +
                                              cw.seq.q0 * a.q_stride +
                                              static_cast<int64_t>(h0) * D, nh, Qs);
    load(u + NS - 1, false);
    // Tile u landed (u = 0: the keys' group too); the groups after it are the loads ahead.
    if (u == 0)
      cp_async_wait<1>();
    else
      cp_async_wait<NS - 1>();
    __syncthreads();
    if (item_start) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk], Qs + (lane % 16) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) o[i][j] = 0.f;
      m[0] = m[1] = -INFINITY;
      l[0] = l[1] = 0.f;
    }
    decode_tile<D>(a, Ks, Vs, (u % NS) * kDecKeys + warp * 16,
                   cw.seq.lo + t * kDecKeys + warp * 16, cw.seq.pos + 1, qf, o, m, l, lane);
    __syncthreads();  // the next iteration's loads overwrite the oldest stage; Qs is read
    if (u + 1 < U && t + 1 < cw.seq.n) continue;

    // The item's end in this run: whole (direct) or one part of it.
    const int r0 = run_of(cw.p, N, R), r1 = run_of(cw.p + cw.seq.n - 1, N, R);
    const bool direct = r0 == r1;
    const int slot = 2 * c + (first_item ? 0 : 1);
    uint16_t* out = static_cast<uint16_t*>(a.out) + cw.seq.q0 * a.out_stride;
    decode_epilogue<D, RP>(a, o, m, l, ml, red, nh, h0, direct, out, [&](int row) {
      return static_cast<int64_t>(slot) * kDecMaxG + row;
    });
    if (!direct) {
      // The parts' slots: run r0's CTA holds the first, in slot 2 c0 where the item is the
      // first of that run (starts where the run does), else 2 c0 + 1; each later run starts
      // inside the item: slot 2 c of its CTA c.
      const int first_slot = 2 * (r0 * X + x) + (cw.p == r0 * N / R ? 0 : 1);
      merge_slots<D>(a, a.done + static_cast<int64_t>(cw.b) * X + x, r1 - r0 + 1,
                     [&](int sp) { return sp == 0 ? first_slot : 2 * ((r0 + sp) * X + x); },
                     nh, h0, out);
    }
  }
  cp_async_wait<0>();
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
template <int D, typename KV>
void launch_balanced(const AttnArgs& a, int ctas, cudaStream_t s) {
  static const bool smem_ok =
      (allow_smem(decode_balanced_kernel<D, KV>, dec_smem_bytes<D>()), true);
  (void)smem_ok;
  launch(decode_balanced_kernel<D, KV>, dim3(ctas), kDecThreads, dec_smem_bytes<D>(), s, a);
}
}  // namespace

void launch_decode(const AttnArgs& a, dim3 grid, int D, bool bf16_cache, cudaStream_t s) {
  dispatch_head_kv(D, bf16_cache, [&](auto d, auto kv) {
    launch_one<decltype(d)::value, decltype(kv)>(a, grid, s);
  });
}

void launch_decode_balanced(const AttnArgs& a, int ctas, int D, bool bf16_cache,
                            cudaStream_t s) {
  // (256: its stages take one CTA an SM, where the runs assume two; decode_kernel's)
  if (D > 128)
    throw std::invalid_argument("launch_decode_balanced: head size " + std::to_string(D) +
                                " (64 or 128 only)");
  dispatch_head_kv(D, bf16_cache, [&](auto d, auto kv) {
    if constexpr (decltype(d)::value <= 128)
      launch_balanced<decltype(d)::value, decltype(kv)>(a, ctas, s);
  });
}

}  // namespace vllmx::cuda::attn
