// The VecDotFn / VecDotRowsFn faces of a SIMD vec_dot family (arch/<cpu>/) whose kernels are
// stamped out per number of activation rows (one weight row against R = 1..kDotRows rows, each
// weight block unpacked once for all of them). A family supplies Kernels(R), the kernel for R
// rows; these adapt it to the two signatures the kernel table holds (quant.h).
#pragma once
#include <algorithm>
#include <cstdint>

#include "quant/arch/arch.h"
#include "quant/quant.h"

namespace vllmx {

// out[r * os] = w . x[r * xs] for a fixed number of rows r.
using RowsKernelFn = void (*)(int64_t n, const void* w, const void* x, int64_t xs, float* out,
                              int64_t os);

template <RowsKernelFn (*Kernels)(int)>
float vec_dot_one(int64_t n, const void* w, const void* x) {
  float v;
  Kernels(1)(n, w, x, 0, &v, 0);
  return v;
}

template <RowsKernelFn (*Kernels)(int)>
void vec_dot_rows(int64_t n, const void* w, const void* x, int64_t xs, int nrows, float* out,
                  int64_t os) {
  Kernels(std::clamp(nrows, 1, kDotRows))(n, w, x, xs, out, os);
}

// Both, as the arch layer hands them out (arch.h).
template <RowsKernelFn (*Kernels)(int)>
ArchDot arch_dot_of() {
  return {vec_dot_one<Kernels>, vec_dot_rows<Kernels>};
}

}  // namespace vllmx
