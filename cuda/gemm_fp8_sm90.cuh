// What the two fp8 GEMMs (gemm_fp8_sm90.cu: scaled_mm; gemm_grouped_fp8_sm90.cu: fused_experts'
// fp8 experts) share: the e4m3 operands and their block scales' layout, the one fp8.cu's and
// fused_moe.cu's quantization kernels write.
#pragma once
#include "cute/tensor.hpp"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/numeric_types.h"
#include "gemm_sm90.h"

namespace vllmx::cuda::sm90 {

using E8 = cutlass::float_e4m3_t;
constexpr int kAlignFp8 = 16;  // 16-byte TMA, fp8

// One scale per row of A and of B and per 128 of K, both MN-major ([K / 128][rows]: consecutive
// rows' scales adjacent). Both must be MN-major: CUTLASS 4.2's Sm90BlockwiseScaleConfig builds
// SFB's shared-memory layout from SFA's major.
using Fp8ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<
    1, 1, kFp8Group, cute::GMMA::Major::MN, cute::GMMA::Major::MN>;

}  // namespace vllmx::cuda::sm90
