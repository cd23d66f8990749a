// The arch layer of the packed GEMMs (as quant/arch/arch.h is of the quant kernels): the
// scalar twins and the selectors packed_gemm / packed_gemm_k are in repack/repack_gemm*.cpp and
// take these kernels where the arch has them; the x86 ones are in arch/x86/, and on any other
// CPU arch/fallback.cpp has none. A kernel returns its twin's bits.
#pragma once
#include "core/dtype.h"
#include "repack/repack.h"

namespace vllmx {

// The fastest kernel of a packed layout on this CPU, nullptr where it has none that pays:
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (arch/x86/repack_gemm.cpp), Q4_K, Q5_K, Q6_K
// (arch/x86/repack_gemm_k.cpp).
PackedGemmFn arch_packed_gemm(DType base);
PackedGemmFn arch_packed_gemm_k(DType base);

}  // namespace vllmx
