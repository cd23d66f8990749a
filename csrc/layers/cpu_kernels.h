// CPU kernels that other CPU kernels compose (fused_experts runs each expert's rows through
// linear and silu_and_mul). Each is the op table's kernel, with its checks; reference selects
// the scalar twin.
#pragma once
#include "core/tensor.h"

namespace vllmx {

void linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
            bool reference);
void silu_and_mul(const Tensor& out, const Tensor& x, bool reference);

}  // namespace vllmx
