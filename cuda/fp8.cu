// fp8 on the GPU (contracts in csrc/ops.def; the CPU twins in csrc/quant/fp8.cpp give the same
// scales and codes bit for bit): per_token_group_quant_fp8, one warp a (token, 128-wide group),
// four values a lane (fp8.cuh's warp_quant_fp8_group); scaled_mm, the CUTLASS fp8 GEMM with
// block scales (cuda/gemm_fp8_sm90.cu), on Hopper only; fp8_linear, the two in a row, or for
// decode's few rows one kernel of its own (below), where CUTLASS's fp8 tiles leave the weights
// streamed by a few dozen CTAs and the quantization costs a launch of its own.
#include <string>
#include <type_traits>

#include "core/op_table.h"
#include "cuda_util.cuh"
#include "fp8.cuh"
#include "gemm_sm90.h"
#include "mma.cuh"
#include "runtime.h"

namespace vllmx::cuda {
namespace {

constexpr int kGroup = 128;
constexpr int kWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    per_token_group_quant_fp8_kernel(uint8_t* __restrict__ q, int64_t q_stride,
                                     float* __restrict__ scales, const T* __restrict__ x,
                                     int64_t x_stride, int64_t T_rows, int64_t groups) {
  pdl_begin();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (item >= T_rows * groups) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = item / groups, g = item % groups;
  const T* xp = x + t * x_stride + g * kGroup + lane * 4;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = to_f32(xp[i]);
  float s;
  const uint32_t packed = warp_quant_fp8_group(v, &s);
  *reinterpret_cast<uint32_t*>(q + t * q_stride + g * kGroup + lane * 4) = packed;
  if (lane == 0) scales[g * T_rows + t] = s;
}

// x's rows into codes (q, rows q_stride apart) and scales s [K / 128, T]. Four values a lane:
// x's rows on 4-element boundaries (q_stride too, the caller's).
void quant_rows(uint8_t* q, int64_t q_stride, float* s, const Tensor& x, const char* op) {
  if (x.stride[0] % 4 != 0 || !aligned(x.data, 4 * type_traits(x.dtype).type_size))
    fail(op, "x " + x.str() + " must start and stride on 4-element boundaries");
  const int64_t T = x.shape[0], groups = x.shape[1] / kGroup;
  const int64_t items = T * groups;
  const unsigned blocks = static_cast<unsigned>((items + kWarps - 1) / kWarps);
  dispatch_float(x.dtype, op, [&](auto z) {
    using TX = decltype(z);
    launch(per_token_group_quant_fp8_kernel<TX>, blocks, kWarps * 32, 0, stream(), q, q_stride,
           s, x.ptr<TX>(), x.stride[0], T, groups);
  });
}

void per_token_group_quant_fp8(const Tensor& out_q, const Tensor& out_s, const Tensor& x) {
  const char* op = "cuda.per_token_group_quant_fp8";
  for (const Tensor* t : {&out_q, &out_s, &x}) check_on_device(*t, op, "tensors");
  if (x.shape[0] == 0) return;
  if (out_q.stride[0] % 4 != 0 || !aligned(out_q.data, 4))
    fail(op, "out_q " + out_q.str() + " must start and stride on 4-element boundaries");
  quant_rows(out_q.ptr<uint8_t>(), out_q.stride[0], out_s.ptr<float>(), x, op);
  check_launch(op);
}

void require_sm90(const char* op) {
#ifdef VLLMX_WITH_SM90_GEMM
  if (!detail::sm90_kernels())
    fail(op, "fp8 GEMMs run on Hopper (compute capability 9.0) only");
#else
  fail(op, "this build has no sm_90a kernels (fp8 GEMMs run on Hopper only)");
#endif
}

// out = a (codes, T rows a_stride apart; scales a_s [K / 128, T]) times b^T with b's scales.
void gemm(const Tensor& out, const void* a, int64_t a_stride, const float* a_s, int64_t T,
          const Tensor& b, const Tensor& b_s, const Tensor& bias, const char* op) {
  require_sm90(op);
  const int64_t N = b.shape[0], K = b.shape[1];
  if (out.dtype == DType::F32) fail(op, "out must be bf16 or f16 on the GPU, got " + out.str());
  // TMA: 16-byte aligned operands, row strides in whole 16 bytes.
  const bool ok = aligned(a, 16) && aligned(b.data, 16) && aligned(out.data, 16) &&
                  aligned(b_s.data, 16) && a_stride % 16 == 0 && b.stride[0] % 16 == 0 &&
                  out.stride[0] % 8 == 0 && N % 8 == 0;
  if (!ok)
    fail(op, "b " + b.str() + " and out " + out.str() + " (and a) must be 16-byte aligned " +
                 "with rows of whole 16 bytes, N a multiple of 8");
#ifdef VLLMX_WITH_SM90_GEMM
  Sm90Fp8GemmArgs g{a, a_s, b.data, b_s.ptr<float>(), bias.defined() ? bias.data : nullptr,
                    out.data, static_cast<int>(T), static_cast<int>(N), static_cast<int>(K),
                    a_stride, b.stride[0], out.stride[0], out.dtype == DType::BF16,
                    detail::num_sms()};
  // Few tokens: the weight rows on wgmma's 128-row side, the tokens on a narrow one.
  const Sm90Tile tile = T <= 16 ? Sm90Tile::kSwap128x16
                        : T <= 64 ? Sm90Tile::kSwap128x64
                                  : Sm90Tile::k128x128;
  sm90_fp8_gemm(g, tile, stream());
#else
  (void)a_s;
  (void)T;
  (void)bias;
  (void)K;
#endif
}

void scaled_mm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_s,
               const Tensor& b_s, const Tensor& bias) {
  const char* op = "cuda.scaled_mm";
  for (const Tensor* t : {&out, &a, &b, &a_s, &b_s}) check_on_device(*t, op, "tensors");
  if (a.shape[0] == 0 || b.shape[0] == 0) return;
  gemm(out, a.data, a.stride[0], a_s.ptr<float>(), a.shape[0], b, b_s, bias, op);
  check_launch(op);
}

// ---- fp8_linear for decode's few rows (up to 8) ----
//
// One CTA: 32 weight rows (two m16n8k32 tiles) over all of K, its 8 warps taking the 128-wide
// groups in turn (warp w: groups w, w + 8, ...), summed across warps at the end in a fixed
// order. Per group a warp quantizes x's rows itself (per_token_group_quant_fp8's codes and
// scales, bit for bit) and runs 4 e4m3 mma.sync a tile and 8 tokens, f32; the group's sums,
// times the token's and the row's scale, go into the accumulators (scaled_mm's product).
// Lane (g, t) = (lane / 4, lane % 4) reads the group's bytes 16t .. 16t + 15 and
// 64 + 16t .. 64 + 16t + 15 of rows g and g + 8 of each tile (two 16-byte loads a row: each
// load instruction covers 64 contiguous bytes of 8 rows) and the same 32 values of token g: a
// dot product does not care in which order K is summed, so K is permuted within the group,
// the same way on both sides, such that these 8 words are exactly the lane's A and B fragments
// for the group's 4 k-steps (word 2s for k-step s's first half, 2s + 1 its second). The 4 lanes
// of a token hold its whole group: its |max| takes two shuffles.
constexpr int kSkinnyWarps = 8;
constexpr int kSkinnyTiles = 2;   // m16 tiles of weight rows a CTA
constexpr int kSkinnyRows = 16 * kSkinnyTiles;
// One n8 tile of tokens. Two (9..16 rows) measured slower than CUTLASS's fp8 GEMM on an H100
// (4096 x 4096: 16.5 us; 6144 x 4096: 31.2; 28672 x 4096: 106 against CUTLASS's 20.5, 21.9 and
// 51.7 at 32 rows): twice the quantization a warp for the same weight bytes.
constexpr int kSkinnyMaxT = 8;

struct Fp8SkinnyArgs {
  const void* x;
  int64_t x_stride;
  const uint8_t* w;
  int64_t w_stride;
  const float* w_s;  // [K / 128, N]
  const void* bias;
  void* out;
  int64_t out_stride;
  int T, N, K;
};

__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // fp8_linear's host side runs this kernel on Hopper only
#endif
}

__device__ __forceinline__ uint32_t word(const uint4 (&r)[2], int j) {
  const uint4& u = r[j / 4];
  switch (j % 4) {
    case 0: return u.x;
    case 1: return u.y;
    case 2: return u.z;
    default: return u.w;
  }
}

template <typename TX>
__global__ void __launch_bounds__(kSkinnyWarps * 32)
    fp8_linear_skinny_kernel(Fp8SkinnyArgs a) {
  constexpr bool kBf = std::is_same_v<TX, __nv_bfloat16>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * kSkinnyRows, groups = a.K / kGroup;
  // This lane's weight rows: tile i, half h (row g or g + 8 of the tile).
  auto row_of = [&](int i, int h) { return row0 + 16 * i + g + 8 * h; };

  uint4 wr[kSkinnyTiles][2][2];  // [tile][half][16-byte piece]
  float ws[kSkinnyTiles][2];
  auto load_w = [&](int grp) {
#pragma unroll
    for (int i = 0; i < kSkinnyTiles; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row_of(i, h);
        if (row < a.N) {
          const uint8_t* p = a.w + row * a.w_stride + grp * kGroup + 16 * t;
          wr[i][h][0] = __ldg(reinterpret_cast<const uint4*>(p));
          wr[i][h][1] = __ldg(reinterpret_cast<const uint4*>(p + 64));
          ws[i][h] = __ldg(a.w_s + static_cast<int64_t>(grp) * a.N + row);
        } else {
          wr[i][h][0] = wr[i][h][1] = make_uint4(0, 0, 0, 0);
          ws[i][h] = 0.f;
        }
      }
  };
  // Token g's 32 values of the group, 8 to a 16-byte piece; zeros past T (whose codes are 0).
  uint4 xr[4];
  auto load_x = [&](int grp) {
    const TX* p = static_cast<const TX*>(a.x) + g * a.x_stride + grp * kGroup + 16 * t;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      xr[q] = g < a.T ? __ldg(reinterpret_cast<const uint4*>(p + (q / 2) * 64 + (q % 2) * 8))
                      : make_uint4(0, 0, 0, 0);
  };
  float acc[kSkinnyTiles][4];
#pragma unroll
  for (int i = 0; i < kSkinnyTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;

  // The weights do not depend on the previous kernel: the first group's are requested before
  // waiting for it (PDL), x's after.
  int grp = warp;
  if (grp < groups) load_w(grp);
  pdl_begin();
  if (grp < groups) load_x(grp);
  for (; grp < groups; grp += kSkinnyWarps) {
    uint4 w_cur[kSkinnyTiles][2][2], x_cur[4];
    float s_cur[kSkinnyTiles][2];
#pragma unroll
    for (int i = 0; i < kSkinnyTiles; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        w_cur[i][h][0] = wr[i][h][0], w_cur[i][h][1] = wr[i][h][1];
        s_cur[i][h] = ws[i][h];
      }
#pragma unroll
    for (int q = 0; q < 4; ++q) x_cur[q] = xr[q];
    if (grp + kSkinnyWarps < groups) {  // the next group's, in flight while this one computes
      load_w(grp + kSkinnyWarps);
      load_x(grp + kSkinnyWarps);
    }

    // Token g's group quantized: 8 words of codes and its scale.
    float v[32];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float f[8];
      detail::unpack8(x_cur[q], kBf, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[8 * q + e] = f[e];
    }
    float amax = 0.f;
#pragma unroll
    for (int e = 0; e < 32; ++e) amax = fmaxf(amax, fabsf(v[e]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float xs = fp8_group_scale(amax);
    uint32_t xq[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      xq[q] = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) xq[q] |= fp8_code(v[4 * q + e], xs) << (8 * e);
    }

    // The scales of the tokens this lane's sums belong to: 2t and 2t + 1.
    const float as0 = __shfl_sync(0xffffffffu, xs, 8 * t);
    const float as1 = __shfl_sync(0xffffffffu, xs, 8 * t + 4);
#pragma unroll
    for (int i = 0; i < kSkinnyTiles; ++i) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < 4; ++k)
        mma_e4m3(c, word(w_cur[i][0], 2 * k), word(w_cur[i][1], 2 * k),
                 word(w_cur[i][0], 2 * k + 1), word(w_cur[i][1], 2 * k + 1), xq[2 * k],
                 xq[2 * k + 1]);
      acc[i][0] += c[0] * (as0 * s_cur[i][0]);
      acc[i][1] += c[1] * (as1 * s_cur[i][0]);
      acc[i][2] += c[2] * (as0 * s_cur[i][1]);
      acc[i][3] += c[3] * (as1 * s_cur[i][1]);
    }
  }

  // The warps' partial sums, added in warp order.
  constexpr int kVals = kSkinnyTiles * 4;
  __shared__ float red[kSkinnyWarps][kVals][32];
#pragma unroll
  for (int i = 0; i < kSkinnyTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[warp][i * 4 + e][lane] = acc[i][e];
  __syncthreads();
  for (int idx = threadIdx.x; idx < kVals * 32; idx += kSkinnyWarps * 32) {
    const int k = idx / 32, ln = idx % 32;
    float y = 0.f;
#pragma unroll
    for (int wi = 0; wi < kSkinnyWarps; ++wi) y += red[wi][k][ln];
    const int i = k / 4, e = k % 4;
    const int row = row0 + 16 * i + ln / 4 + 8 * (e >> 1);
    const int tok = 2 * (ln % 4) + (e & 1);
    if (row < a.N && tok < a.T) {
      if (a.bias != nullptr) y += to_f32(static_cast<const TX*>(a.bias)[row]);
      static_cast<TX*>(a.out)[tok * a.out_stride + row] = from_f32<TX>(y);
    }
  }
}

void fp8_linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& w_s,
                const Tensor& bias) {
  const char* op = "cuda.fp8_linear";
  for (const Tensor* t : {&out, &x, &w, &w_s, &bias}) check_on_device(*t, op, "tensors");
  const int64_t T = x.shape[0], N = w.shape[0], K = x.shape[1];
  if (T == 0 || N == 0) return;
  require_sm90(op);
  if (x.dtype == DType::F32 || x.dtype != out.dtype)
    fail(op, "x " + x.str() + " and out " + out.str() + " must be both bf16 or both f16 on " +
                 "the GPU");
  // The kernel's 16-byte loads: x's and w's rows on 16-byte boundaries.
  const bool skinny_ok = aligned(x.data, 16) && x.stride[0] % 8 == 0 && aligned(w.data, 16) &&
                         w.stride[0] % 16 == 0;
  if (T <= kSkinnyMaxT && skinny_ok) {
    const Fp8SkinnyArgs args{x.data, x.stride[0], w.ptr<uint8_t>(), w.stride[0],
                             w_s.ptr<float>(), bias.defined() ? bias.data : nullptr, out.data,
                             out.stride[0], static_cast<int>(T), static_cast<int>(N),
                             static_cast<int>(K)};
    const unsigned blocks = static_cast<unsigned>((N + kSkinnyRows - 1) / kSkinnyRows);
    auto run = [&](auto z) {
      using TX = decltype(z);
      launch(fp8_linear_skinny_kernel<TX>, blocks, kSkinnyWarps * 32, 0, stream(), args);
    };
    x.dtype == DType::BF16 ? run(__nv_bfloat16{}) : run(__half{});
    check_launch(op);
    return;
  }
  // More rows: quantized into scratch (grow-only: a captured graph keeps its pointers), codes
  // [T, K] (K whole 128s: rows and the scales after them 16-byte aligned), then the CUTLASS GEMM.
  static GrowOnlyBuffer scratch;
  char* buf = static_cast<char*>(
      scratch.get(static_cast<size_t>(T * K + sizeof(float) * T * (K / kGroup))));
  auto* q = reinterpret_cast<uint8_t*>(buf);
  auto* s = reinterpret_cast<float*>(buf + T * K);
  quant_rows(q, K, s, x, op);
  gemm(out, q, K, s, T, w, w_s, bias, op);
  check_launch(op);
}

}  // namespace

VLLMX_KERNEL(per_token_group_quant_fp8, kCUDA, per_token_group_quant_fp8);
VLLMX_KERNEL(scaled_mm, kCUDA, scaled_mm);
VLLMX_KERNEL(fp8_linear, kCUDA, fp8_linear);

}  // namespace vllmx::cuda
