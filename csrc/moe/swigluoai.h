// gpt-oss's clamped SwiGLU constants (vLLM's swigluoai_and_mul defaults), shared by the CPU
// and CUDA fused_experts kernels.
#pragma once

namespace vllmx {

constexpr float kSwigluOaiAlpha = 1.702f, kSwigluOaiLimit = 7.0f;

}  // namespace vllmx
