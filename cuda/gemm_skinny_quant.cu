// The skinny GEMM for block-quantized weights: out[T, N] = x[T, K] @ w[N, K]^T for decode
// batches (quant_skinny_min_t <= T <= kSkinnyMaxT), x bf16 or f16, w in a GGUF block type
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
//   Q4_K, Q5_K and Q6_K (the bulk of Q4_K_M / Q5_K_M files) have stages of their own
//   (q4k_stage, q6k_stage) that take the codes themselves as A and apply each sub-block's
//   scale to its product (kquant_mma.cuh), where the others dequantize every weight first.
#include "gemm_skinny.cuh"
#include "kquant_mma.cuh"

namespace vllmx::cuda::lin {

namespace {

using namespace skinny;

constexpr int kBK = 256;        // K per stage: one k-quant super-block
constexpr int kXLds = kBK + 8;  // x's smem row stride in elements (Q4_K: XTile)

// x's rows in shared memory: padded to kXLds elements; for Q4_K and Q5_K (whose reads the
// swizzle spreads over the banks) kq::kXRow with chunk c of row r at kq::x_chunk(r, c); for Q6_K
// kq::kXRowQ6k.
template <int WK>
struct XTile {
  static constexpr bool kSwizzled = WK == kWQ4_K || WK == kWQ5_K;
  static constexpr int kLds = kSwizzled ? kq::kXRow : WK == kWQ6_K ? kq::kXRowQ6k : kXLds;
  static __device__ __forceinline__ int chunk(int row, int c) {
    return kSwizzled ? kq::x_chunk(row, c) : c;
  }
};
// Splits of fewer stages are mostly pipeline fill (Q4_K 4096 x 4096 at T = 1, the same kernel
// in two H100 runs: eight splits of two 9.8 us, four of four 8.1).
constexpr int kMinStagesPerSplit = 3;

template <int WK>
struct StageBytes {
  static constexpr int kRow = kBK / block_elems(WK) * block_bytes(WK);  // a row's bytes a stage
  // 16-byte copies a row takes: its span may start up to 15 bytes into the first.
  static constexpr int kCopies = (kRow + 15) / 16 + 1;
  static constexpr int kSlot = kCopies * 16;  // its smem bytes
};

// A stage's shared memory: the rows' block bytes and x's rows.
template <int WK, int NT>
constexpr int kStageBytes = kRows * StageBytes<WK>::kSlot + 8 * NT * XTile<WK>::kLds * 2;

// Pipeline stages: four for wider token tiles; for one (decode at batch <= 8) as many as let
// four CTAs share an SM's 227 KB (3-4; each block also costs the driver 1 KB), so that
// registers, not shared memory, bound Q4_K's and Q5_K's. Four stages for every tile had held
// Q4_K (57 KB) to three CTAs an SM where its 102 registers allow four: ncu on an H100, T = 1,
// 28672 x 4096: 46 us at 1.49 TB/s (44% of DRAM), 0.8 warps eligible a cycle, 448 CTAs over
// 396 slots ran 1.13 waves, the last 52 alone; three stages: 38.7 us, 53% of DRAM, one wave.
// (Two stages, five Q6_K CTAs an SM, made its 28672 x 4096 product 6-13% slower.)
template <int WK, int NT>
constexpr int kStages =
    NT > 1 ? 4 : std::clamp((227 * 1024 / 4 - 1024) / kStageBytes<WK, NT>, 3, 4);

template <int WK, int NT>
constexpr int kSmemBytes = kStages<WK, NT> * kStageBytes<WK, NT>;

// One stage (one super-block a row) of Q4_K, the bulk of Q4_K_M files, with the codes as the
// mma's A operand and each sub-block's scale and min applied to its product (kquant_mma.cuh:
// the mapping, and why). Per sub-block, for each 8-token tile: two mmas over the weights, two
// over all-ones for x's sum, four FMA pairs; nothing is rounded to x's dtype. Reads: the two
// rows' 16-byte heads, 8 bytes of each row's codes per 32-byte group (a half warp's 64-bit
// loads hit 32 banks: rows 160 bytes apart), x's 16-byte chunks (swizzled, kq::x_chunk).
// Q5_K (kQ5, the bulk of Q5_K_M files) is the same stage with each code's fifth bit from qh.
template <typename T, int NT, bool kQ5 = false>
__device__ __forceinline__ void q4k_stage(const uint8_t* w0, const uint8_t* w1, const T* xt,
                                          int g, int t, float (&acc)[NT][4]) {
  using C = kq::Codes<std::is_same_v<T, __nv_bfloat16>>;
  constexpr int kQsAt = kQ5 ? kq::kQ5kQsAt : 16;
  const uint4 hv0 = *reinterpret_cast<const uint4*>(w0);
  const uint4 hv1 = *reinterpret_cast<const uint4*>(w1);
  const kq::Q4kHead h0(hv0.x, hv0.y, hv0.z, hv0.w), h1(hv1.x, hv1.y, hv1.z, hv1.w);
  const uint32_t ones[4] = {C::kOnes, C::kOnes, C::kOnes, C::kOnes};
  uint2 qh0 = make_uint2(0, 0), qh1 = make_uint2(0, 0);
  if constexpr (kQ5) {
    qh0 = *reinterpret_cast<const uint2*>(w0 + kq::q5k_qh_offset(t));
    qh1 = *reinterpret_cast<const uint2*>(w1 + kq::q5k_qh_offset(t));
  }
  // The codes of a word (element 4 i .. 4 i + 3 of thread t's 8) of sub-block sb.
  auto codes = [&](uint32_t q, uint32_t qh, int hi, int sb) {
    return kQ5 ? kq::nibbles(q, hi) | kq::q5k_high_bits(qh, sb) : kq::nibbles(q, hi);
  };
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint2 q0 = *reinterpret_cast<const uint2*>(w0 + kq::q4k_qs_offset(j, t, kQsAt));
    const uint2 q1 = *reinterpret_cast<const uint2*>(w1 + kq::q4k_qs_offset(j, t, kQsAt));
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int sb = 2 * j + hi;
      float dl0, mlp0, dl1, mlp1;
      h0.sub(sb, C::kOff, dl0, mlp0);
      h1.sub(sb, C::kOff, dl1, mlp1);
      uint32_t a0[4], a1[4];
      kq::afrag(codes(q0.x, qh0.x, hi, sb), codes(q1.x, qh1.x, hi, sb), C::kMagic, a0);
      kq::afrag(codes(q0.y, qh0.y, hi, sb), codes(q1.y, qh1.y, hi, sb), C::kMagic, a1);
#pragma unroll
      for (int jj = 0; jj < NT; ++jj) {
        const int row = jj * 8 + g;
        const uint4 xv = *reinterpret_cast<const uint4*>(
            xt + row * kq::kXRow + kq::x_chunk(row, 4 * sb + t) * 8);
        float c[4], cx[4];
        mma16816_zero<T>(c, a0, xv.x, xv.y);
        mma16816<T>(c, a1, xv.z, xv.w);
        mma16816_zero<T>(cx, ones, xv.x, xv.y);
        mma16816<T>(cx, ones, xv.z, xv.w);
        kq::scale_acc(acc[jj], c, cx, dl0, mlp0, dl1, mlp1);
      }
    }
  }
}

// One stage of Q6_K (the output, attn_v and half the ffn_down of Q4_K_M files) as Q4_K's
// (kquant_mma.cuh): the 6-bit codes as A, one mma a 16-element sub-block, its scale after.
// 210-byte blocks keep their global alignment modulo 16 in shared memory, so the words of ql,
// qh and the scales are read as 16-bit halves (one bank each for a warp's 32 threads: rows
// 240 bytes apart).
template <typename T, int NT>
__device__ __forceinline__ void q6k_stage(const uint8_t* w0, const uint8_t* w1, const T* xt,
                                          int g, int t, float (&acc)[NT][4]) {
  using C = kq::Codes<std::is_same_v<T, __nv_bfloat16>>;
  using L = ChunkLoad<false>;
  auto head = [](const uint8_t* w) {
    return kq::Q6kHead(L::u16(w + 208), L::u16x2(w + 192), L::u16x2(w + 196),
                       L::u16x2(w + 200), L::u16x2(w + 204));
  };
  const kq::Q6kHead h0 = head(w0), h1 = head(w1);
  const uint32_t ones[4] = {C::kOnes, C::kOnes, C::kOnes, C::kOnes};
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int l16 = 0; l16 < 2; ++l16) {
      const uint32_t ql0[2] = {L::u16x2(w0 + kq::q6k_ql_offset(hf, 0, l16, t)),
                               L::u16x2(w0 + kq::q6k_ql_offset(hf, 1, l16, t))};
      const uint32_t ql1[2] = {L::u16x2(w1 + kq::q6k_ql_offset(hf, 0, l16, t)),
                               L::u16x2(w1 + kq::q6k_ql_offset(hf, 1, l16, t))};
      const uint32_t qh0 = L::u16x2(w0 + kq::q6k_qh_offset(hf, l16, t));
      const uint32_t qh1 = L::u16x2(w1 + kq::q6k_qh_offset(hf, l16, t));
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        float dl0, mlp0, dl1, mlp1;
        h0.sub(8 * hf + 2 * qq + l16, C::kOff, dl0, mlp0);
        h1.sub(8 * hf + 2 * qq + l16, C::kOff, dl1, mlp1);
        uint32_t a[4];
        kq::afrag(kq::q6k_codes(ql0[qq & 1], qh0, qq), kq::q6k_codes(ql1[qq & 1], qh1, qq),
                  C::kMagic, a);
#pragma unroll
        for (int jj = 0; jj < NT; ++jj) {
          const uint2 xv = *reinterpret_cast<const uint2*>(
              xt + (jj * 8 + g) * kq::kXRowQ6k + kq::q6k_x_offset(hf, qq, l16, t));
          float c[4], cx[4];
          mma16816_zero<T>(c, a, xv.x, xv.y);
          mma16816_zero<T>(cx, ones, xv.x, xv.y);
          kq::scale_acc(acc[jj], c, cx, dl0, mlp0, dl1, mlp1);
        }
      }
    }
}

// One stage of any other block type by 8-element chunks (linear.cuh's chunk reader): thread t of
// a quad takes chunk t of each 32 elements of its two rows, mma step s its elements 4s .. 4s + 3
// as k = 2t, 2t + 1, 2t + 8, 2t + 9 (the k order above).
template <typename T, int WK, int NT>
__device__ __forceinline__ void chunk_stage(const uint8_t* w0, const uint8_t* w1, const T* xt,
                                            int g, int t, float (&acc)[NT][4]) {
  constexpr bool kBf = std::is_same_v<T, __nv_bfloat16>;
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
}

template <typename T, int WK, int NT>
__global__ void __launch_bounds__(kThreads)
    gemm_skinny_quant_kernel(LinearArgs a, int stages_per_split, float* partials, int* counters) {
  using SB = StageBytes<WK>;
  constexpr int TT = 8 * NT, S = kStages<WK, NT>;
  constexpr bool kBf = std::is_same_v<T, __nv_bfloat16>;
  extern __shared__ uint4 skinny_quant_smem[];
  uint8_t* Ws = reinterpret_cast<uint8_t*>(skinny_quant_smem);  // [S][kRows][kSlot]
  using XT = XTile<WK>;
  T* Xs = reinterpret_cast<T*>(Ws + S * kRows * SB::kSlot);    // [S][TT][XT::kLds]

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
  // Where a row's span sits in its 16-byte granule is the same at every stage when a stage's
  // bytes are whole granules (all but Q6_K's 210 and IQ4_XS's 136 a row): then this thread's
  // copies are worked out once, and a stage only adds its offset (the copies' index arithmetic
  // had been ~150 instructions a stage, as many as Q4_K's whole product).
  constexpr bool kFixedHead = SB::kRow % 16 == 0;
  constexpr int kWTotal = kRows * SB::kCopies, kWPer = (kWTotal + kThreads - 1) / kThreads;
  // One copy: A copy starting past the span is not made (zeros); the last one made may reach 15
  // bytes beyond it, inside the 16-byte granule of an allocation.
  auto w_copy = [&](int c, int i, const uint8_t*& src, int& dst, bool& ok) {
    const int idx = tid + c * kThreads, r = idx / SB::kCopies, cc = idx % SB::kCopies;
    const uint8_t* p = span(r, i);
    const int h = head(p);
    ok = n0 + r < a.N && cc * 16 < h + SB::kRow;
    src = ok ? p - h + cc * 16 : w_none;
    dst = r * SB::kSlot + cc * 16;
  };
  const uint8_t* w_src0[kWPer];
  int w_dst[kWPer];
  bool w_ok[kWPer];
  if constexpr (kFixedHead) {
#pragma unroll
    for (int c = 0; c < kWPer; ++c)
      if (tid + c * kThreads < kWTotal) w_copy(c, 0, w_src0[c], w_dst[c], w_ok[c]);
  }
  auto load_w = [&](int i, int st) {
#pragma unroll
    for (int c = 0; c < kWPer; ++c) {
      if (tid + c * kThreads >= kWTotal) break;
      const uint8_t* src;
      int dst;
      bool ok;
      if constexpr (kFixedHead) {
        src = w_ok[c] ? w_src0[c] + static_cast<int64_t>(i) * SB::kRow : w_none;
        dst = w_dst[c];
        ok = w_ok[c];
      } else {
        w_copy(c, i, src, dst, ok);
      }
      cp_async16(Ws + st * kRows * SB::kSlot + dst, src, ok);
    }
  };
  // x: this thread's copies at stage 0 (nullptr: a padding token, zeros), a stage kBK on.
  constexpr int kCpr = kBK / 8, kXTotal = TT * kCpr, kXPer = (kXTotal + kThreads - 1) / kThreads;
  const T* x_src0[kXPer];
  int x_dst[kXPer];
#pragma unroll
  for (int c = 0; c < kXPer; ++c) {
    const int idx = tid + c * kThreads, row = idx / kCpr, cc = idx % kCpr;
    x_src0[c] = row < a.T ? xp + static_cast<int64_t>(row) * a.x_stride + kt0 * kBK + cc * 8
                          : nullptr;
    x_dst[c] = row * XT::kLds + XT::chunk(row, cc) * 8;
  }
  auto load_x = [&](int i, int st) {
#pragma unroll
    for (int c = 0; c < kXPer; ++c) {
      if (tid + c * kThreads >= kXTotal) break;
      const bool ok = x_src0[c] != nullptr;
      cp_async16(Xs + st * TT * XT::kLds + x_dst[c], ok ? x_src0[c] + i * kBK : xp, ok);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  skinny_prologue<S>(nkt, load_w, load_x);

  const int g = lane / 4, t = lane % 4, r0 = warp * 16 + g;
  const int w_head0 = head(span(r0, 0)), w_head1 = head(span(r0 + 8, 0));
  for (int i = 0; i < nkt; ++i) {
    const int ni = i + S - 1, nst = ni % S, st = i % S;
    if (ni < nkt) {  // stage nst was last read in iteration i - 1, behind its closing barrier
      load_w(ni, nst);
      load_x(ni, nst);
    }
    cp_async_commit();
    const int h0 = kFixedHead ? w_head0 : head(span(r0, i));
    const int h1 = kFixedHead ? w_head1 : head(span(r0 + 8, i));
    const uint8_t* w0 = Ws + (st * kRows + r0) * SB::kSlot + h0;
    const uint8_t* w1 = Ws + (st * kRows + r0 + 8) * SB::kSlot + h1;
    const T* xt = Xs + st * TT * XT::kLds;
    if constexpr (WK == kWQ4_K || WK == kWQ5_K) {
      q4k_stage<T, NT, WK == kWQ5_K>(w0, w1, xt, g, t, acc);
    } else if constexpr (WK == kWQ6_K) {
      q6k_stage<T, NT>(w0, w1, xt, g, t, acc);
    } else {
      chunk_stage<T, WK, NT>(w0, w1, xt, g, t, acc);
    }
    cp_async_wait<S - 2>();
    __syncthreads();
  }

  skinny_epilogue<NT>(a, kBf, acc, n0, partials, counters);
}

// CTAs of an instantiation an SM holds (shared memory decides).
template <typename T, int WK, int NT>
int ctas_per_sm() {
  static const int n = [] {
    auto* kernel = gemm_skinny_quant_kernel<T, WK, NT>;
    allow_smem(kernel, kSmemBytes<WK, NT>);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmemBytes<WK, NT>);
    return std::max(per_sm, 1);
  }();
  return n;
}

template <typename T, int WK, int NT>
void launch_nt(const LinearArgs& a, const SplitK& sk, int tiles, cudaStream_t s) {
  ctas_per_sm<T, WK, NT>();  // (raises the kernel's shared memory limit once)
  launch(gemm_skinny_quant_kernel<T, WK, NT>, dim3(tiles, sk.splits), kThreads,
         kSmemBytes<WK, NT>, s, a, sk.per, sk.partials, sk.counters);
}

template <typename T, int WK>
void launch_typed(const LinearArgs& a, cudaStream_t s) {
  const int tiles = (a.N + kRows - 1) / kRows;
  // The split plan takes one token tile's occupancy at every T (decode's, the most CTAs an SM
  // holds), so that it is a function of N, K and the block type alone: a row's bits do not
  // depend on the batch. (It had taken the widest tile's, two CTAs an SM: a 64-tile product
  // such as 4096 x 14336 split four ways, 256 CTAs, filled half the 528 slots one Q4_K token
  // tile has; in eight it ran 1.28x as fast.) Wider tiles then run more than a wave where the
  // split fills one.
  const int waves = linear_tuning().skinny_waves > 0 ? linear_tuning().skinny_waves
                                                     : ctas_per_sm<T, WK, 1>();
  const int tt = a.T <= 8 ? 8 : a.T <= 16 ? 16 : 32;
  SplitK sk = split_k(tiles, a.K / kBK, waves, kMinStagesPerSplit);
  // A small product in splits of three stages or more leaves SMs idle (1024 x 4096: 16 tiles in
  // 4 splits, 64 CTAs; on an H100 Q8_0 at T = 2 took 10.3 us where splits of two, 128 CTAs, took
  // 7.8): there, splits of two.
  if (tiles * sk.splits < num_sms()) sk = split_k(tiles, a.K / kBK, waves, 2);
  split_scratch(sk, tiles, tt);
  if (a.T <= 8)
    launch_nt<T, WK, 1>(a, sk, tiles, s);
  else if (a.T <= 16)
    launch_nt<T, WK, 2>(a, sk, tiles, s);
  else
    launch_nt<T, WK, 4>(a, sk, tiles, s);
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
