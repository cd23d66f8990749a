// The AVX2 (+FMA, F16C) kernels over packed weights (repack_gemm_avx2.cpp,
// repack_gemm_k_avx2.cpp), for the x86 selectors below AVX-512 VNNI: same layout, same bits as
// the scalar twins (repack/repack.h).
#pragma once
#include "core/dtype.h"
#include "repack/repack.h"

namespace vllmx {

PackedGemmFn avx2_packed_gemm(DType base);    // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; else nullptr
PackedGemmFn avx2_packed_gemm_k(DType base);  // Q4_K, Q5_K, Q6_K; else nullptr

}  // namespace vllmx
