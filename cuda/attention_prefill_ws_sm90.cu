// Prefill attention on Hopper for long prompts, laid out as FlashAttention 3 lays out its
// forward kernel: warp-specialized, the K/V tiles brought by the tensor memory accelerator.
// cuda/attention.cu takes it for head size 128 where the batch's longest query has
// kWsPrefillMinQueryLen tokens or more and the cache's blocks hold boxes of 8 rows or more, and
// attention_prefill_sm90.cu's kernel elsewhere. Measured (bench/attention_prefill_bench.cu,
// 2026-12-06, Llama-3-8B's 32/8 heads, blocks of 16), TFLOP/s against that kernel's: on the
// H200 a 4096-token prompt 408 / 324, 8192 468 / 360, 2 x 2048 after 6000 cached keys 488 / 362,
// 8 x 1024 228 / 220, but 3 x 300 61 / 117 and 2 x 700 (12/4 heads) 122 / 145: few key tiles a
// CTA barely fill its pipeline; on an H100 the same first four within 1%, and slower at head
// size 64 (4 x 1024, 16/8 heads: 168 / 183) and for blocks of 7 rows, which no box divides and
// its one producer warp gathers by cp.async (2 x 1100 after 1500: 94 / 219).
//
// Persistent since 2026-12-07 (Items: a CTA an SM takes (row tile, kv head) items in turn, the
// next one's Q and first K/V tiles loading while it finishes the last): on an H100 8 x 1024
// tokens 222 -> 245 TFLOP/s, 32 x 1024 231 -> 291, 8192 478 -> 491 (torch SDPA 437 / 497 / 626;
// bench/results/gpu_attention_prefill_persistent_h100.json). Items claimed from a counter since
// (static c, c + gridDim.x, ... gave the busiest CTA 1.26x the mean work at 8 x 1024): the same
// H100, the previous library alternated twice in one call, 8 x 1024 247 -> 278 TFLOP/s,
// 32 x 1024 291 -> 295, 4096 409 -> 441, 8192 492 -> 518, 2 x 7936 492 -> 522 (torch SDPA
// 446-646; bench/results/gpu_attention_prefill_claimed_h100.json).
//
// One item: kBM = 128 query rows of one (sequence, kv head), rows flattened (token, head of the
// group) as in attention.cu, so a GQA group's heads share every K/V tile; three roles:
//   - a producer warp moves 128-key K and V tiles into two stages each, in the 128-byte
//     swizzled layout wgmma reads. The paged cache has no box for a whole tile, but each
//     block's run of rows is one: a key tile is kBN / box_rows boxes per 64 columns, box_rows
//     the largest power of two (<= kBN, >= 8) dividing the block size, each counted on the
//     stage's full barrier. The tile that ends past the sequence (its rows there must be
//     zeros: 0 * NaN would poison P V), and every tile of a block size with no such box, come
//     by cp.async from the warp's lanes instead (gather_kv_rows, zero-filled).
//   - two consumer warpgroups, 64 rows each: per tile S = Q K^T (wgmma m64n128k16, both from
//     shared memory), online softmax in f32 registers, O += P V (P from registers). Each issues
//     S for tile t and behind it P V for tile t - 1, then runs tile t's softmax while that
//     P V runs (FlashAttention 3's intra-warpgroup pipelining), and the two take turns to
//     issue (named barriers: one's softmax overlaps the other's MMAs, the ping-pong).
// Stages are handed back through empty barriers, K's after its S, V's after its P V, so the
// producer refills a K stage one tile before the V stage beside it. Its Q staging, masking and
// softmax (attention_sm90.cuh stage_q, tile_softmax) and row stores (attention.cuh store_rows)
// are attention_prefill_sm90.cu's, shared so that neither kernel's machine code changed (SASS
// compared before and after: the other kernel's identical, this one's but for four compares
// with their operands swapped).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "attention.cuh"
#include "attention_sm90.cuh"
#include "tma_sm90.cuh"

#if !defined(CUTE_ARCH_MMA_SM90A_ENABLED) && defined(__CUDA_ARCH__)
#error "cuda/attention_prefill_ws_sm90.cu is built for sm_90a only"
#endif

namespace vllmx::cuda::attn {

namespace {

using namespace sm90;
using namespace tma;

constexpr int kConsumers = 2;                     // warpgroups of 64 query rows
constexpr int kConsumerThreads = kConsumers * 128;
constexpr int kConsumerWarps = kConsumerThreads / 32;
// And a producer warpgroup, of which one warp works: registers are allocated a warpgroup at a
// time, and setmaxnreg (a warpgroup's instruction) moves the producer's to the consumers,
// whose S, P and O tiles need 232 (168 each, the even split, spilled).
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536, "register file");
constexpr int kBM = 128;                          // query rows per CTA
constexpr int kBN = kWsPrefillKeys;               // keys per K/V tile
constexpr int kStages = 2;                        // of K, and of V
constexpr int kItemSlots = 4;                     // the work items' ring (ItemRing)
static_assert(kBM == 64 * kConsumers, "one 64-row wgmma tile per consumer warpgroup");
// Named barriers (0 is __syncthreads): each consumer's turn to issue, and each one's own.
constexpr int kTurnBar = 1, kGroupBar = 1 + kConsumers;

template <int D>
constexpr int kTileBytes = kBN * D * 2;
template <int D>
constexpr int smem_bytes() {  // Q, the K and V stages, their 4 barriers each, the item ring's
  // barriers and ids; 1024: alignment
  return kBM * D * 2 + 2 * kStages * kTileBytes<D> + 4 * kStages * 8 + kItemSlots * 12 + 1024;
}

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A work item: rows row_start .. row_start + kBM of sequence b's flattened (token, head of
// group g) rows, and the keys they see, in ntiles tiles from kbeg.
struct CtaTile {
  int b, g, row_start, q0, ctx_start, rows, first_tok, last_tok, kbeg, kend, ntiles;
};

__device__ __forceinline__ CtaTile cta_tile(const AttnArgs& a, int2 tile, int g, int box_rows) {
  CtaTile t;
  t.b = tile.x, t.row_start = tile.y, t.g = g;
  const int q_len = a.qsl[t.b + 1] - a.qsl[t.b];
  t.q0 = a.qsl[t.b];
  t.ctx_start = a.seq_lens[t.b] - q_len;
  t.rows = q_len * a.G;
  t.first_tok = t.row_start / a.G;
  t.last_tok = min(t.rows - 1, t.row_start + kBM - 1) / a.G;
  t.kend = t.ctx_start + t.last_tok + 1;
  // Tiles start on a box boundary (keys below a window's start are masked like any other).
  const int align = box_rows > 0 ? box_rows : 1;
  t.kbeg = visible_lo(t.ctx_start + t.first_tok, a.window) / align * align;
  t.ntiles = (t.kend - t.kbeg + kBN - 1) / kBN;
  return t;
}

// The persistent grid's work: (row tile, kv head) items, the row tiles last first (within a
// sequence the last rows see the most keys, so the longest items start early), kv heads
// innermost. One CTA an SM, whose producer moves the next item's first K/V tiles while the
// consumers finish this one's (FlashAttention 3's persistent kernel; a CTA an item paid its
// start, its Q load and its pipeline's fill for a short prompt's few tiles each time: 8 x 1024
// tokens ran at half its TFLOP/s on 8192). CTA c's first item is c; each next one it claims
// from a counter (a.num_tiles[1]) as its producer starts the one before, as a CTA an item took
// them from the hardware. Items c, c + gridDim.x, ... in turn gave the busiest of 132 CTAs
// 1.26x the mean work at 8 x 1024 tokens, 1.06x at 8192 and 2 x 7936 (tile counts summed);
// claimed as CTAs free up, 1.00-1.02x.
struct Items {
  int count, num_tiles;
  __device__ __forceinline__ CtaTile at(const AttnArgs& a, int w, int box_rows) const {
    return cta_tile(a, a.tiles[num_tiles - 1 - w / a.nkv], w % a.nkv, box_rows);
  }
};
// The producer hands each item it claims to the consumers through a ring of kItemSlots ids,
// each slot's barrier completing once per id (the producer runs at most two items ahead: its
// K/V stages). An id past the last item ends the CTA.
// Its barriers sit right after the K/V stages' four kinds, its ids after them, so both are
// fixed offsets from full_k (no registers of their own: the producer has 40).
struct ItemRing {
  uint64_t* full;  // full_k + 4 * kStages
  __device__ __forceinline__ explicit ItemRing(uint64_t* full_k) : full(full_k + 4 * kStages) {}
  // Slot s's id (shared address) and barrier.
  __device__ __forceinline__ uint32_t id_addr(int s) const {
    return smem_addr(full + kItemSlots) + 4 * s;
  }
  // One thread: the id, then the arrival (release: the id is seen by whoever sees the phase),
  // in one asm statement. (Called at the top of the producer's item loop it put 72 bytes of
  // the producer's locals on the stack; where lane 0 has its claim, nothing.)
  __device__ __forceinline__ void put(int j, int w) const {
    const int s = j % kItemSlots;
    asm volatile(
        "st.shared.u32 [%0], %1;\n\t"
        "mbarrier.arrive.shared::cta.b64 _, [%2];" ::"r"(id_addr(s)),
        "r"(w), "r"(smem_addr(&full[s])));
  }
  __device__ __forceinline__ int get(int j) const {
    const int s = j % kItemSlots;
    mbar_wait(&full[s], (j / kItemSlots) & 1);
    int w;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(w) : "r"(id_addr(s)));
    return w;
  }
};

// The producer warp: each item's K and V tiles t = 0 .. ntiles - 1 of keys kbeg + t kBN into
// the stages, which run on across items (n: the tiles moved before).
template <int D, typename KV>
__device__ __forceinline__ void produce(const AttnArgs& a, const Items& items,
                                        const CUtensorMap& kmap, const CUtensorMap& vmap,
                                        int box_rows, char* Ks, char* Vs, uint64_t* full_k,
                                        uint64_t* full_v, uint64_t* empty_k, uint64_t* empty_v) {
  const ItemRing ring(full_k);
  const int lane = threadIdx.x % 32, bs = a.block_size;
  // A TMA tile is nb = kBN / box_rows boxes (<= 16: box_rows >= 8), lane j < nb issuing box j.
  // Its cache slot comes from the block table, a global load: read by all nb lanes at once and
  // a tile ahead, so the producer waits on no load per box (one after another, each box's load
  // had cost the producer about twice the consumers' time per tile: ncu, 2026-12-06, the
  // consumers stalled on the full barriers 42% of their samples).
  const int nb = box_rows > 0 ? kBN / box_rows : 0;
  int n = 0, j = 0, w = blockIdx.x;
  if (lane == 0) ring.put(j, w);
  while (w < items.count) {
    // The next item, claimed as this one starts: the atomic's round trip runs under this
    // item's loads, its result read once they are all on their way.
    int claimed = 0;
    if (lane == 0) claimed = static_cast<int>(gridDim.x) + atomicAdd(a.num_tiles + 1, 1);
    const CtaTile ct = items.at(a, w, box_rows);
    const int g = ct.g, kbeg = ct.kbeg, kend = ct.kend, ntiles = ct.ntiles;
    const int32_t* bt_row = a.bt + static_cast<int64_t>(ct.b) * a.bt_stride;
    auto box_slot = [&](int t) {
      const int key = kbeg + t * kBN + lane * box_rows;
      if (lane >= nb || t >= ntiles || key >= kend) return 0;
      const int page = key / bs;
      return bt_row[page] * bs + key - page * bs;
    };
    int slot = box_slot(0);
    for (int t = 0; t < ntiles; ++t, ++n) {
      const int st = n % kStages, k0 = kbeg + t * kBN;
      const uint32_t freed = (n / kStages - 1) & 1;  // the parity of the stage's last release
      char* const kt = Ks + st * kTileBytes<D>;
      char* const vt = Vs + st * kTileBytes<D>;
      const int this_slot = slot;
      slot = box_slot(t + 1);  // the next tile's, in flight while this one is issued
      if (box_rows > 0 && k0 + kBN <= kend) {
        // One block's run of box_rows keys a box: kbeg and kBN are multiples of box_rows,
        // which divides the block size, so no box straddles two blocks.
        auto boxes = [&](const CUtensorMap& map, char* dst, uint64_t* full) {
          if (lane == 0) mbar_expect_tx(full, kTileBytes<D>);
          __syncwarp();
          if (lane < nb) {
#pragma unroll
            for (int cb = 0; cb < D / 64; ++cb)
              tma_box(dst + (cb * kBN + lane * box_rows) * 128, map, g * D + cb * 64, this_slot,
                      full);
          }
        };
        if (n >= kStages) mbar_wait(&empty_k[st], freed);
        boxes(kmap, kt, &full_k[st]);
        if (n >= kStages) mbar_wait(&empty_v[st], freed);
        boxes(vmap, vt, &full_v[st]);
      } else {
        if (n >= kStages) {
          mbar_wait(&empty_k[st], freed);
          mbar_wait(&empty_v[st], freed);
        }
        // 32 rows at a time: the producer's few registers hold one pass's addresses.
#pragma unroll 1
        for (int r0 = 0; r0 < kBN; r0 += 32)
          gather_kv_rows<D, 32, 32>(a, bt_row, g, k0 + r0, kend, reinterpret_cast<KV*>(kt),
                                    reinterpret_cast<KV*>(vt), [r0](int r, int c) {
                                      return static_cast<int>(swizzled(r0 + r, c, kBN) / 2);
                                    });
        cp_async_wait<0>();
        fence_async_shared();
        __syncwarp();
        if (lane == 0) {
          mbar_arrive(&full_k[st]);
          mbar_arrive(&full_v[st]);
        }
      }
      __syncwarp();
    }
    if (lane == 0) ring.put(++j, claimed);
    w = __shfl_sync(0xffffffffu, claimed, 0);
  }
}

// A consumer warpgroup: rows wg * 64 .. wg * 64 + 63 of each item's row_start .. + kBM. Its Q
// rows of the next item come by cp.async as soon as this item's last S has read its own, so
// they land while it finishes (q in another dtype than the cache: loaded and converted when
// the item starts).
template <int D, typename KV>
__device__ __forceinline__ void consume(const AttnArgs& a, const Items& items, int box_rows,
                                        char* Qs, uint32_t q_addr, uint32_t k_addr,
                                        uint32_t v_addr, uint64_t* full_k, uint64_t* full_v,
                                        uint64_t* empty_k, uint64_t* empty_v) {
  const ItemRing ring(full_k);
  constexpr int NS = kBN / 2;              // S accumulators per thread (64 x kBN over 128)
  constexpr int NO = D / 2;                // O accumulators per thread
  using M = Mma<KV, kBN, D>;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = warp / 4, wtid = tid % 128, wwarp = warp % 4;
  const bool q_async = a.q_bf16 == std::is_same_v<KV, __nv_bfloat16>;
  auto stage = [&](const CtaTile& c) {  // this warpgroup's Q rows of item c
    if (q_async)
      stage_q<D, 64, 128, KV, true>(a, Qs, kBM, wg * 64, c.row_start + wg * 64, wtid, c.rows,
                                    c.q0, c.g);
    else
      stage_q<D, 64, 128, KV>(a, Qs, kBM, wg * 64, c.row_start + wg * 64, wtid, c.rows, c.q0,
                              c.g);
  };
  auto my_turn = [&] { named_sync(kTurnBar + wg, kConsumerThreads); };
  auto pass_turn = [&] { named_arrive(kTurnBar + (wg ^ 1), kConsumerThreads); };
  auto release = [&](uint64_t* bar) {
    if (lane == 0) mbar_arrive(bar);
  };
  const SoftmaxScale sc(a);

  CtaTile ct = items.at(a, ring.get(0), box_rows);  // (the first: blockIdx.x < items.count)
  stage(ct);
  bool more = true;
  for (int j = 0, n = 0; more; ++j) {  // item j; n: K/V tiles consumed before it
    const int G = a.G, g = ct.g, R = ct.rows, q0 = ct.q0, ctx_start = ct.ctx_start;
    const int kbeg = ct.kbeg, kend = ct.kend, ntiles = ct.ntiles;
    const int row0 = ct.row_start + wg * 64;
    cp_async_wait<0>();
    fence_async_shared();
    named_sync(kGroupBar + wg, 128);  // the warpgroup's Q rows in place
    // Each item's first turn is consumer 0's.
    if (wg == 1) named_arrive(kTurnBar, kConsumerThreads);

    // This thread's two rows: lane / 4 and lane / 4 + 8 of its warp's 16.
    int pos[2], lo[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int f = row0 + wwarp * 16 + lane / 4 + h * 8;
      pos[h] = ctx_start + f / G;
      lo[h] = visible_lo(pos[h], a.window);
    }
    // CTA-uniform bounds that let whole tiles skip the mask.
    const int pos_first = ctx_start + ct.first_tok;
    const int lo_last = visible_lo(ctx_start + ct.last_tok, a.window);

    // Accumulator element i of a 64 x N wgmma tile: row lane / 4 + 8 * ((i / 2) % 2) of the
    // warp's 16, column 8 * (i / 4) + 2 * (lane % 4) + i % 2 (the mma.sync m16n8 layout,
    // repeated).
    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = 0.f;
    // Running row maxima in S's units (scores before scaling; the scale is positive, so the
    // maxima commute with it) and sums of 2^(scaled score - scaled max).
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    auto issue_s = [&](float (&s)[NS], int st) {
      const uint32_t kt = k_addr + st * kTileBytes<D>;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint64_t da =
            sw128_desc(q_addr + (kk / 4) * kBM * 128 + wg * 64 * 128 + (kk % 4) * 32, 16, 1024);
        const uint64_t db = sw128_desc(kt + (kk / 4) * kBN * 128 + (kk % 4) * 32, 16, 1024);
        wgmma_ss<typename M::S>(da, db, s,
                                kk == 0 ? gmma::ScaleOut::Zero : gmma::ScaleOut::One,
                                std::make_index_sequence<NS>{});
      }
      cute::warpgroup_commit_batch();
    };
    // P as wgmma's register A fragments: for keys 16 kk .. 16 kk + 15, the accumulators of key
    // octets 2 kk and 2 kk + 1 (rows lane / 4, lane / 4 + 8), as mma.sync's m16n8k16 A.
    uint32_t p[kBN / 16][4];
    auto issue_pv = [&](int st) {  // O += P V: 16 keys a step, 2048 bytes of V's column block
      const uint32_t vt = v_addr + st * kTileBytes<D>;
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk)
        wgmma_rs<typename M::O>(p[kk], sw128_desc(vt + kk * 2048, kBN * 128, 1024), o,
                                std::make_index_sequence<NO>{});
      cute::warpgroup_commit_batch();
    };
    // Mask, then the online softmax of tile k0's scores: s becomes 2^(scaled score - new max),
    // l takes the tile's sums, corr the factor O must take before this tile's P V adds to it.
    auto softmax = [&](float (&s)[NS], int k0, float (&corr)[2]) {
      tile_softmax<kBN>(s, a, sc, k0, kend, pos_first, lo_last, pos, lo, lane, m,
                        l, [&](int h, float c) { corr[h] = c; });
    };
    auto rescale_and_pack = [&](const float (&s)[NS], const float (&corr)[2]) {
#pragma unroll
      for (int j = 0; j < NO / 4; ++j) {
        o[4 * j] *= corr[0], o[4 * j + 1] *= corr[0];
        o[4 * j + 2] *= corr[1], o[4 * j + 3] *= corr[1];
      }
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          p[kk][r] = F16Ops<KV>::pack2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    };

    float s[NS], corr[2];
    // Tile 0: S alone.
    {
      const int st = n % kStages;
      mbar_wait(&full_k[st], (n / kStages) & 1);
      my_turn();
      cute::warpgroup_arrive();
      issue_s(s, st);
      pass_turn();
      cute::warpgroup_wait<0>();
      fence_regs(s);
      release(&empty_k[st]);
      softmax(s, kbeg, corr);
      rescale_and_pack(s, corr);
    }
    // Tile t: S_t, and behind it P_{t-1} V_{t-1}; tile t's softmax while that runs.
    for (int t = 1; t < ntiles; ++t) {
      const int i = n + t, st = i % kStages, pst = (i - 1) % kStages;
      mbar_wait(&full_k[st], (i / kStages) & 1);
      mbar_wait(&full_v[pst], ((i - 1) / kStages) & 1);
      my_turn();
      fence_regs(o);
      fence_regs(p);
      cute::warpgroup_arrive();
      issue_s(s, st);
      issue_pv(pst);
      pass_turn();
      cute::warpgroup_wait<1>();
      fence_regs(s);
      release(&empty_k[st]);
      softmax(s, kbeg + t * kBN, corr);
      cute::warpgroup_wait<0>();
      fence_regs(o);
      fence_regs(p);
      release(&empty_v[pst]);
      rescale_and_pack(s, corr);
    }
    // Every S of this item has read the warpgroup's Q rows: the next item's may come.
    const int next = ring.get(j + 1);
    more = next < items.count;
    if (more) {
      ct = items.at(a, next, box_rows);
      if (q_async) stage(ct);
    }
    // The last tile's P V. (Consumer 1 passes no turn after it: consumer 0 issues nothing more
    // for this item, and every arrival on a turn barrier meets a wait.)
    const int last = n + ntiles - 1, lst = last % kStages;
    mbar_wait(&full_v[lst], (last / kStages) & 1);
    my_turn();
    fence_regs(o);
    fence_regs(p);
    cute::warpgroup_arrive();
    issue_pv(lst);
    if (wg == 0) pass_turn();
    cute::warpgroup_wait<0>();
    fence_regs(o);
    fence_regs(p);
    release(&empty_v[lst]);
    n += ntiles;

    store_rows<D>(
        a, [&](int c, int h) { return make_float2(o[4 * c + 2 * h], o[4 * c + 2 * h + 1]); }, l,
        m, sc.mul, row0 + wwarp * 16, R, G, g, q0, lane);
    if (more && !q_async) stage(ct);
  }
}

template <int D, typename KV>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_sm90_kernel(AttnArgs a, const __grid_constant__ CUtensorMap kmap,
                        const __grid_constant__ CUtensorMap vmap, int box_rows) {
  pdl_begin();
  const int num_tiles = *a.num_tiles;
  const Items items{num_tiles * a.nkv, num_tiles};
  if (static_cast<int>(blockIdx.x) >= items.count) return;
  const int warp = threadIdx.x / 32;

  extern __shared__ uint4 smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = (1024 - raw_addr % 1024) % 1024;
  char* const Qs = reinterpret_cast<char*>(smem_raw) + pad;
  char* const Ks = Qs + kBM * D * 2;
  char* const Vs = Ks + kStages * kTileBytes<D>;
  uint64_t* const full_k = reinterpret_cast<uint64_t*>(Vs + kStages * kTileBytes<D>);
  uint64_t* const full_v = full_k + kStages;
  uint64_t* const empty_k = full_v + kStages;
  uint64_t* const empty_v = empty_k + kStages;
  const uint32_t q_addr = raw_addr + pad, k_addr = q_addr + kBM * D * 2;
  const uint32_t v_addr = k_addr + kStages * kTileBytes<D>;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full_k[s], 1);
      mbar_init(&full_v[s], 1);
      mbar_init(&empty_k[s], kConsumerWarps);
      mbar_init(&empty_v[s], kConsumerWarps);
    }
    for (int s = 0; s < kItemSlots; ++s) mbar_init(&ItemRing(full_k).full[s], 1);
    mbar_fence_init();
  }
  __syncthreads();

  if (warp >= kConsumerWarps) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps)
      produce<D, KV>(a, items, kmap, vmap, box_rows, Ks, Vs, full_k, full_v, empty_k, empty_v);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    consume<D, KV>(a, items, box_rows, Qs, q_addr, k_addr, v_addr, full_k, full_v, empty_k,
                   empty_v);
  }
}

template <int D, typename KV>
void launch_one(const AttnArgs& a, int grid_x, int64_t cache_slots, cudaStream_t s) {
  constexpr int kSmem = smem_bytes<D>();
  static const bool smem_ok = (allow_smem(prefill_sm90_kernel<D, KV>, kSmem), true);
  (void)smem_ok;
  // Boxes of a block's rows (ws_box_rows), none where the driver refuses the maps.
  int box_rows = ws_box_rows(a.block_size);
  CUtensorMap kmap{}, vmap{};
  const int64_t cols = static_cast<int64_t>(a.nkv) * D;
  if (box_rows == 0 || !cached_map(&kmap, a.kc, cols, cache_slots, cols, box_rows) ||
      !cached_map(&vmap, a.vc, cols, cache_slots, cols, box_rows))
    box_rows = 0;
  // Persistent: a CTA an SM (its shared memory allows no second), or one an item where the
  // items (at most grid_x row tiles a kv head) are fewer.
  const int ctas = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(grid_x) * a.nkv,
                                                      num_sms()));
  launch(prefill_sm90_kernel<D, KV>, ctas, kThreads, kSmem, s, a, kmap, vmap, box_rows);
}

}  // namespace

void launch_prefill_ws_sm90(const AttnArgs& a, int grid_x, bool bf16_cache, int64_t cache_slots,
                            cudaStream_t s) {
  bf16_cache ? launch_one<128, __nv_bfloat16>(a, grid_x, cache_slots, s)
             : launch_one<128, __half>(a, grid_x, cache_slots, s);
}

}  // namespace vllmx::cuda::attn
