// paged_attention for multi-head latent attention (DeepSeek V2 / V3, Kimi K2: layers/mla.py):
// one kv head whose kMlaHeadSize-wide cache rows ([k_pe (64) ; latent (512)]) are the keys and
// the values alike, read by every query head, in prefill and decode alike. A token's query rows
// are its heads, so a CTA takes 16 of them (the rows of one m16n8k16 tile, all with the same
// visible keys: no mask but the partition's end) over one partition of the token's keys. K
// tiles of 64 rows, double-buffered by cp.async, are read once for S and once as V:
// S = Q K^T with each of the 8 warps on 8 keys of the tile (q in registers), one maximum a row
// for the tile through shared memory, P to shared memory, O += P V with each warp on its own
// 72 of the 576 columns. Partitions merge as the decode kernel's do (merge_partials).
// (The generic kernel ran these shapes on CUDA cores, one thread a key's 576-long dot product.)
#include <algorithm>
#include <type_traits>

#include "attention.cuh"
#include "runtime.h"

namespace vllmx::cuda::attn {

namespace {

constexpr int kD = kMlaHeadSize;
constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kKeys = kDecKeys;  // keys a tile (split_plan's partitions are whole tiles)
constexpr int kStages = 2;
constexpr int kLD = kD + 8;      // shared row stride (elements): conflict-free ldmatrix
constexpr int kPLD = kKeys + 8;
constexpr int kCols = kD / kWarps;  // output columns a warp: four 16-column pairs and one 8
constexpr int kCPR = kD / 8;        // 16-byte chunks a cache row
static_assert(kCols == 72 && kKeys == kWarps * 8, "the warps' shares of S and O");

constexpr int mla_smem_bytes() {
  return (kStages * kKeys * kLD + kDecMaxG * kLD + kDecMaxG * kPLD) * 2 +
         2 * kWarps * kDecMaxG * 4;
}
static_assert(kDecMaxG * kMaxSplits * 4 <= kStages * kKeys * kLD * 2,
              "the merge's weights alias the K stages");

template <typename KV>
__global__ void __launch_bounds__(kThreads, 1) mla_kernel(AttnArgs a) {
  const int groups = (a.nq + kDecMaxG - 1) / kDecMaxG;
  const int t = blockIdx.x / groups, h0 = (blockIdx.x % groups) * kDecMaxG;
  const int nh = min(kDecMaxG, a.nq - h0), split = blockIdx.y;
  pdl_begin();
  // The sequence owning row t: the last b with qsl[b] <= t (qsl is non-decreasing).
  int lo_b = 0, hi_b = a.B;
  while (hi_b - lo_b > 1) {
    const int mid = (lo_b + hi_b) / 2;
    if (a.qsl[mid] <= t) lo_b = mid; else hi_b = mid;
  }
  const int b = lo_b, q0 = a.qsl[b], q1 = a.qsl[b + 1];
  if (t >= q1) return;  // (no sequence's query)
  const int pos = a.seq_lens[b] - (q1 - q0) + (t - q0);
  if (pos < 0) return;
  int part, nsplit;
  split_plan(pos + 1, a.max_splits, part, nsplit);
  if (split >= nsplit) return;
  const int kbeg = split * part, kend = min(kbeg + part, pos + 1);

  extern __shared__ uint4 mla_smem[];
  KV* Ks = reinterpret_cast<KV*>(mla_smem);  // [kStages][kKeys][kLD]
  KV* Qs = Ks + kStages * kKeys * kLD;       // [kDecMaxG][kLD]
  KV* Ps = Qs + kDecMaxG * kLD;              // [kDecMaxG][kPLD]
  float* row_max = reinterpret_cast<float*>(Ps + kDecMaxG * kPLD);  // [kWarps][kDecMaxG]
  float* row_sum = row_max + kWarps * kDecMaxG;                       // [kWarps][kDecMaxG]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r0 = lane / 4;
  const int32_t* bt_row = a.bt + static_cast<int64_t>(b) * a.bt_stride;
  const KV* kc = static_cast<const KV*>(a.kc);
  const int ntiles = (kend - kbeg + kKeys - 1) / kKeys;
  // A row's 72 chunks go to 72 neighbouring threads: each row is read whole, coalesced. Keys
  // at or past kend are zero-filled (0 * NaN would poison P V).
  auto load = [&](int tile) {
    if (tile < ntiles) {
      KV* dst = Ks + (tile % kStages) * kKeys * kLD;
      const int k0 = kbeg + tile * kKeys;
      for (int i = tid; i < kKeys * kCPR; i += kThreads) {
        const int r = i / kCPR, c = i % kCPR, p = min(k0 + r, kend - 1);
        const int64_t slot = static_cast<int64_t>(bt_row[p / a.block_size]) * a.block_size +
                             p % a.block_size;
        cp_async16(dst + r * kLD + c * 8, kc + slot * kD + c * 8, k0 + r < kend);
      }
    }
    cp_async_commit();  // (an empty group past the last tile: the waits count groups)
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load(s);

  stage_q_rows<kD, kLD, kThreads>(a, static_cast<const uint16_t*>(a.q) +
                                        static_cast<int64_t>(t) * a.q_stride +
                                        static_cast<int64_t>(h0) * kD, nh, Qs);

  float o[kCols / 8][4];
#pragma unroll
  for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  // Rows r0 and r0 + 8: the running maximum (the same in every warp) and this warp's keys' sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t qf[kD / 16][4];
  const float scale_log2 = a.scale * kLog2e;

  for (int it = 0; it < ntiles; ++it) {
    load(it + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncthreads();
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        ldmatrix_x4(qf[kk], Qs + (lane % 16) * kLD + kk * 16 + (lane / 16) * 8);
    }
    const KV* Kt = Ks + (it % kStages) * kKeys * kLD;

    // S = Q K^T, the 16 rows x this warp's 8 keys; an ldmatrix_x4 holds two k-steps (its four
    // 8x8 matrices: the 8 keys at columns +0, +8, +16, +24).
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    const KV* kw = Kt + (warp * 8 + lane % 8) * kLD + (lane / 8) * 8;
#pragma unroll
    for (int kk = 0; kk < kD / 16; kk += 2) {
      uint32_t r4[4];
      ldmatrix_x4(r4, kw + kk * 16);
      mma16816<KV>(s, qf[kk], r4[0], r4[1]);
      mma16816<KV>(s, qf[kk + 1], r4[2], r4[3]);
    }
    const int key = kbeg + it * kKeys + warp * 8 + (lane % 4) * 2;
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] = key + (e & 1) < kend ? s[e] * scale_log2 : -INFINITY;

    // The tile's maximum of each row over the 8 warps' keys, then P = exp2(S - m).
    float mx[2] = {fmaxf(s[0], s[1]), fmaxf(s[2], s[3])};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if (lane % 4 == 0) row_max[warp * kDecMaxG + r0 + 8 * h] = mx[h];
    }
    __syncthreads();
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) tile_max = fmaxf(tile_max, row_max[w * kDecMaxG + r0 + 8 * h]);
      const float mnew = fmaxf(m[h], tile_max);  // finite: every tile has a visible key
      corr[h] = exp2f(m[h] - mnew);              // (0 at the first tile)
      m[h] = mnew;
      const float p0 = exp2f(s[2 * h] - mnew), p1 = exp2f(s[2 * h + 1] - mnew);
      l[h] = l[h] * corr[h] + p0 + p1;
      *reinterpret_cast<uint32_t*>(Ps + (r0 + 8 * h) * kPLD + warp * 8 + (lane % 4) * 2) =
          F16Ops<KV>::pack2(p0, p1);
    }
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
      o[n][0] *= corr[0], o[n][1] *= corr[0];
      o[n][2] *= corr[1], o[n][3] *= corr[1];
    }
    __syncthreads();

    // O += P V for this warp's columns; V is the tile itself.
    const KV* vw = Kt + warp * kCols;
#pragma unroll
    for (int j = 0; j < kKeys / 16; ++j) {
      uint32_t pa[4];
      ldmatrix_x4(pa, Ps + (lane % 16) * kPLD + j * 16 + (lane / 16) * 8);
      const KV* vj = vw + (j * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kLD + (lane / 16) * 8;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t r4[4];
        ldmatrix_x4_trans(r4, vj + i * 16);
        mma16816<KV>(o[2 * i], pa, r4[0], r4[1]);
        mma16816<KV>(o[2 * i + 1], pa, r4[2], r4[3]);
      }
      uint32_t r2[2];
      ldmatrix_x2_trans(r2, vw + (j * 16 + lane % 16) * kLD + 64);
      mma16816<KV>(o[8], pa, r2[0], r2[1]);
    }
    __syncthreads();  // the next iteration's loads overwrite the oldest stage, row_max and Ps
  }
  cp_async_wait<0>();  // (only empty groups are left)

  // Each row's sum over the warps' keys (one maximum for all of them).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (lane % 4 == 0) row_sum[warp * kDecMaxG + r0 + 8 * h] = l[h];
  }
  __syncthreads();
  const bool direct = nsplit == 1;
  uint16_t* out = static_cast<uint16_t*>(a.out) + static_cast<int64_t>(t) * a.out_stride;
  const int64_t slot0 = (static_cast<int64_t>(t) * a.nq + h0) * a.max_splits;  // head h0
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    if (r >= nh) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += row_sum[w * kDecMaxG + r];
    const float inv = 1.f / sum;
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
      const int col = warp * kCols + n * 8 + (lane % 4) * 2;
      const float v0 = o[n][2 * h] * inv, v1 = o[n][2 * h + 1] * inv;
      if (direct)
        *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(h0 + r) * kD + col) =
            pack2_bits(v0, v1, a.out_bf16);
      else
        *reinterpret_cast<float2*>(a.part_o + (slot0 + r * a.max_splits + split) * kD + col) =
            make_float2(v0, v1);
    }
    if (!direct && warp == 0 && lane % 4 == 0)
      a.part_lse[slot0 + r * a.max_splits + split] = m[h] + log2f(sum);
  }
  if (direct) return;
  merge_partials<kD, kWarps>(a, a.done + blockIdx.x, slot0, nh, nsplit, h0, out,
                             reinterpret_cast<float*>(mla_smem));
}

template <typename KV>
void launch_one(const AttnArgs& a, dim3 grid, cudaStream_t s) {
  static const bool smem_ok = (allow_smem(mla_kernel<KV>, mla_smem_bytes()), true);
  (void)smem_ok;
  launch(mla_kernel<KV>, grid, kThreads, mla_smem_bytes(), s, a);
}

}  // namespace

void launch_mla(const AttnArgs& a, dim3 grid, bool bf16_cache, cudaStream_t s) {
  bf16_cache ? launch_one<__nv_bfloat16>(a, grid, s) : launch_one<__half>(a, grid, s);
}

}  // namespace vllmx::cuda::attn
