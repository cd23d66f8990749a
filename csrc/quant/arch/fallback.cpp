// The arch pickers (quant/arch/arch.h) on a CPU that has no arch/ directory of its own: there
// is no fast path, so every selector takes the scalar twins. A CPU that gains kernels gets its
// arch/<cpu>/ files and is left out of this one, as x86 is.
#include "core/cpu_features.h"
#include "quant/arch/arch.h"

#if !VLLMX_X86
namespace vllmx {

ArchDot arch_dot(DType) { return {}; }
ArchDot arch_dot_k(DType) { return {}; }
ArchDot arch_dot_nl(DType) { return {}; }
ArchDot arch_dot_tq(DType) { return {}; }
ArchDot arch_dot_iq(DType) { return {}; }
FromFloatFn arch_quantize_row(DType) { return nullptr; }
QuantBlockQ8KFn arch_quantize_block_q8_K() { return nullptr; }
SignedMaxFn arch_signed_max_q8_K() { return nullptr; }

}  // namespace vllmx
#endif  // !VLLMX_X86
