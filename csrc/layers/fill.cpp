// fill_uniform: random weights for load_format="dummy", from a counter-based hash so that a
// seed gives the same tensor on either device and at any thread count.
#include "core/kernel_pragmas.h"  // no fma contraction: the CUDA kernel's bits are the reference

#include "core/half.h"
#include "core/op_table.h"
#include "sampling/rng.h"

namespace vllmx {

namespace {
template <typename T, typename Round>
void fill(T* p, int64_t n, uint64_t seed, float low, float span, Round round) {
#pragma omp parallel for if (n > (int64_t{1} << 16)) schedule(static)
  for (int64_t i = 0; i < n; ++i)
    p[i] = round(rng::hashed_uniform(seed, static_cast<uint64_t>(i), low, span));
}
}  // namespace

void fill_uniform(const Tensor& out, int64_t seed, float low, float high) {
  // The bounds, out's dtype and contiguity are the op's contract (csrc/ops.cpp).
  const int64_t n = out.numel();
  const uint64_t s = static_cast<uint64_t>(seed);
  const float span = high - low;
  switch (out.dtype) {
    case DType::F32: fill(out.ptr<float>(), n, s, low, span, [](float v) { return v; }); break;
    case DType::F16: fill(out.ptr<uint16_t>(), n, s, low, span, f32_to_f16); break;
    case DType::BF16: fill(out.ptr<uint16_t>(), n, s, low, span, f32_to_bf16); break;
    default: break;  // the contract admits only these
  }
}

VLLMX_KERNEL(fill_uniform, kCPU, fill_uniform);

}  // namespace vllmx
