// fp8 on the GPU (contracts in csrc/ops.def; the CPU twins in csrc/quant/fp8.cpp give the same
// scales and codes bit for bit): per_token_group_quant_fp8, one warp a (token, 128-wide group),
// four values a lane (fp8.cuh's warp_quant_fp8_group); scaled_mm,
// the CUTLASS fp8 GEMM with block scales (cuda/gemm_fp8_sm90.cu), on Hopper only.
#include <string>

#include "core/op_table.h"
#include "cuda_util.cuh"
#include "fp8.cuh"
#include "gemm_sm90.h"
#include "mma.cuh"

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

void per_token_group_quant_fp8(const Tensor& out_q, const Tensor& out_s, const Tensor& x) {
  const char* op = "cuda.per_token_group_quant_fp8";
  for (const Tensor* t : {&out_q, &out_s, &x}) check_on_device(*t, op, "tensors");
  const int64_t T = x.shape[0], groups = x.shape[1] / kGroup;
  if (T == 0) return;
  // Four values a lane: x's rows and out_q's on 4-element boundaries.
  if (x.stride[0] % 4 != 0 || out_q.stride[0] % 4 != 0 ||
      reinterpret_cast<uintptr_t>(x.data) % (4 * type_traits(x.dtype).type_size) != 0 ||
      reinterpret_cast<uintptr_t>(out_q.data) % 4 != 0)
    fail(op, "x " + x.str() + " and out_q " + out_q.str() +
                 " must start and stride on 4-element boundaries");
  const int64_t items = T * groups;
  const unsigned blocks = static_cast<unsigned>((items + kWarps - 1) / kWarps);
  dispatch_float(x.dtype, op, [&](auto z) {
    using TX = decltype(z);
    launch(per_token_group_quant_fp8_kernel<TX>, blocks, kWarps * 32, 0, stream(),
           out_q.ptr<uint8_t>(), out_q.stride[0], out_s.ptr<float>(), x.ptr<TX>(), x.stride[0],
           T, groups);
  });
  check_launch(op);
}

void scaled_mm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_s,
               const Tensor& b_s, const Tensor& bias) {
  const char* op = "cuda.scaled_mm";
  for (const Tensor* t : {&out, &a, &b, &a_s, &b_s}) check_on_device(*t, op, "tensors");
  const int64_t T = a.shape[0], N = b.shape[0], K = a.shape[1];
  if (T == 0 || N == 0) return;
#ifdef VLLMX_WITH_SM90_GEMM
  if (!detail::sm90_kernels())
    fail(op, "fp8 GEMMs run on Hopper (compute capability 9.0) only");
  if (out.dtype == DType::F32) fail(op, "out must be bf16 or f16 on the GPU, got " + out.str());
  // TMA: 16-byte aligned operands, row strides in whole 16 bytes.
  const bool aligned = reinterpret_cast<uintptr_t>(a.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(b.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(b_s.data) % 16 == 0 &&
                       a.stride[0] % 16 == 0 && b.stride[0] % 16 == 0 &&
                       out.stride[0] % 8 == 0 && N % 8 == 0;
  if (!aligned)
    fail(op, "a " + a.str() + ", b " + b.str() + " and out " + out.str() +
                 " must be 16-byte aligned with rows of whole 16 bytes, N a multiple of 8");
  Sm90Fp8GemmArgs g{a.data, a_s.ptr<float>(), b.data, b_s.ptr<float>(),
                    bias.defined() ? bias.data : nullptr, out.data,
                    static_cast<int>(T), static_cast<int>(N), static_cast<int>(K),
                    a.stride[0], b.stride[0], out.stride[0], out.dtype == DType::BF16,
                    detail::num_sms()};
  // Few tokens: the weight rows on wgmma's 128-row side, the tokens on a narrow one.
  const Sm90Tile tile = T <= 16 ? Sm90Tile::kSwap128x16
                        : T <= 64 ? Sm90Tile::kSwap128x64
                                  : Sm90Tile::k128x128;
  sm90_fp8_gemm(g, tile, stream());
  check_launch(op);
#else
  (void)K;
  (void)bias;
  fail(op, "this build has no sm_90a kernels (fp8 GEMMs run on Hopper only)");
#endif
}

}  // namespace

VLLMX_KERNEL(per_token_group_quant_fp8, kCUDA, per_token_group_quant_fp8);
VLLMX_KERNEL(scaled_mm, kCUDA, scaled_mm);

}  // namespace vllmx::cuda
