// Prefill attention on Hopper's warpgroup MMAs (sm_90a): the FlashAttention-2 loop of
// attention.cu's prefill kernel with both products on wgmma, which reads its operands straight
// from shared memory and runs asynchronously, where mma.sync needs every fragment staged through
// registers by ldmatrix (the prefill kernel on mma.sync ran at about a fifth of cuDNN's rate on
// the H200). Built for sm_90a alone (cmake/cutlass_sm90.cmake); attention.cu launches it on
// compute capability 9.0 for head sizes 64, 128 and 256 and keeps the mma.sync kernel elsewhere.
//
// One CTA: one warpgroup, 64 query rows (wgmma's M) of one (sequence, kv head); rows are
// flattened (token, head of the group) as in attention.cu, so a GQA group's heads share every
// K/V tile. Per tile of 64 keys:
//   S = Q K^T   wgmma m64n64k16, Q and K from shared memory (K-major),
//   online softmax of S in f32 registers (base-2 exponent), P rounded to the cache dtype,
//   O += P V    wgmma m64nDk16, P from registers, V from shared memory (MN-major).
// Two CTAs fit an SM (83 KB of shared memory, 128 threads each), so one's softmax runs while
// the other's MMAs do. K/V tiles arrive by cp.async (the paged cache's rows are gathered
// through the block table, so no TMA box describes a tile), double-buffered, in the 128-byte
// swizzled layout wgmma reads without bank conflicts (the layout, descriptors and instructions:
// attention_sm90.cuh). Head size 256 (Gemma 2 / 3, Qwen3.5) takes 165 KB of shared memory, one
// CTA an SM, and 251 registers a thread for its 64 x 256 O tile, unspilled. Long prompts
// (head sizes 64 and 128) take the warp-specialized, TMA-fed layout of 128-row CTAs
// (FlashAttention 3's) instead, attention_prefill_ws_sm90.cu; short ones fill its pipeline too
// little and run faster here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

#include "attention.cuh"
#include "attention_sm90.cuh"

#if !defined(CUTE_ARCH_MMA_SM90A_ENABLED) && defined(__CUDA_ARCH__)
#error "cuda/attention_prefill_sm90.cu is built for sm_90a only"
#endif

namespace vllmx::cuda::attn {

namespace {

using namespace sm90;

constexpr int kThreads = 128;          // one warpgroup
constexpr int kBM = kSm90PrefillRows;  // query rows per CTA: wgmma's M
constexpr int kBN = 64;                // keys per K/V tile
constexpr int kStages = 2;
static_assert(kBM == 64, "one 64-row wgmma tile per CTA");

template <int D>
constexpr int smem_bytes() {
  return (kBM + 2 * kStages * kBN) * D * 2 + 1024;  // Q, K and V stages; 1024: base alignment
}

template <int D, typename KV>
__global__ void __launch_bounds__(kThreads, 2) prefill_sm90_kernel(AttnArgs a) {
  pdl_begin();
  const int num_tiles = *a.num_tiles;
  if (static_cast<int>(blockIdx.x) >= num_tiles) return;
  // Last tiles first: within a sequence they see the most keys, so the longest CTAs start early.
  const int2 tile = a.tiles[num_tiles - 1 - blockIdx.x];
  const int b = tile.x, row_start = tile.y, g = blockIdx.y;
  constexpr int NS = kBN / 2;              // S accumulators per thread (64 x kBN over 128)
  constexpr int NO = D / 2;                // O accumulators per thread
  using M = Mma<KV, kBN, D>;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int G = a.G;
  const int q_len = a.qsl[b + 1] - a.qsl[b], q0 = a.qsl[b];
  const int ctx_start = a.seq_lens[b] - q_len;
  const int R = q_len * G;
  const int first_tok = row_start / G;
  const int last_tok = min(R - 1, row_start + kBM - 1) / G;
  const int kbeg = visible_lo(ctx_start + first_tok, a.window);
  const int kend = ctx_start + last_tok + 1;

  extern __shared__ uint4 smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = (1024 - raw_addr % 1024) % 1024;
  char* const Qs = reinterpret_cast<char*>(smem_raw) + pad;
  char* const Ks = Qs + kBM * D * 2;
  char* const Vs = Ks + kStages * kBN * D * 2;
  const uint32_t q_addr = raw_addr + pad, k_addr = q_addr + kBM * D * 2;
  const uint32_t v_addr = k_addr + kStages * kBN * D * 2;

  // Q tile -> shared memory.
  stage_q<D, kBM, kThreads, KV>(a, Qs, kBM, 0, row_start, tid, R, q0, g);

  // K/V tiles in the swizzled layout (byte offsets / 2: elements).
  const int32_t* bt_row = a.bt + static_cast<int64_t>(b) * a.bt_stride;
  auto load_kv = [&](int k0, int st) {
    gather_kv_rows<D, kBN, kThreads>(
        a, bt_row, g, k0, kend, reinterpret_cast<KV*>(Ks + st * kBN * D * 2),
        reinterpret_cast<KV*>(Vs + st * kBN * D * 2),
        [](int r, int c) { return static_cast<int>(swizzled(r, c, kBN) / 2); });
  };

  // This thread's two rows: lane / 4 and lane / 4 + 8 of its warp's 16.
  int pos[2], lo[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int f = row_start + warp * 16 + lane / 4 + h * 8;
    pos[h] = ctx_start + f / G;
    lo[h] = visible_lo(pos[h], a.window);
  }
  // CTA-uniform bounds that let whole tiles skip the mask.
  const int pos_first = ctx_start + first_tok;
  const int lo_last = visible_lo(ctx_start + last_tok, a.window);

  // Accumulator element i of a 64 x N wgmma tile: row lane / 4 + 8 * ((i / 2) % 2) of the
  // warp's 16, column 8 * (i / 4) + 2 * (lane % 4) + i % 2 (the mma.sync m16n8 layout, repeated).
  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  // Running row maxima in S's units (scores before scaling; the scale is positive, so the
  // maxima commute with it) and sums of 2^(scaled score - scaled max).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const SoftmaxScale sc(a);

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
    fence_async_shared();
    __syncthreads();

    // S = Q K^T: D / 16 steps of 16 along the head dim, 4 per 64-element column block.
    float s[NS];
    const uint32_t kt = k_addr + st * kBN * D * 2;
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t da = sw128_desc(q_addr + (kk / 4) * kBM * 128 + (kk % 4) * 32, 16, 1024);
      const uint64_t db = sw128_desc(kt + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
      wgmma_ss<typename M::S>(da, db, s, kk == 0 ? gmma::ScaleOut::Zero : gmma::ScaleOut::One,
                              std::make_index_sequence<NS>{});
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_regs(s);

    tile_softmax<kBN>(s, a, sc, k0, kend, pos_first, lo_last, pos, lo, lane, m,
                      l, [&](int h, float corr) {
#pragma unroll
                        for (int j = 0; j < NO / 4; ++j) {
                          o[4 * j + 2 * h] *= corr;
                          o[4 * j + 2 * h + 1] *= corr;
                        }
                      });

    // P as wgmma's register A fragments: for keys 16 kk .. 16 kk + 15, the accumulators of key
    // octets 2 kk and 2 kk + 1 (rows lane / 4, lane / 4 + 8), as mma.sync's m16n8k16 A.
    uint32_t p[kBN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        p[kk][r] = F16Ops<KV>::pack2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);

    // O += P V: 16 keys per step; V's 16 rows of 128 bytes per column block are 2048 bytes.
    const uint32_t vt = v_addr + st * kBN * D * 2;
    fence_regs(o);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      wgmma_rs<typename M::O>(p[kk], sw128_desc(vt + kk * 2048, kBN * 128, 1024), o,
                              std::make_index_sequence<NO>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_regs(o);
    fence_regs(p);
    __syncthreads();  // the next iteration's loads overwrite this stage
  }

  store_rows<D>(
      a, [&](int j, int h) { return make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]); }, l, m,
      sc.mul, row_start + warp * 16, R, G, g, q0, lane);
}

template <int D, typename KV>
void launch_one(const AttnArgs& a, int grid_x, cudaStream_t s) {
  constexpr int kSmem = smem_bytes<D>();
  static const bool smem_ok = (allow_smem(prefill_sm90_kernel<D, KV>, kSmem), true);
  (void)smem_ok;
  launch(prefill_sm90_kernel<D, KV>, dim3(grid_x, a.nkv), kThreads, kSmem, s, a);
}

}  // namespace

void launch_prefill_sm90(const AttnArgs& a, int grid_x, int D, bool bf16_cache, cudaStream_t s) {
  dispatch_head_kv(D, bf16_cache, [&](auto d, auto kv) {
    launch_one<decltype(d)::value, decltype(kv)>(a, grid_x, s);
  });
}

}  // namespace vllmx::cuda::attn
