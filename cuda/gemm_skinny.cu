// The skinny GEMM: out[T, N] = x[T, K] @ w[N, K]^T for 3 <= T <= 32 (decode batches), x and w of
// one 16-bit dtype. There the product is bound by streaming w (T FLOP per
// weight byte against the H200's ~200 FLOP/byte ridge), so the kernel is built to keep HBM busy:
// - swapped operands: w rows are the mma's M side (16 per warp, 64 per CTA) and the T tokens its
//   N side, so a batch of 8 pads to one 16-token tile instead of a 32- or 128-row x tile;
// - split-K: when N alone gives too few CTAs (a 4096-wide projection is 64 tiles on 132 SMs),
//   the K range is split so that every SM streams two CTAs' tiles at once; each split writes
//   f32 partials and the last CTA of a tile (an atomic ticket) adds them in split order, so the
//   result's bits do not depend on which CTA finished first, nor on T (a row's output is the
//   same in any batch that takes this path);
// - a deep cp.async pipeline (6-8 stages: under full load HBM latency is ~2 us, and an SM needs
//   ~100 KB in flight to stream its share), whose first weight tiles are requested before the
//   programmatic-dependent-launch wait (w is never the previous kernel's output; x may be).
// Measured on the H200 (bench/gpu_kernels_vs_torch.py): a version that went on to T = 128 lost
// to CUTLASS's wgmma GEMM from T = 40 (the swapped tile reloads x's fragments in every warp),
// hence kSkinnyMaxT = 32. Unlike the other kernels it issues loads before pdl_begin() (weights
// only, never a previous kernel's output).
#include "gemm_skinny.cuh"

namespace vllmx::cuda::lin {

namespace {

using namespace skinny;

constexpr int kBK = 64;    // K per pipeline stage
constexpr int kLds = kBK + 8;  // smem row stride in elements: conflict-free ldmatrix
constexpr int kCpr = kBK / 8;  // 16-byte chunks per tile row
constexpr int kMinTilesPerSplit = 4;  // a split shorter than this is mostly pipeline fill

// Stages by token tile: two CTAs fit an SM's shared memory at either width.
template <int NT>
constexpr int kStages = NT == 2 ? 8 : 6;
template <int NT>
constexpr int kSmemBytes = kStages<NT> * (kRows + 8 * NT) * kLds * 2;

// NT: 8-token mma tiles (T <= 8 NT). partials / counters: split-K scratch (splits > 1).
template <typename T, int NT>
__global__ void __launch_bounds__(kThreads)
    gemm_skinny_kernel(LinearArgs a, int tiles_per_split, float* partials, int* counters) {
  constexpr int TT = 8 * NT, S = kStages<NT>;
  constexpr bool kBf = std::is_same_v<T, __nv_bfloat16>;
  extern __shared__ uint4 skinny_smem[];
  T* Ws = reinterpret_cast<T*>(skinny_smem);  // [S][kRows][kLds]
  T* Xs = Ws + S * kRows * kLds;              // [S][TT][kLds]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n0 = blockIdx.x * kRows;
  const int kt0 = blockIdx.y * tiles_per_split;
  const int nkt = min((a.K + kBK - 1) / kBK, kt0 + tiles_per_split) - kt0;
  const T* wp = static_cast<const T*>(a.w);
  const T* xp = static_cast<const T*>(a.x);

  auto load_w = [&](int i, int st) {
    const int kb = (kt0 + i) * kBK;
#pragma unroll
    for (int c = 0; c < kRows * kCpr / kThreads; ++c) {
      const int idx = tid + c * kThreads, row = idx / kCpr, cc = idx % kCpr;
      const int gn = n0 + row, gk = kb + cc * 8;
      const bool ok = gn < a.N && gk < a.K;
      cp_async16(Ws + (st * kRows + row) * kLds + cc * 8,
                 ok ? wp + static_cast<int64_t>(gn) * a.w_stride + gk : wp, ok);
    }
  };
  auto load_x = [&](int i, int st) {
    const int kb = (kt0 + i) * kBK;
#pragma unroll
    for (int c = 0; c < (TT * kCpr + kThreads - 1) / kThreads; ++c) {
      const int idx = tid + c * kThreads, row = idx / kCpr, cc = idx % kCpr;
      if (idx >= TT * kCpr) break;
      const int gk = kb + cc * 8;
      const bool ok = row < a.T && gk < a.K;  // padding tokens and the K tail read as zeros
      cp_async16(Xs + (st * TT + row) * kLds + cc * 8,
                 ok ? xp + static_cast<int64_t>(row) * a.x_stride + gk : xp, ok);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  skinny_prologue<S>(nkt, load_w, load_x);

  for (int i = 0; i < nkt; ++i) {
    const int ni = i + S - 1, nst = ni % S, st = i % S;
    // Stage nst was last read in iteration i - 1, behind the barrier that ended it.
    if (ni < nkt) {
      load_w(ni, nst);
      load_x(ni, nst);
    }
    cp_async_commit();
    const T* wt = Ws + st * kRows * kLds;
    const T* xt = Xs + st * TT * kLds;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[4];
      ldmatrix_x4(af, wt + (warp * 16 + lane % 16) * kLds + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, xt + (np * 16 + lane % 8 + (lane / 16) * 8) * kLds + kk * 16 +
                           ((lane / 8) % 2) * 8);
        mma16816<T>(acc[2 * np], af, r[0], r[1]);
        mma16816<T>(acc[2 * np + 1], af, r[2], r[3]);
      }
    }
    cp_async_wait<S - 2>();
    __syncthreads();
  }

  skinny_epilogue<NT>(a, kBf, acc, n0, partials, counters);
}

template <typename T, int NT>
void launch_nt(const LinearArgs& a, dim3 grid, int per, float* partials, int* counters,
               cudaStream_t s) {
  static const bool smem_ok =
      (allow_smem(gemm_skinny_kernel<T, NT>, kSmemBytes<NT>), true);
  (void)smem_ok;
  launch(gemm_skinny_kernel<T, NT>, grid, kThreads, kSmemBytes<NT>, s, a, per, partials,
         counters);
}

template <typename T>
void launch_typed(const LinearArgs& a, dim3 grid, int per, float* partials, int* counters,
                  cudaStream_t s) {
  if (a.T <= 16)
    launch_nt<T, 2>(a, grid, per, partials, counters, s);
  else
    launch_nt<T, 4>(a, grid, per, partials, counters, s);
}

}  // namespace

void launch_gemm_skinny(const LinearArgs& a, bool bf16, cudaStream_t s) {
#ifdef VLLMX_WITH_SM90_GEMM
  if (launch_gemm_skinny_bulk(a, bf16, s)) return;
#endif
  const int tiles = (a.N + kRows - 1) / kRows, k_tiles = (a.K + kBK - 1) / kBK;
  // Two CTAs fit an SM at either token width.
  const int waves = linear_tuning().skinny_waves > 0 ? linear_tuning().skinny_waves : 2;
  const SplitK sk = plan_split(tiles, k_tiles, waves, kMinTilesPerSplit, a.T <= 16 ? 16 : 32);
  const dim3 grid(tiles, sk.splits);
  if (bf16)
    launch_typed<__nv_bfloat16>(a, grid, sk.per, sk.partials, sk.counters, s);
  else
    launch_typed<__half>(a, grid, sk.per, sk.partials, sk.counters, s);
}

}  // namespace vllmx::cuda::lin
