// The arch layer of the quant kernels (the layout of ggml-cpu: generic quants + arch/<cpu>/).
//
// csrc/quant/*.cpp hold what every CPU runs: block layouts, dequantization, the scalar reference
// twins and the selectors. A selector asks the picker of its family here first and falls back to
// the scalar twin where the picker has nothing (nullptr). The pickers of x86 (AVX2, AVX-512BW,
// AVX-512 VNNI; picked by simd_level(), which VLLMX_ISA caps) are in arch/x86/, one file beside
// each generic file; on any other CPU arch/fallback.cpp defines them all as "nothing".
// Every fast path returns its scalar twin's bits (see each family's header), so which one runs
// changes speed only.
#pragma once
#include <cstdint>

#include "quant/quant.h"
#include "quant/quant_k.h"

namespace vllmx {

// The SIMD kernels of one weight type on this CPU; a member is nullptr where there is none.
struct ArchDot {
  VecDotFn vec_dot = nullptr;
  VecDotRowsFn vec_dot_rows = nullptr;
};

ArchDot arch_dot(DType t);     // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (arch/x86/quant_dot.cpp)
ArchDot arch_dot_k(DType t);   // Q2_K .. Q6_K (arch/x86/quant_k_dot.cpp)
ArchDot arch_dot_nl(DType t);  // IQ4_NL, IQ4_XS, MXFP4 (arch/x86/quant_nl_dot.cpp)
ArchDot arch_dot_tq(DType t);  // TQ1_0, TQ2_0 (arch/x86/quant_tq.cpp)
ArchDot arch_dot_iq(DType t);  // IQ1_S .. IQ3_S (arch/x86/quant_iq.cpp)

// Activation quantization with the reference's bits (arch/x86/quant.cpp): Q8_0 and Q8_1 rows,
// nullptr for any other type or where there is no fast path.
FromFloatFn arch_quantize_row(DType t);

// One Q8_K block: q = min(127, nearest_int(iscale * x)) and the 16-value sums (quant_k.cpp does
// the rest of quantize_row_q8_K). nullptr where there is no fast path (arch/x86/quant_k.cpp).
using QuantBlockQ8KFn = void (*)(const float* x, float iscale, block_q8_K& y);
QuantBlockQ8KFn arch_quantize_block_q8_K();
// A Q8_K block's value of largest magnitude (the first on ties; NaNs never win) and that
// magnitude in *amax (0 and 0 for a block of zeros). nullptr where there is no fast path.
using SignedMaxFn = float (*)(const float* x, float* amax);
SignedMaxFn arch_signed_max_q8_K();

}  // namespace vllmx
