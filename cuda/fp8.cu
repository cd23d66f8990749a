// fp8 on the GPU (contracts in csrc/ops.def; the CPU twins in csrc/quant/fp8.cpp give the same
// scales and codes bit for bit): per_token_group_quant_fp8, one warp a (token, 128-wide group),
// four values a lane (fp8.cuh's warp_quant_fp8_group); scaled_mm, the CUTLASS fp8 GEMM with
// block scales (cuda/gemm_fp8_sm90.cu), on Hopper only; fp8_linear, the quantization and then,
// for decode's few rows, the skinny TMA GEMM on fp8 weights, or for more, scaled_mm's.
#include <string>

#include "core/op_table.h"
#include "cuda_ops.h"
#include "cuda_util.cuh"
#include "fp8.cuh"
#include "gemm_sm90.h"
#include "linear.cuh"
#include "mma.cuh"
#include "runtime.h"

namespace vllmx::cuda {
namespace {

constexpr int kGroup = 128;
constexpr int kWarps = 8;
// (token, group) items a warp: their loads are all issued before the first is used, so a warp
// keeps 4 x 256 bytes in flight (one item a warp streamed Llama-3-8B's 8192 x 4096 prefill
// activations at ~1 TB/s on an H100).
constexpr int kItemsPerWarp = 4;

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    per_token_group_quant_fp8_kernel(uint8_t* __restrict__ q, int64_t q_stride,
                                     float* __restrict__ scales, int64_t s_stride,
                                     const T* __restrict__ x, int64_t x_stride, int64_t T_rows,
                                     int64_t groups) {
  pdl_begin();
  const int64_t first =
      (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * kItemsPerWarp;
  const int lane = threadIdx.x % 32;
  float v[kItemsPerWarp][4];
#pragma unroll
  for (int j = 0; j < kItemsPerWarp; ++j) {
    const int64_t item = first + j;
    if (item >= T_rows * groups) break;
    const T* xp = x + item / groups * x_stride + item % groups * kGroup + lane * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) v[j][i] = to_f32(xp[i]);
  }
#pragma unroll
  for (int j = 0; j < kItemsPerWarp; ++j) {
    const int64_t item = first + j;
    if (item >= T_rows * groups) return;
    const int64_t t = item / groups, g = item % groups;
    float s;
    const uint32_t packed = warp_quant_fp8_group(v[j], &s);
    *reinterpret_cast<uint32_t*>(q + t * q_stride + g * kGroup + lane * 4) = packed;
    if (lane == 0) scales[g * s_stride + t] = s;
  }
}

void per_token_group_quant_fp8(const Tensor& out_q, const Tensor& out_s, const Tensor& x) {
  const char* op = "cuda.per_token_group_quant_fp8";
  for (const Tensor* t : {&out_q, &out_s, &x}) check_on_device(*t, op, "tensors");
  if (x.shape[0] == 0) return;
  if (out_q.stride[0] % 4 != 0 || !aligned(out_q.data, 4))
    fail(op, "out_q " + out_q.str() + " must start and stride on 4-element boundaries");
  per_token_group_quant_fp8_rows(out_q.ptr<uint8_t>(), out_q.stride[0], out_s.ptr<float>(),
                                 x.shape[0], x, op);
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
  Sm90Schedule planned;
  planned.swizzle = lin::sm90_swizzle(tile, T, N, K);
  g.schedule = lin::tuned_schedule(planned);
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

}  // namespace

void per_token_group_quant_fp8_rows(uint8_t* q, int64_t q_stride, float* s, int64_t s_stride,
                                    const Tensor& x, const char* op) {
  if (x.stride[0] % 4 != 0 || !aligned(x.data, 4 * type_traits(x.dtype).type_size))
    fail(op, "x " + x.str() + " must start and stride on 4-element boundaries");
  const int64_t T = x.shape[0], groups = x.shape[1] / kGroup;
  const int64_t items = T * groups, per_block = kWarps * kItemsPerWarp;
  const unsigned blocks = static_cast<unsigned>((items + per_block - 1) / per_block);
  dispatch_float(x.dtype, op, [&](auto z) {
    using TX = decltype(z);
    launch(per_token_group_quant_fp8_kernel<TX>, blocks, kWarps * 32, 0, stream(), q, q_stride,
           s, s_stride, x.ptr<TX>(), x.stride[0], T, groups);
  });
}

// fp8_linear's product once its x is quantized (into scratch, grow-only: a captured graph keeps
// its pointers; codes [T, K], K whole 128s: rows and the scales after them 16-byte aligned) by
// quantize(q, s, s_stride). Up to 32 rows on the skinny TMA kernel (gemm_skinny_bulk_sm90.cu),
// whose ring keeps ~200 KB of weights in flight an SM where CUTLASS's fp8 tiles leave them
// streamed by a few dozen CTAs; it waits for the quantization only after requesting its first
// stages (PDL), so that small kernel costs little. More rows: CUTLASS.
void fp8_linear_quantized(const Tensor& out, int64_t T, int64_t K, const Tensor& w,
                          const Tensor& w_s, const Tensor& bias, const Fp8Quantize& quantize,
                          const char* op) {
  const int64_t N = w.shape[0], groups = K / kGroup;
  if (T == 0 || N == 0) return;
  require_sm90(op);
  // The skinny kernel reads the scales' rows by TMA: whole 16 bytes apart.
  const bool skinny = T <= lin::kFp8SkinnyBulkMaxT;
  const int64_t s_stride = skinny ? (T + 3) / 4 * 4 : T;
  static GrowOnlyBuffer scratch;
  char* buf = static_cast<char*>(
      scratch.get(static_cast<size_t>(T * K + sizeof(float) * s_stride * groups)));
  auto* q = reinterpret_cast<uint8_t*>(buf);
  auto* s = reinterpret_cast<float*>(buf + T * K);
  quantize(q, s, s_stride);
#ifdef VLLMX_WITH_SM90_GEMM
  if (skinny) {
    lin::LinearArgs a{};
    a.x = q, a.w = w.data, a.bias = bias.defined() ? bias.data : nullptr, a.out = out.data;
    a.T = static_cast<int>(T), a.N = static_cast<int>(N), a.K = static_cast<int>(K);
    a.x_stride = K, a.w_stride = w.stride[0], a.out_stride = out.stride[0];
    a.w_scale = w_s.ptr<float>(), a.x_scale = s, a.x_scale_stride = s_stride;
    if (lin::launch_fp8_skinny_bulk(a, out.dtype == DType::BF16, stream())) {
      check_launch(op);
      return;
    }
  }
#endif
  // CUTLASS reads the scales [K / 128, T] dense.
  if (s_stride != T) quantize(q, s, T);
  gemm(out, q, K, s, T, w, w_s, bias, op);
  check_launch(op);
}

namespace {

void fp8_linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& w_s,
                const Tensor& bias) {
  const char* op = "cuda.fp8_linear";
  for (const Tensor* t : {&out, &x, &w, &w_s, &bias}) check_on_device(*t, op, "tensors");
  if (x.dtype == DType::F32 || x.dtype != out.dtype)
    fail(op, "x " + x.str() + " and out " + out.str() + " must be both bf16 or both f16 on " +
                 "the GPU");
  const int64_t K = x.shape[1];
  fp8_linear_quantized(out, x.shape[0], K, w, w_s, bias,
                       [&](uint8_t* q, float* s, int64_t s_stride) {
                         per_token_group_quant_fp8_rows(q, K, s, s_stride, x, op);
                       },
                       op);
}

}  // namespace

VLLMX_KERNEL(per_token_group_quant_fp8, kCUDA, per_token_group_quant_fp8);
VLLMX_KERNEL(scaled_mm, kCUDA, scaled_mm);
VLLMX_KERNEL(fp8_linear, kCUDA, fp8_linear);

}  // namespace vllmx::cuda
