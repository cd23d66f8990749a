// The arch pickers of the packed GEMMs (repack/arch/arch.h) on a CPU that has no arch/
// directory of its own: no kernel, so packed_is_fast says no and packed weights, if any, run
// the scalar twins. A CPU that gains kernels is left out of this file, as x86 is.
#include "core/cpu_features.h"
#include "repack/arch/arch.h"

#if !VLLMX_X86
namespace vllmx {

PackedGemmFn arch_packed_gemm(DType) { return nullptr; }
PackedGemmFn arch_packed_gemm_k(DType) { return nullptr; }

}  // namespace vllmx
#endif  // !VLLMX_X86
