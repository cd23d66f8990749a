// The skinny GEMM on Hopper's tensor memory accelerator: out[T, N] = x[T, K] @ w[N, K]^T for
// kSkinnyMinT <= T <= kSkinnyMaxT, x and w of one 16-bit dtype. The same product, split and
// epilogue as gemm_skinny.cu (swapped operands on mma.sync, split-K summed in split order by
// the tile's last CTA), fed differently: there every thread issues 16-byte cp.async copies, and
// ncu on the H200 put that kernel at 63% of DRAM bandwidth where cuBLAS's TMA-fed kernel
// reaches 79% (Llama-3-8B's down_proj at T = 8: 39.9 us against 31.5). Here one producer thread
// moves each stage as two TMA boxes (64 w rows x 64 k, TT tokens x 64 k; rows past N, tokens
// past T and k past K arrive as zeros) into a ring of 22 stages (18 at 32 tokens), one CTA an
// SM, so 144-176 KB of weights are in flight per SM (or two CTAs of half the ring where that
// fills the SMs better); four consumer warps run the MMAs and hand each stage back through an
// empty barrier. Deeper cp.async pipelines did not get there (see
// bench/results/gpu_linear_skinny_tma.json), nor did one 256-byte cp.async.bulk copy a row,
// 3x slower: the copy engine's cost is per request, and a box is one request.
//
// The same kernel streams fp8_linear's e4m3 weights (cuda/fp8.cu) for up to 32 tokens: a stage's
// 128-byte box row is then one 128-wide group of K, x arrives quantized (codes and per-group
// scales, per_token_group_quant_fp8's), the group's row and token scales come with the stage as
// two more boxes, the same ldmatrix loads give m16n8k32 e4m3 fragments, widened to f16 for the
// 16-bit MMAs (mma_e4m3_f16), and a stage's sums, times its scales, go into the accumulators
// (scaled_mm's product). On an H100: 1.2-1.9x cuBLAS bf16 on the same values at 1-16 tokens
// (bench/results/gpu_fp8_linear_s36.json).
//
// Batch invariant as gemm_skinny.cu's kernel is (the split and the summation order are fixed by
// N and K), though not bit-equal to it. Compiled for sm_90a only (cmake/cutlass_sm90.cmake).
#include <cuda_fp8.h>

#include "gemm_skinny.cuh"
#include "tma_sm90.cuh"

namespace vllmx::cuda::lin {

namespace {

using namespace skinny;
using namespace tma;

constexpr int kBK = kBoxCols;                // K per stage: one 128-byte swizzled box row
constexpr int kConsumerWarps = kThreads / 32;
constexpr int kBulkThreads = kThreads + 32;  // the consumers and one producer warp
constexpr int kMinStagesPerSplit = 8;        // a split shorter than this is mostly pipeline fill

// C: CTAs an SM. One where the product's tiles, split, fill 3/4 of the SMs in one wave; two
// (half the ring each) where they fill 70% of twice as many slots and not the SMs (6144 rows:
// 96 tiles, 192 CTAs).
template <int C>
constexpr int kSmemBudget = C == 1 ? 220 * 1024 : 108 * 1024;  // of 228 KB, less reserved
// A stage: the weights' and x's boxes; fp8 (F) adds the group's scales (f32) after the ring's
// boxes, the tile's kRows row scales [S][kRows] and then the tokens' [S][kMaxTT] (TT used),
// each box 128-byte aligned as TMA requires.
constexpr int kMaxTT = kFp8SkinnyBulkMaxT;
template <bool F>
constexpr int kScaleBytes = F ? (kRows + kMaxTT) * 4 : 0;
template <int NT, bool F>
constexpr int kStageBytes = (kRows + 8 * NT) * kBK * 2 + kScaleBytes<F>;
template <int NT, int C, bool F>
constexpr int kStages = kSmemBudget<C> / kStageBytes<NT, F>;
// The stages, their barriers, and slack to align the ring to the 1024 bytes over which the
// 128-byte swizzle repeats.
template <int NT, int C, bool F>
constexpr int kSmemBytes =
    kStages<NT, C, F> * kStageBytes<NT, F> + 2 * kStages<NT, C, F> * 8 + 1024;
static_assert(kStages<2, 1, false> == 22 && kStages<4, 1, false> == 18 &&
                  kStages<2, 2, false> == 10 && kStages<4, 2, false> == 9,
              "stages by token tile and CTAs an SM");
static_assert(kRows * kBK * 2 % 1024 == 0 && 8 * kBK * 2 % 1024 == 0, "boxes keep 1024 alignment");

// Byte offset of element k (< 64) of row r in a box written with the 128-byte swizzle: 16-byte
// chunk c of a 128-byte row sits at chunk c ^ (r % 8), so the eight rows an ldmatrix phase reads
// fall in eight bank groups.
__device__ __forceinline__ int swizzled(int r, int k) {
  return r * 128 + (((k / 8) ^ (r % 8)) * 16);
}

// Two e4m3 codes, half h (0: the low 16 bits) of a fragment word, as an f16 pair (exact).
__device__ __forceinline__ uint32_t e4m3_pair(uint32_t w, int h) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(w >> (16 * h)), __NV_E4M3);
  return static_cast<uint32_t>(r.x) | static_cast<uint32_t>(r.y) << 16;
}

// c += a * b on an m16n8k32 e4m3 tile's fragments (ldmatrix's bytes: a0 row g, codes 4t .. 4t + 3,
// a2 16 + 4t ..; b0 codes 4t .. of column g, b1 16 + 4t ..), as two f16 m16n8k16 MMAs whose k
// slots are the fragments' low code pairs and then their high ones: a dot product does not
// care in which order K is summed, as long as both sides take the same one. The codes widened
// once (Hopper has no e4m3 mma.sync; the PTX one widens a's per instruction): ah, the weights'
// f16 pairs by half, are shared by the token tiles. Products of two codes are exact in f32.
__device__ __forceinline__ void mma_e4m3_f16(float (&c)[4], const uint32_t (&ah)[2][4],
                                             uint32_t b0, uint32_t b1) {
#pragma unroll
  for (int h = 0; h < 2; ++h) mma16816<__half>(c, ah[h], e4m3_pair(b0, h), e4m3_pair(b1, h));
}

// T: x's and w's element type, or __nv_fp8_e4m3 for fp8 codes (a.K, a.x_stride and a.w_stride
// then count byte pairs, 16-bit elements to the maps; a stage is one 128-wide group of K).
// NT: 8-token mma tiles (T <= 8 NT; NT = 1 fp8 only). w_map / x_map: boxes of 64 rows / TT
// tokens x kBK; ws_map / xs_map (fp8): the group's 64 row scales / TT token scales.
// partials / counters: split-K scratch (splits > 1). bf16_out: out's (and bias's) dtype, bf16
// or else f16.
template <typename T, int NT, int C>
__global__ void __launch_bounds__(kBulkThreads, C)
    gemm_skinny_bulk_kernel(LinearArgs a, const __grid_constant__ CUtensorMap w_map,
                            const __grid_constant__ CUtensorMap x_map,
                            const __grid_constant__ CUtensorMap ws_map,
                            const __grid_constant__ CUtensorMap xs_map, int tiles_per_split,
                            float* partials, int* counters, bool bf16_out) {
  constexpr bool kFp8 = std::is_same_v<T, __nv_fp8_e4m3>;
  static_assert(kFp8 || NT % 2 == 0, "16-bit x is read 16 tokens at a time");
  constexpr int TT = 8 * NT, S = kStages<NT, C, kFp8>;
  extern __shared__ uint8_t bulk_smem[];
  uint8_t* Ws = bulk_smem + (1024 - smem_addr(bulk_smem) % 1024) % 1024;  // [S][kRows][128 B]
  uint8_t* Xs = Ws + S * kRows * kBK * 2;                                   // [S][TT][128 B]
  float* Sw = reinterpret_cast<float*>(Xs + S * TT * kBK * 2);  // fp8: [S][kRows]
  float* Sx = Sw + (kFp8 ? S * kRows : 0);                       // fp8: [S][kMaxTT]
  uint64_t* full = reinterpret_cast<uint64_t*>(Sw + S * kScaleBytes<kFp8> / 4);  // [S]
  uint64_t* empty = full + S;                                                    // [S]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n0 = blockIdx.x * kRows;
  const int kt0 = blockIdx.y * tiles_per_split;
  const int nkt = min((a.K + kBK - 1) / kBK, kt0 + tiles_per_split) - kt0;
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  if (warp == kConsumerWarps) {
    if (lane == 0) {  // the producer
      // Whole boxes, zeros included (the token scales' box is TT of the kMaxTT it may fill).
      constexpr uint32_t kTx = (kRows + TT) * kBK * 2 + (kFp8 ? (kRows + TT) * 4 : 0);
      auto copy_w = [&](int i, int s) {
        mbar_expect_tx(&full[s], kTx);
        tma_box(Ws + s * kRows * kBK * 2, w_map, (kt0 + i) * kBK, n0, &full[s]);
        if constexpr (kFp8)
          tma_box(Sw + s * kRows, ws_map, n0, kt0 + i, &full[s]);
      };
      auto copy_x = [&](int i, int s) {
        tma_box(Xs + s * TT * kBK * 2, x_map, (kt0 + i) * kBK, 0, &full[s]);
        if constexpr (kFp8)
          tma_box(Sx + s * kMaxTT, xs_map, 0, kt0 + i, &full[s]);
      };
      // The first stages' weights before the wait for the previous kernel (w is never its
      // output; x may be).
      const int first = min(S, nkt);
      for (int i = 0; i < first; ++i) copy_w(i, i);
      pdl_begin();
      for (int i = 0; i < first; ++i) copy_x(i, i);
      for (int i = first; i < nkt; ++i) {
        const int s = i % S;
        mbar_wait(&empty[s], (i / S - 1) & 1);  // the consumers are done with round i / S - 1
        copy_w(i, s);
        copy_x(i, s);
      }
    } else {
      pdl_begin();
    }
    __syncwarp();
  } else {
    pdl_begin();  // (out may still be read by the previous kernel)
    for (int i = 0; i < nkt; ++i) {
      const int s = i % S;
      mbar_wait(&full[s], (i / S) & 1);
      const uint8_t* wt = Ws + s * kRows * kBK * 2;
      const uint8_t* xt = Xs + s * TT * kBK * 2;
      if constexpr (kFp8) {
        float c[NT][4];  // the group's sums, before its scales
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) c[j][e] = 0.f;
        // The group's 4 k-steps of 32 codes: this warp's 16 weight rows widened once a step.
        auto weights = [&](int kk, uint32_t (&ah)[2][4]) {
          uint32_t af[4];
          ldmatrix_x4(af, wt + swizzled(warp * 16 + lane % 16, kk * 16 + (lane / 16) * 8));
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int q = 0; q < 4; ++q) ah[h][q] = e4m3_pair(af[q], h);
        };
        if constexpr (NT == 1) {
#pragma unroll
          for (int kp = 0; kp < kBK / 16; kp += 2) {  // one x load, two k-steps' fragments
            uint32_t r[4];
            ldmatrix_x4(r, xt + swizzled(lane % 8, kp * 16 + (lane / 8) * 8));
#pragma unroll
            for (int d = 0; d < 2; ++d) {
              uint32_t ah[2][4];
              weights(kp + d, ah);
              mma_e4m3_f16(c[0], ah, r[2 * d], r[2 * d + 1]);
            }
          }
        } else {
#pragma unroll
          for (int kk = 0; kk < kBK / 16; ++kk) {
            uint32_t ah[2][4];
            weights(kk, ah);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
              uint32_t r[4];
              ldmatrix_x4(r, xt + swizzled(np * 16 + lane % 8 + (lane / 16) * 8,
                                           kk * 16 + ((lane / 8) % 2) * 8));
              mma_e4m3_f16(c[2 * np], ah, r[0], r[1]);
              mma_e4m3_f16(c[2 * np + 1], ah, r[2], r[3]);
            }
          }
        }
        // Times the row's and the token's scales (zeros past N and T), scaled_mm's product.
        const float* sw = Sw + s * kRows;
        const float* sx = Sx + s * kMaxTT;
        const float w0 = sw[warp * 16 + lane / 4], w1 = sw[warp * 16 + lane / 4 + 8];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const float x0 = sx[j * 8 + (lane % 4) * 2];
          const float x1 = sx[j * 8 + (lane % 4) * 2 + 1];
          acc[j][0] += c[j][0] * (x0 * w0);
          acc[j][1] += c[j][1] * (x1 * w0);
          acc[j][2] += c[j][2] * (x0 * w1);
          acc[j][3] += c[j][3] * (x1 * w1);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          uint32_t af[4];
          ldmatrix_x4(af, wt + swizzled(warp * 16 + lane % 16, kk * 16 + (lane / 16) * 8));
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            uint32_t r[4];
            ldmatrix_x4(r, xt + swizzled(np * 16 + lane % 8 + (lane / 16) * 8,
                                         kk * 16 + ((lane / 8) % 2) * 8));
            mma16816<T>(acc[2 * np], af, r[0], r[1]);
            mma16816<T>(acc[2 * np + 1], af, r[2], r[3]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }

  skinny_epilogue<NT>(a, bf16_out, acc, n0, partials, counters, warp < kConsumerWarps);
}

template <typename T, int NT, int C>
bool launch_nt(const LinearArgs& a, bool bf16_out, dim3 grid, const SplitK& sk, cudaStream_t s) {
  constexpr bool kFp8 = std::is_same_v<T, __nv_fp8_e4m3>;
  CUtensorMap w_map, x_map, ws_map, xs_map;
  if (!cached_map(&w_map, a.w, a.K, a.N, a.w_stride, kRows) ||
      !cached_map(&x_map, a.x, a.K, a.T, a.x_stride, 8 * NT))
    return false;
  if constexpr (kFp8) {
    const int groups = a.K / kBK;
    if (!cached_map_f32(&ws_map, a.w_scale, a.N, groups, a.N, kRows) ||
        !cached_map_f32(&xs_map, a.x_scale, a.T, groups, a.x_scale_stride, 8 * NT))
      return false;
  } else {
    ws_map = xs_map = w_map;  // unused
  }
  constexpr auto kernel = gemm_skinny_bulk_kernel<T, NT, C>;
  constexpr int kSmem = kSmemBytes<NT, C, kFp8>;
  static const bool smem_ok = (allow_smem(kernel, kSmem), true);
  (void)smem_ok;
  launch(kernel, grid, kBulkThreads, kSmem, s, a, w_map, x_map, ws_map, xs_map, sk.per,
         sk.partials, sk.counters, bf16_out);
  return true;
}

template <typename T, int C>
bool launch_c(const LinearArgs& a, bool bf16_out, dim3 grid, const SplitK& sk, cudaStream_t s) {
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>)
    if (a.T <= 8) return launch_nt<T, 1, C>(a, bf16_out, grid, sk, s);
  return a.T <= 16 ? launch_nt<T, 2, C>(a, bf16_out, grid, sk, s)
                   : launch_nt<T, 4, C>(a, bf16_out, grid, sk, s);
}

// The grid (a CTA per kRows-row weight tile and split) and split-K plan of a's product, c CTAs
// an SM.
dim3 plan_grid(const LinearArgs& a, int c, SplitK* sk) {
  const int tiles = (a.N + kRows - 1) / kRows, k_tiles = (a.K + kBK - 1) / kBK;
  *sk = plan_split(tiles, k_tiles, c, kMinStagesPerSplit, a.T <= 16 ? 16 : 32);
  return dim3(tiles, sk->splits);
}

}  // namespace

// Measured on the H200 (bench/gpu_kernels_vs_torch.py, weights rotated out of L2): one CTA an SM
// runs Llama-3-8B's o_proj (4096 x 4096: 11.6-12.2 us at T = 4-32, cuBLAS 12.4-13.4, the
// cp.async kernel 12.5-16.5) and down_proj (4096 x 14336: 30.5-32.3 us, cuBLAS 31.6-33.8, the
// CUTLASS GEMM the planner took from T = 12: 37-44) and Qwen3-0.6B's qkv (4096 x 1024: 5.3-6.7
// us, cuBLAS 5.3-5.4); two, Llama-3-8B's qkv (6144 x 4096: 16.3 us at T = 4-16, 18.3 at 24-32;
// cuBLAS 14.8-15.6, before 18.4-19.3) and Qwen3-0.6B's gate_up (6144 x 1024: 6.2-6.3 at T = 4-16
// against 6.6-6.9, but 8.0-8.3 at 24-32 against the CUTLASS tile's 7.8-7.9, which the planner
// keeps there). 28672 rows (3.4 waves) and 1024 x 2048-3072 (too few tiles) stay where they were.
int skinny_bulk_ctas_per_sm(int64_t N, int64_t K) {
  if (!sm90_kernels() || K <= 0 || N <= 0 || N > int64_t{1} << 30 || K > int64_t{1} << 30)
    return 0;
  const int tiles = static_cast<int>((N + kRows - 1) / kRows);
  const int k_tiles = static_cast<int>((K + kBK - 1) / kBK), sms = num_sms();
  if (tiles <= sms &&
      4 * tiles * split_k(tiles, k_tiles, 1, kMinStagesPerSplit).splits >= 3 * sms)
    return 1;
  if (tiles <= 2 * sms &&
      10 * tiles * split_k(tiles, k_tiles, 2, kMinStagesPerSplit).splits >= 7 * 2 * sms)
    return 2;
  return 0;
}

bool launch_gemm_skinny_bulk(const LinearArgs& a, bool bf16, cudaStream_t s) {
  const int c = skinny_bulk_ctas_per_sm(a.N, a.K);
  // TMA: 16-byte aligned bases and row strides.
  if (c == 0 || a.w_stride % 8 != 0 || a.x_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(a.w) % 16 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0)
    return false;
  SplitK sk;
  const dim3 grid = plan_grid(a, c, &sk);
  if (c == 1)
    return bf16 ? launch_c<__nv_bfloat16, 1>(a, true, grid, sk, s)
                : launch_c<__half, 1>(a, false, grid, sk, s);
  return bf16 ? launch_c<__nv_bfloat16, 2>(a, true, grid, sk, s)
              : launch_c<__half, 2>(a, false, grid, sk, s);
}

bool launch_fp8_skinny_bulk(const LinearArgs& a, bool bf16_out, cudaStream_t s) {
  // TMA: 16-byte aligned bases and row strides (the scales' too: N and the x scales' stride
  // whole 4s).
  if (a.T > kFp8SkinnyBulkMaxT || a.K % 128 != 0 || a.w_stride % 16 != 0 ||
      a.x_stride % 16 != 0 || a.N % 4 != 0 || a.x_scale_stride % 4 != 0 ||
      reinterpret_cast<uintptr_t>(a.w) % 16 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.w_scale) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.x_scale) % 16 != 0)
    return false;
  // To the kernel and its maps, rows of byte pairs: a stage's 64 of them are one group of K.
  LinearArgs p = a;
  p.K = a.K / 2;
  p.w_stride = a.w_stride / 2;
  p.x_stride = a.x_stride / 2;
  // Where the 16-bit kernel's rule finds no layout that fills the GPU in one wave (Llama-3-8B's
  // gate_up, 448 tiles), two CTAs an SM anyway: the alternatives stream fp8 weights slower
  // still (CUTLASS's fp8 tiles a few dozen CTAs wide).
  int c = skinny_bulk_ctas_per_sm(p.N, p.K);
  if (c == 0 && sm90_kernels()) c = 2;
  if (c == 0) return false;
  SplitK sk;
  const dim3 grid = plan_grid(p, c, &sk);
  return c == 1 ? launch_c<__nv_fp8_e4m3, 1>(p, bf16_out, grid, sk, s)
                : launch_c<__nv_fp8_e4m3, 2>(p, bf16_out, grid, sk, s);
}

}  // namespace vllmx::cuda::lin
