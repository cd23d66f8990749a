// The skinny GEMM for block-quantized weights: out[T, N] = x[T, K] @ w[N, K]^T for decode
// batches (kQuantSkinnyMinT <= T <= kSkinnyMaxT), x bf16 or f16, w in a GGUF block type
// (Q8_0, Q4_0, Q4_1, IQ4_NL and the 256-blocks Q4_K, Q5_K, Q6_K, IQ4_XS), K a multiple of 256.
// The dense skinny GEMM's shape (gemm_skinny.cu: swapped operands, w rows on the mma's M side,
// split-K with an ordered reduction, weight loads issued before the programmatic-launch wait),
// with the blocks streamed as they are stored:
// - each stage copies, per row, the bytes of 256 elements (one super-block, or eight 32-blocks)
//   with 16-byte cp.async copies into shared memory. A row's span keeps its global address
//   modulo 16 there (its first copy starts at the 16-byte boundary below it), so the 2-, 4-
//   and 8-byte aligned block layouts (Q6_K's 210 bytes, Q8_0's 34) are read with the same
//   loads as from global memory (linear.cuh's load_block_chunk);
// - the warps dequantize straight into mma A fragments, no dequantized tile in shared memory:
//   thread (g, t) of a warp reads, for rows g and g + 8 of its 16, the 8-element chunk t of
//   each 32 elements (exactly as the CPU's dequantization computes them, in f32, then rounded
//   to x's dtype). The mma's k order inside those 32 elements is permuted to fit: its step s
//   takes elements 8t + 4s .. 8t + 4s + 3 as k = 2t, 2t + 1, 2t + 8, 2t + 9, and x's fragments
//   are read from the same elements (one 8-byte load), so the sum is the same product.
// Where the GEMV (kGemvMaxT) streams a block type's bytes with 2- and 4-byte loads a thread at a
// time, this keeps ~100 KB in flight per SM with 16-byte copies.
#include "gemm_skinny.cuh"

namespace vllmx::cuda::lin {

namespace {

using namespace skinny;

constexpr int kBK = 256;        // K per stage: one k-quant super-block
constexpr int kStages = 4;
constexpr int kXLds = kBK + 8;  // x's smem row stride in elements
constexpr int kMinStagesPerSplit = 2;

template <int WK>
struct StageBytes {
  static constexpr int kRow = kBK / block_elems(WK) * block_bytes(WK);  // a row's bytes a stage
  // 16-byte copies a row takes: its span may start up to 15 bytes into the first.
  static constexpr int kCopies = (kRow + 15) / 16 + 1;
  static constexpr int kSlot = kCopies * 16;  // its smem bytes
};

template <int WK, int NT>
constexpr int kSmemBytes = kStages * (kRows * StageBytes<WK>::kSlot + 8 * NT * kXLds * 2);

template <typename T, int WK, int NT>
__global__ void __launch_bounds__(kThreads)
    gemm_skinny_quant_kernel(LinearArgs a, int stages_per_split, float* partials, int* counters) {
  using SB = StageBytes<WK>;
  constexpr int TT = 8 * NT, S = kStages;
  constexpr bool kBf = std::is_same_v<T, __nv_bfloat16>;
  extern __shared__ uint4 skinny_quant_smem[];
  uint8_t* Ws = reinterpret_cast<uint8_t*>(skinny_quant_smem);  // [S][kRows][kSlot]
  T* Xs = reinterpret_cast<T*>(Ws + S * kRows * SB::kSlot);    // [S][TT][kXLds]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n0 = blockIdx.x * kRows;
  const int kt0 = blockIdx.y * stages_per_split;
  const int nkt = min(a.K / kBK, kt0 + stages_per_split) - kt0;
  const uint8_t* wp = static_cast<const uint8_t*>(a.w);
  const T* xp = static_cast<const T*>(a.x);
  // A valid, 16-byte aligned address for the copies that read nothing (zero fill).
  const uint8_t* w_none = wp - (reinterpret_cast<uintptr_t>(wp) & 15);

  // Where row r's bytes of stage i start in global memory.
  auto span = [&](int r, int i) {
    return wp + static_cast<int64_t>(n0 + r) * a.w_stride +
           static_cast<int64_t>(kt0 + i) * SB::kRow;
  };
  auto head = [](const uint8_t* p) { return static_cast<int>(reinterpret_cast<uintptr_t>(p) & 15); };
  auto load_w = [&](int i, int st) {
    constexpr int kTotal = kRows * SB::kCopies;
#pragma unroll
    for (int c = 0; c < (kTotal + kThreads - 1) / kThreads; ++c) {
      const int idx = tid + c * kThreads;
      if (idx >= kTotal) break;
      const int r = idx / SB::kCopies, cc = idx % SB::kCopies;
      const uint8_t* src = span(r, i);
      const int h = head(src);
      // A copy starting past the span is not made (zeros); the last one made may reach 15
      // bytes beyond it, inside the 16-byte granule of an allocation.
      const bool ok = n0 + r < a.N && cc * 16 < h + SB::kRow;
      cp_async16(Ws + (st * kRows + r) * SB::kSlot + cc * 16, ok ? src - h + cc * 16 : w_none,
                 ok);
    }
  };
  auto load_x = [&](int i, int st) {
    constexpr int kCpr = kBK / 8;
    const int kb = (kt0 + i) * kBK;
#pragma unroll
    for (int c = 0; c < (TT * kCpr + kThreads - 1) / kThreads; ++c) {
      const int idx = tid + c * kThreads;
      if (idx >= TT * kCpr) break;
      const int row = idx / kCpr, cc = idx % kCpr;
      const bool ok = row < a.T;  // padding tokens read as zeros
      cp_async16(Xs + (st * TT + row) * kXLds + cc * 8,
                 ok ? xp + static_cast<int64_t>(row) * a.x_stride + kb + cc * 8 : xp, ok);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < nkt) load_w(s, s);
  pdl_begin();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nkt) load_x(s, s);
    cp_async_commit();
  }
  cp_async_wait<S - 2>();
  __syncthreads();

  const int g = lane / 4, t = lane % 4, r0 = warp * 16 + g;
  for (int i = 0; i < nkt; ++i) {
    const int ni = i + S - 1, nst = ni % S, st = i % S;
    if (ni < nkt) {  // stage nst was last read in iteration i - 1, behind its closing barrier
      load_w(ni, nst);
      load_x(ni, nst);
    }
    cp_async_commit();
    const uint8_t* w0 = Ws + (st * kRows + r0) * SB::kSlot + head(span(r0, i));
    const uint8_t* w1 = Ws + (st * kRows + r0 + 8) * SB::kSlot + head(span(r0 + 8, i));
    const T* xt = Xs + st * TT * kXLds;
#pragma unroll 2
    for (int u = 0; u < kBK / 32; ++u) {
      const int k = u * 32 + 8 * t;
      float f0[8], f1[8];
      chunk_to_float<WK>(load_block_chunk<WK, false>(w0, k), k, kBf, f0);
      chunk_to_float<WK>(load_block_chunk<WK, false>(w1, k), k, kBf, f1);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const uint32_t af[4] = {pack2_bits(f0[4 * s], f0[4 * s + 1], kBf),
                                pack2_bits(f1[4 * s], f1[4 * s + 1], kBf),
                                pack2_bits(f0[4 * s + 2], f0[4 * s + 3], kBf),
                                pack2_bits(f1[4 * s + 2], f1[4 * s + 3], kBf)};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint2 b = *reinterpret_cast<const uint2*>(xt + (j * 8 + g) * kXLds + k + 4 * s);
          mma16816<T>(acc[j], af, b.x, b.y);
        }
      }
    }
    cp_async_wait<S - 2>();
    __syncthreads();
  }

  skinny_epilogue<NT>(a, kBf, acc, n0, partials, counters);
}

template <typename T, int WK, int NT>
void launch_nt(const LinearArgs& a, int tiles, cudaStream_t s) {
  constexpr int smem = kSmemBytes<WK, NT>;
  auto* kernel = gemm_skinny_quant_kernel<T, WK, NT>;
  // CTAs an SM holds (shared memory decides), for the split-K plan.
  static const int per_sm = [&] {
    allow_smem(kernel, smem);
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem);
    return std::max(n, 1);
  }();
  const SplitK sk = plan_split(tiles, a.K / kBK, per_sm, kMinStagesPerSplit, 8 * NT);
  launch(kernel, dim3(tiles, sk.splits), kThreads, smem, s, a, sk.per, sk.partials,
         sk.counters);
}

template <typename T, int WK>
void launch_typed(const LinearArgs& a, cudaStream_t s) {
  const int tiles = (a.N + kRows - 1) / kRows;
  if (a.T <= 8)
    launch_nt<T, WK, 1>(a, tiles, s);
  else if (a.T <= 16)
    launch_nt<T, WK, 2>(a, tiles, s);
  else
    launch_nt<T, WK, 4>(a, tiles, s);
}

}  // namespace

void launch_gemm_skinny_quant(const LinearArgs& a, bool bf16, int wk, cudaStream_t s) {
  visit_quant_kind(wk, [&](auto k) {
    constexpr int WK = decltype(k)::value;
    if (bf16)
      launch_typed<__nv_bfloat16, WK>(a, s);
    else
      launch_typed<__half, WK>(a, s);
  });
}

}  // namespace vllmx::cuda::lin
