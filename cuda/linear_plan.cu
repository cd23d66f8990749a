// linear's planner, on the host: which kernel takes out[T, N] = x[T, K] @ w[N, K]^T (+ bias[N])
// (plan_linear), on which CUTLASS tile and schedule, and what set_linear_tuning forces in the
// planner's place. linear.cu launches the plan.
//
// Kernel families, picked by plan_linear() (the kernels hold no policy):
// - gemv_kernel (cuda/gemv.cu; T <= 4 for block weights, T <= 2 for same-dtype ones, decode):
//   memory-bound, streams w once.
// - gemm_skinny_kernel (cuda/gemm_skinny.cu; 3 <= T <= 32, x and w of one dtype): w rows on the
//   mma's M side and split-K, so that small batches stream w at the bandwidth limit; on Hopper
//   the CUTLASS GEMM's narrow swapped tiles take products above 4096 x 4096 from T =
//   kSm90MinT up (the widest from T = 3).
// - gemm_kernel (cuda/linear.cu; other T > 4): tensor cores (mma.sync m16n8k16, f32 accumulate)
//   over a multistage cp.async pipeline. x tiles always arrive by cp.async; w tiles too when w
//   has x's dtype, otherwise (the other 16-bit type, Q8_0/Q4_0/Q4_1, the k-quants
//   Q4_K/Q5_K/Q6_K, IQ4_NL / IQ4_XS) they are loaded into registers one tile ahead and
//   dequantized into shared memory as x's dtype before the mma.
// - sm90_gemm (cuda/gemm_*sm90.cu, CUTLASS 3; builds with sm_90a only): on compute capability
//   9.0, x and w of one 16-bit dtype, T >= kSm90MinT, TMA-friendly shapes: operands swapped up
//   to T = 128 (16-, 32-, 64- or 128-token tiles), except that for T = 65-256 tiles of 128
//   tokens on 32 or 64 weight rows take the product where they fit one wave (plan_sm90_narrow);
//   CUTLASS's stream-K scheduler runs each product data-parallel, split-K or stream-K
//   (plan_sm90_schedule). wgmma reaches several times the mma.sync kernel's rate on Hopper.
// - linear_generic_kernel (cuda/linear.cu): one thread per output, any dtype mix (f32 x/out
//   too) and any alignment; the scalar twin the fast paths fall back to.
#include <iterator>
#include <stdexcept>
#include <string>

#include "cuda_util.cuh"
#include "gemm_sm90.h"
#include "linear.cuh"
#include "mma.cuh"
#include "runtime.h"

namespace vllmx::cuda {

namespace {

using namespace detail;
using namespace lin;

// From here on the CUTLASS GEMM takes every product it can: swapped for T <= 128 (the weight
// rows fill wgmma's 128-row tile, the tokens the narrowest of a 16-, 32-, 64- or 128-wide one),
// straight above; stream-K spreads the K loop over the SMs where the output has too few tiles
// for them. Below kSm90MinT the skinny kernel does as well: at Llama-3-8B's shapes on the H200
// (bench/gpu_kernels_vs_torch.py, both in CUDA graphs; the skinny one with VLLMX_CUDA_SM90=0)
// the narrow tiles stream its MLP weights at 3.4-3.5 TB/s (0.84-0.90x cuBLAS) from T = 12 up,
// where the skinny kernel falls from 3.2 TB/s at T = 12 to 2.4-2.7 at T = 32, and its
// 128256-row lm_head at 4.3 TB/s (1.01-1.04x cuBLAS) against the skinny's 3.0-3.7; at T = 12
// the two tie over a layer, the skinny kernel ahead on the 4096 x 4096 projections.
constexpr int64_t kSm90MinT = 12;
// Wide products (Llama-3-8B's 28672-row gate_up) from the GEMV's end (T = 3): with weights
// rotated out of L2 (bench/results/gpu_linear_decode_rotated.json) the skinny kernel streamed
// 28672 x 4096 at 3.3 TB/s at T = 8 (0.81x cuBLAS) where the 16-token narrow tile did 4.0 TB/s
// at T = 12; taking it from T = 5 lifted Llama-3-8B's batch-8 decode 1268 -> 1348 tok/s on the
// H200, and T = 3-4 came with the skinny change (kSkinnyMinT) that lifted batch 4.
constexpr int64_t kSm90WideN = 16384;
constexpr int64_t kSm90MaxSwapT = 128;
// The straight tiles by T (plan_sm90): the ping-pong kernel from kSm90PingpongMinT tokens, 256
// tokens a tile from kSm90TallMinT where those give every SM one.
constexpr int64_t kSm90PingpongMinT = 512, kSm90TallMinT = 2048;
// Decode batches past the swapped 64-token tile (plan_sm90_narrow): 128 tokens on 32 or 64 weight
// rows up to kSm90NarrowMaxT tokens.
constexpr int64_t kSm90NarrowMaxT = 256;
constexpr int64_t kSkinnyMaxElems = int64_t{4096} * 4096;

// set_linear_tuning's kernels by number (bench/gpu_kernels_vs_torch.py --plans names them).
enum class ForcedPath {
  kSkinny,
  kSwap16,
  kSwap32,
  kSwap64,
  kSwap128,
  k128x128,
  k128x256,
  kPingpong128x128,
  k256x128,
  k128x32,
  k128x64,
  k128x32c21,
  k128x64c21,
  k128x128c21,
  kPingpong128x128c21,
  k256x128c21,
  kGemmSmall,
  kGemmLarge,
  kGemv,
  kCount
};
LinearTuning g_tuning;

#ifdef VLLMX_WITH_SM90_GEMM
// The CUTLASS tiles' extents in w rows and tokens (gemm_sm90.h), the one place that knows them:
// the swapped tiles in order of width, which the planner takes the first wide enough from.
// cluster_tokens / cluster_w: a cluster's CTAs along the tokens and along w's rows.
struct Sm90Extent {
  Sm90Tile tile;
  bool swapped;
  int64_t w_rows, tokens;
  int cluster_tokens, cluster_w;
};
constexpr Sm90Extent kSm90Extents[] = {
    {Sm90Tile::kSwap128x16, true, 128, 16, 1, 1},  {Sm90Tile::kSwap128x32, true, 128, 32, 1, 1},
    {Sm90Tile::kSwap128x64, true, 128, 64, 1, 1},  {Sm90Tile::kSwap128x128, true, 128, 128, 1, 1},
    {Sm90Tile::k128x128, false, 128, 128, 1, 2},   {Sm90Tile::k128x256, false, 256, 128, 2, 1},
    {Sm90Tile::kPingpong128x128, false, 128, 128, 1, 2},
    {Sm90Tile::k256x128, false, 128, 256, 1, 2},  {Sm90Tile::k128x32, false, 32, 128, 1, 2},
    {Sm90Tile::k128x64, false, 64, 128, 1, 2},    {Sm90Tile::k128x32c21, false, 32, 128, 2, 1},
    {Sm90Tile::k128x64c21, false, 64, 128, 2, 1}, {Sm90Tile::k128x128c21, false, 128, 128, 2, 1},
    {Sm90Tile::kPingpong128x128c21, false, 128, 128, 2, 1},
    {Sm90Tile::k256x128c21, false, 128, 256, 2, 1}};
// The output tiles of a T x N product on extent e.
constexpr int64_t sm90_tiles(const Sm90Extent& e, int64_t T, int64_t N) {
  return (N + e.w_rows - 1) / e.w_rows * ((T + e.tokens - 1) / e.tokens);
}
constexpr const Sm90Extent& extent(Sm90Tile t) {
  for (const Sm90Extent& e : kSm90Extents)
    if (e.tile == t) return e;
  return kSm90Extents[0];  // (every tile is listed)
}
static_assert(kSm90Extents[3].tokens == kSm90MaxSwapT, "the widest swapped tile's tokens");
// force_plan indexes the table by ForcedPath, from kSwap16 on.
static_assert(std::size(kSm90Extents) ==
                  static_cast<int>(ForcedPath::kCount) - static_cast<int>(ForcedPath::kSwap16) - 3,
              "one extent per forced CUTLASS tile");
#endif

// TMA moves 16-byte rows: K, N and every row stride a multiple of 8 elements, x, w and out
// 16-byte aligned (K == 0: a TMA tensor map has no empty dims).
bool sm90_operands_ok(const Tensor& out, const Tensor& x, const Tensor& w, int64_t N,
                      int64_t K) {
  return K != 0 && K % 8 == 0 && N % 8 == 0 && x.stride[0] % 8 == 0 && w.stride[0] % 8 == 0 &&
         out.stride[0] % 8 == 0 && aligned(x.data, 16) && aligned(w.data, 16) &&
         aligned(out.data, 16);
}

#ifdef VLLMX_WITH_SM90_GEMM
// The run length (Sm90Schedule::swizzle) for a product of more than a wave of straight tiles:
// the longest of 8, 4 and 2 that divides the tile grid's both sides in whole clusters, since the
// scheduler rounds both up to whole runs and runs the padding tiles (T = 1024 on 128x256 tiles:
// 8 tile rows, so runs of 4). At 8192 tokens (a full prefill chunk) runs of 8 put a wave on
// 2048 of x's rows and 8 of w's tiles, ~32 MB for K = 4096 (within the 50 MB L2), where runs of
// one make a wave span all of x (64 MB), or, rastered along w, re-read all of w every few tile
// rows (Llama-3-8B's qkv: 50 MB).
int swizzle_runs(const Sm90Extent& e, int64_t T, int64_t N) {
  if (e.swapped) return 1;
  const int64_t tile_rows = (T + e.tokens - 1) / e.tokens;
  const int64_t tile_cols = (N + e.w_rows - 1) / e.w_rows;
  for (int s = 8; s > 1; s /= 2)
    if (tile_rows % (s * e.cluster_tokens) == 0 && tile_cols % (s * e.cluster_w) == 0) return s;
  return 1;
}
#endif

// The stream-K scheduler's decomposition for a product on p.sm90_tile. Its heuristic splits the
// K loop over the SMs whenever the tiles are fewer than them, and every such launch queues a
// workspace memset and ends in a fix-up; measured on the H200 over Llama-3-8B's and Qwen3-0.6B's
// products at T = 8-1024 (bench/gpu_kernels_vs_torch.py --plans, bench/results/
// gpu_linear_plans.json) that costs 2-4 us a product where each tile's K loop is short:
// - K <= 3072 (48 steps of 64) and one wave of tiles: data-parallel, one tile a CTA (Qwen3-0.6B's
//   four products at T = 48-256: 10-14 us -> 8-10);
// - K <= 6144 and at most 40 tiles: split-K in two (Llama-3-8B's o_proj at T = 48-128: 20-25 us
//   -> 17-21), up to one wave: data-parallel (its qkv at T = 16-64: 21-23 us -> 19-21);
// - deeper K (the 14336-deep down_proj) on at most 40 tiles of 32 tokens or more: split-K in
//   three (its T = 48-128: 41-46 us -> 38-43);
// - more than a wave of tiles, and the 16-token tile on deep K: the heuristic.
#ifdef VLLMX_WITH_SM90_GEMM
constexpr int kDataParallel = 1, kSplitK = 2;  // cutlass DecompositionMode
// The CUTLASS tiles' K loop steps 64 deep; past kSm90DeepKSteps (K > 6144) a product counts as
// deep, here and in plan_sm90_narrow.
constexpr int64_t sm90_k_steps(int64_t K) { return (K + 63) / 64; }
constexpr int64_t kSm90DeepKSteps = 96;
#endif

void plan_sm90_schedule(LinearPlan& p, int64_t T, int64_t N, int64_t K) {
#ifdef VLLMX_WITH_SM90_GEMM
  const Sm90Extent& e = extent(p.sm90_tile);
  const int64_t tiles = sm90_tiles(e, T, N);
  const int64_t k_steps = sm90_k_steps(K);
  Sm90Schedule& sc = p.sm90_schedule;
  if (tiles > num_sms()) {
    sc.swizzle = lin::sm90_swizzle(p.sm90_tile, T, N, K);
    return;
  }
  if (k_steps > kSm90DeepKSteps) {
    if (tiles <= 40 && p.sm90_tile != Sm90Tile::kSwap128x16) {
      sc.decomposition = kSplitK;
      sc.splits = 3;
    }
  } else if (k_steps > 48 && tiles <= 40) {
    sc.decomposition = kSplitK;
    sc.splits = 2;
  } else {
    sc.decomposition = kDataParallel;
  }
#else
  (void)p, (void)T, (void)N, (void)K;
#endif
}

#ifdef VLLMX_WITH_SM90_GEMM
// Decode batches of 65-256 tokens: 128 tokens on 32 weight rows, or 64 where 32 make more tiles
// than SMs, each tile one whole K loop (data-parallel) -- how cuBLAS runs them (~128 tiles a
// product, bench/results/gpu_linear_vs_cublas_h200_s42.json). Where neither fits one wave
// (Llama-3-8B's 28672-row gate_up, its 6144-row qkv from T = 129) the wider tiles below keep
// the product. On an H100 (bench/gpu_kernels_vs_torch.py --plans, bench/results/
// gpu_linear_narrow_h100.json) at T = 128, us before -> after (cuBLAS): Llama-3-8B's o_proj 23.4
// -> 18.0 (15.2), qkv 28.9 -> 23.4 (21.5), down_proj 55.6 -> 51.7 (52.4), Qwen3-0.6B's qkv
// 10.9 -> 7.8 (5.9), o_proj 13.6 -> 8.8 (6.0); at T = 256 Llama-3-8B's o_proj 25.9 -> 21.7.
// Not on K deeper than 96 steps past one row of tokens (the 14336-deep down_proj at T = 192:
// 74.6 us on 128x128 tiles against 93.4), nor from 64 tokens down, where the swapped tiles are
// narrower (o_proj at T = 64: 20.1 us against 25.2).
bool plan_sm90_narrow(LinearPlan& p, int64_t T, int64_t N, int64_t K) {
  if (T <= extent(Sm90Tile::kSwap128x64).tokens || T > kSm90NarrowMaxT) return false;
  if (T > extent(Sm90Tile::k128x32).tokens && sm90_k_steps(K) > kSm90DeepKSteps) return false;
  for (Sm90Tile t : {Sm90Tile::k128x32, Sm90Tile::k128x64}) {
    if (sm90_tiles(extent(t), T, N) <= num_sms()) {
      p.sm90_tile = t;
      p.sm90_schedule.decomposition = kDataParallel;
      return true;
    }
  }
  return false;
}
#endif

// Whether the CUTLASS GEMM takes this product, and with which tile.
bool plan_sm90(LinearPlan& p, const Tensor& out, const Tensor& x, const Tensor& w, int64_t T,
               int64_t N, int64_t K) {
#ifdef VLLMX_WITH_SM90_GEMM
  if (p.wk != kWSame || !sm90_kernels()) return false;
  if (T < kSm90MinT && N < kSm90WideN) return false;
  // Products up to 4096 x 4096 stay on the skinny kernel to T = 32: split-K keeps every SM
  // busy where the narrow tiles have too few weight tiles for them (Qwen3-0.6B's batch-32
  // decode 10375 -> 11902 tok/s on the H200, Llama-3-8B's unchanged; bench/gpu_ab.sh). Except
  // from T = 17 the wide and shallow ones (N >= 4096, K <= 3072): there the 32-token tile without
  // split-K (below) streams them faster, 7.6-8.3 us against 8.3-10.2 for Qwen3-0.6B's qkv and
  // gate_up (bench/results/gpu_linear_plans.json).
  const bool wide_shallow = T > 16 && N >= 4096 && K <= 3072;
  if (T <= kSkinnyMaxT && N * K <= kSkinnyMaxElems && !wide_shallow) return false;
  // Where the skinny GEMM runs on TMA it beats the narrow tiles (Llama-3-8B's down_proj at
  // T = 12-32: 30.5-32.3 us against 37-44), but for wide shallow products on its two-CTA layout
  // past 16 tokens (Qwen3-0.6B's gate_up: 8.0-8.3 us against 7.8-7.9; gemm_skinny_bulk_sm90.cu).
  const int bulk = skinny_bulk_ctas_per_sm(N, K);
  if (T <= kSkinnyMaxT && bulk > 0 && !(wide_shallow && bulk == 2)) return false;
  if (!sm90_operands_ok(out, x, w, N, K)) return false;
  if (plan_sm90_narrow(p, T, N, K)) {
    p.path = Path::kSm90;
    return true;
  }
  if (T <= kSm90MaxSwapT) {
    for (const Sm90Extent& e : kSm90Extents) {  // the narrowest swapped tile that holds T
      if (e.swapped && T <= e.tokens) {
        p.sm90_tile = e.tile;
        break;
      }
    }
  } else if (T >= kSm90TallMinT && sm90_tiles(extent(Sm90Tile::k256x128), T, N) >= num_sms()) {
    // Prefill chunks: 256 tokens x 128 weight rows, x's tiles multicast to a 1x2 cluster. On an
    // H100 at T = 8192 (Llama-3-8B's four products, 2026-12-07) 5.04 ms a layer against 5.32
    // on 128x256 tiles (cuBLAS 4.89), at T = 2048 1.29 against 1.32; at T = 512 too few tiles
    // (bench/results/gpu_linear_tiles_h100.json).
    p.sm90_tile = Sm90Tile::k256x128;
  } else if (T >= kSm90PingpongMinT) {
    // k128x128's tiles on the ping-pong kernel (one warpgroup's epilogue under the other's
    // MMAs): at T = 512 0.36 ms a layer against 0.38 on the tiles below, Llama-3-8B's qkv 51.4
    // us against 56.9, gate_up 186 against 200 (same file).
    p.sm90_tile = Sm90Tile::kPingpong128x128;
  } else {
    // 128x256 tiles (weight tiles shared by a 2-CTA cluster along T) once they give every SM
    // at least one tile; before that 128x128 tiles keep twice as many SMs busy.
    // Not where a pair's second 128 rows would be empty (T = 384: a quarter of its SMs idle;
    // Llama-3-8B's gate_up 146 us on 128x128 tiles against 186 on 128x256).
    const int64_t m_pairs = (T + 255) / 256, n_tiles256 = (N + 255) / 256;
    p.sm90_tile = 2 * m_pairs * n_tiles256 >= num_sms() && 2 * m_pairs == (T + 127) / 128
                      ? Sm90Tile::k128x256
                      : Sm90Tile::k128x128;
  }
  plan_sm90_schedule(p, T, N, K);
  p.path = Path::kSm90;
  return true;
#else
  (void)p, (void)out, (void)x, (void)w, (void)T, (void)N, (void)K;
  return false;
#endif
}

// Block weights from quant_skinny_min_t to kSkinnyMaxT rows go to the quantized skinny GEMM
// (whole 256-element stages of K). Its Q4_K / Q5_K stage reads a super-block's head and codes
// with 16- and 8-byte loads, so every row starts on a 16-byte boundary (always so for a weight
// of its own: 144- / 176-byte blocks, K a multiple of 256).
bool quant_skinny_ok(int wk, const Tensor& w, int64_t T, int64_t K) {
  if ((wk == kWQ4_K || wk == kWQ5_K) && !(aligned(w.data, 16) && w.stride[0] % 16 == 0))
    return false;
  return is_quant(wk) && T <= kSkinnyMaxT && K % 256 == 0 && K > 0;
}

LinearPlan plan_auto(const Tensor& out, const Tensor& x, const Tensor& w, int64_t T, int64_t N,
                     int64_t K) {
  LinearPlan p;
  const DType xt = x.dtype, wt = w.dtype;
  if (xt == DType::F32) return p;
  switch (wt) {
    case DType::F16: p.wk = xt == DType::F16 ? kWSame : kWF16; break;
    case DType::BF16: p.wk = xt == DType::BF16 ? kWSame : kWBF16; break;
    default:
      p.wk = quant_kind(wt);
      if (p.wk < 0) return p;  // f32 weights: generic
  }
  // Vector paths read x (and dense w) in aligned 16-byte chunks of 8 elements.
  bool ok = K % 8 == 0 && aligned(x.data, 16) && x.stride[0] % 8 == 0 && aligned(out.data, 2);
  if (is_quant(p.wk))  // (Q8_0, Q4_0, IQ4_NL and Q6_K blocks are read in 2-byte words)
    ok = ok && aligned(w.data, 4) && w.stride[0] % 2 == 0 &&
         (p.wk == kWQ8_0 || p.wk == kWQ4_0 || p.wk == kWIQ4_NL || p.wk == kWQ6_K ||
          w.stride[0] % 4 == 0);
  else
    ok = ok && aligned(w.data, 16) && w.stride[0] % 8 == 0;
  if (!ok || T > (int64_t{1} << 30) || N > (int64_t{1} << 30)) return p;
  if (quant_skinny_ok(p.wk, w, T, K) && T >= quant_skinny_min_t(p.wk)) {
    p.path = Path::kSkinny;
    return p;
  }
  if (T <= kGemvMaxT && (p.wk != kWSame || T < kSkinnyMinT)) {
    // GEMV streams w once; T = 1 gets its own instantiation (fewer registers, no row guards).
    p.path = Path::kGemv;
    p.max_t = T == 1 ? 1 : kGemvMaxT;
    return p;
  }
  if (plan_sm90(p, out, x, w, T, N, K)) return p;
  if (p.wk == kWSame && T <= kSkinnyMaxT && K > 0) {
    p.path = Path::kSkinny;
    return p;
  }
  const int64_t large_ctas =
      (T + GemmLarge::BM - 1) / GemmLarge::BM * ((N + GemmLarge::BN - 1) / GemmLarge::BN);
  p.path = large_ctas >= num_sms() ? Path::kGemmLarge : Path::kGemmSmall;
  return p;
}

// set_linear_tuning's kernel in place of the planner's (same-dtype and block-weight products on
// a vector path).
void force_plan(LinearPlan& p, const Tensor& out, const Tensor& x, const Tensor& w, int64_t T,
                int64_t N, int64_t K) {
  const auto f = static_cast<ForcedPath>(g_tuning.path);
  bool ok = true;
  if (f == ForcedPath::kSkinny) {
    ok = is_quant(p.wk) ? quant_skinny_ok(p.wk, w, T, K) : T <= kSkinnyMaxT && K > 0;
    p.path = Path::kSkinny;
  } else if (f == ForcedPath::kGemv) {
    ok = T <= kGemvMaxT;
    p.path = Path::kGemv;
    p.max_t = T == 1 ? 1 : kGemvMaxT;
  } else if (f == ForcedPath::kGemmSmall || f == ForcedPath::kGemmLarge) {
    p.path = f == ForcedPath::kGemmSmall ? Path::kGemmSmall : Path::kGemmLarge;
  } else {
#ifdef VLLMX_WITH_SM90_GEMM
    // ForcedPath's CUTLASS tiles are kSm90Extents' in its order (same-dtype products only).
    // A swapped tile takes any T, in several token tiles past its width, which the planner
    // never asks of it: so that the benchmark can time tiles without a cluster's multicast,
    // whose partial token tiles cost the multicast ones 15-40% (4096 x 4096 on 128 x 64 tiles:
    // T = 192 31.5 us against 22.7 at 256; bench/results/gpu_linear_partial_tiles_h100.json).
    ok = p.wk == kWSame;
    const Sm90Extent& e = kSm90Extents[g_tuning.path - static_cast<int>(ForcedPath::kSwap16)];
    ok = ok && sm90_kernels() && sm90_operands_ok(out, x, w, N, K);
    p.path = Path::kSm90;
    p.sm90_tile = e.tile;
    p.sm90_schedule = {};  // the scheduler's defaults unless the tuning names others
#else
    ok = false;
#endif
  }
  if (!ok)
    throw std::invalid_argument("linear: the forced kernel (set_linear_tuning path " +
                                std::to_string(g_tuning.path) + ") cannot take x [" +
                                std::to_string(T) + ", " + std::to_string(K) + "] @ w [" +
                                std::to_string(N) + ", " + std::to_string(K) + "]^T");
}

}  // namespace

namespace lin {

LinearPlan plan_linear(const Tensor& out, const Tensor& x, const Tensor& w, int64_t T,
                       int64_t N, int64_t K) {
  LinearPlan p = plan_auto(out, x, w, T, N, K);
  // (Dense weights of the other 16-bit dtype keep the planner's kernel: only the GEMV and the
  // mma.sync GEMMs read them.)
  if (g_tuning.path >= 0 && (p.wk == kWSame || is_quant(p.wk)) && p.path != Path::kGeneric)
    force_plan(p, out, x, w, T, N, K);
  return p;
}

const LinearTuning& linear_tuning() { return g_tuning; }

// Measured on an H100 at T = 8192 over Llama-3-8B's products (bench/gpu_kernels_vs_torch.py
// --plans auto:s1,auto; bench/results/gpu_linear_swizzle_h100.json): runs of up to 8 tiles
// against runs of one took bf16 from 0.89-0.92x cuBLAS to 0.95-0.97x and fp8 28672 x 4096
// from 1.01x to 1.14x where K is 4096, but the 14336-deep down_proj from 0.96x to 0.90x (bf16)
// and 0.93x to 0.91x (fp8): past kSm90SwizzleMaxK the tiles keep the scheduler's order.
constexpr int64_t kSm90SwizzleMaxK = 8192;

int sm90_swizzle(Sm90Tile tile, int64_t T, int64_t N, int64_t K) {
#ifdef VLLMX_WITH_SM90_GEMM
  const Sm90Extent& e = extent(tile);
  return sm90_tiles(e, T, N) > num_sms() && K <= kSm90SwizzleMaxK ? swizzle_runs(e, T, N) : 1;
#else
  (void)tile, (void)T, (void)N, (void)K;
  return 1;
#endif
}

Sm90Schedule tuned_schedule(Sm90Schedule planned) {
  if (g_tuning.decomposition >= 0) planned.decomposition = g_tuning.decomposition;
  if (g_tuning.splits > 0) planned.splits = g_tuning.splits;
  if (g_tuning.swizzle > 0) planned.swizzle = g_tuning.swizzle;
  if (g_tuning.raster >= 0) planned.raster = g_tuning.raster;
  return planned;
}

}  // namespace lin

void set_linear_tuning(int path, int skinny_waves, int decomposition, int splits, int swizzle,
                       int raster) {
  // (swizzle: cutlass rounds it down to a power of two, at most 8)
  if (path < -1 || path >= static_cast<int>(ForcedPath::kCount) || skinny_waves < 0 ||
      decomposition < -1 || decomposition > 3 || splits < 0 || swizzle < 0 || swizzle > 8 ||
      raster < -1 || raster > 2)
    throw std::invalid_argument("set_linear_tuning: path " + std::to_string(path) +
                                ", skinny_waves " + std::to_string(skinny_waves) +
                                ", decomposition " + std::to_string(decomposition) +
                                ", splits " + std::to_string(splits) + ", swizzle " +
                                std::to_string(swizzle) + ", raster " + std::to_string(raster) +
                                " out of range");
  g_tuning = LinearTuning{path, skinny_waves, decomposition, splits, swizzle, raster};
}

}  // namespace vllmx::cuda
