// The hybrid mixers' sequential ops on the GPU (contracts in csrc/ops.def; the CPU twins in
// csrc/linear_attn/). causal_conv1d: one thread a (sequence, channel), walking the sequence's
// tokens in order with the window's K - 1 previous inputs in registers (from the request's
// conv_state slot, or zeros at its first tokens), which go back to the slot at the end. A
// token's output depends on its input and the K - 1 before it only: the same whatever the
// batch or the chunking. The sequences' offsets, slots and flags live on the device and are
// trusted as the attention kernels trust theirs (a slot outside the state is skipped).
#include <string>

#include "cuda_util.cuh"
#include "core/op_table.h"

namespace vllmx::cuda {
namespace {

constexpr int kConvMaxK = 8;  // the mixers' windows: 4 (Qwen3-Next, Mamba2), at most a few
constexpr int kConvThreads = 128;

template <typename T, int K>
__global__ void causal_conv1d_kernel(T* __restrict__ out, int64_t out_stride,
                                     const T* __restrict__ x, int64_t x_stride,
                                     const float* __restrict__ w, const float* __restrict__ bias,
                                     float* __restrict__ state, int64_t slots, int64_t D,
                                     const int32_t* __restrict__ qsl,
                                     const int32_t* __restrict__ idx,
                                     const int32_t* __restrict__ init, bool silu) {
  pdl_begin();
  const int b = blockIdx.y;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int64_t t0 = qsl[b], n = qsl[b + 1] - t0;
  const int64_t slot = idx[b];
  if (d >= D || n <= 0 || slot < 0 || slot >= slots) return;
  float* st = state + (slot * D + d) * (K - 1);
  float hist[K - 1], wk[K];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) hist[j] = init[b] != 0 ? st[j] : 0.f;
#pragma unroll
  for (int j = 0; j < K; ++j) wk[j] = w[d * K + j];
  const float b0 = bias != nullptr ? bias[d] : 0.f;
  for (int64_t t = 0; t < n; ++t) {
    const float xv = to_f32(x[(t0 + t) * x_stride + d]);
    float acc = b0;
#pragma unroll
    for (int j = 0; j < K - 1; ++j) acc = fmaf(wk[j], hist[j], acc);
    acc = fmaf(wk[K - 1], xv, acc);
    if (silu) acc = activate<Act::kSilu>(acc);
    out[(t0 + t) * out_stride + d] = from_f32<T>(acc);
#pragma unroll
    for (int j = 0; j + 1 < K - 1; ++j) hist[j] = hist[j + 1];
    hist[K - 2] = xv;
  }
#pragma unroll
  for (int j = 0; j < K - 1; ++j) st[j] = hist[j];
}

template <typename T, int K>
void launch_conv(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                 const Tensor& conv_state, const Tensor& qsl, const Tensor& idx,
                 const Tensor& init, bool silu) {
  const int64_t D = x.shape[1], B = idx.shape[0];
  const dim3 grid(static_cast<unsigned>((D + kConvThreads - 1) / kConvThreads),
                  static_cast<unsigned>(B));
  launch(causal_conv1d_kernel<T, K>, grid, kConvThreads, 0, stream(), out.ptr<T>(),
         out.stride[0], x.ptr<T>(), x.stride[0], weight.ptr<float>(),
         bias.defined() ? bias.ptr<float>() : nullptr, conv_state.ptr<float>(),
         conv_state.shape[0], D, qsl.ptr<int32_t>(), idx.ptr<int32_t>(), init.ptr<int32_t>(),
         silu);
}

template <int K = 2>
void dispatch_k(int64_t k, const char* op, auto&& run) {
  if constexpr (K <= kConvMaxK) {
    if (k == K) return run(std::integral_constant<int, K>{});
    return dispatch_k<K + 1>(k, op, run);
  } else {
    fail(op, "a window of " + std::to_string(k) + " taps (the GPU runs 2.." +
                 std::to_string(kConvMaxK) + ")");
  }
}

void causal_conv1d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& conv_state, const Tensor& query_start_loc,
                   const Tensor& state_indices, const Tensor& has_initial_state, bool silu) {
  // The shapes are the op's contract (csrc/ops.cpp); here the GPU's dtypes and layouts.
  const char* op = "cuda.causal_conv1d";
  check_rows(out, op, "out");
  check_rows(x, op, "x");
  check_act(x, op, "x");
  VLLMX_CHECK(out.dtype == x.dtype, op, "out " + out.str() + " must have x's dtype " + x.str());
  for (const Tensor* t : {&weight, &conv_state, &query_start_loc, &state_indices,
                          &has_initial_state})
    check_on_device(*t, op, "weight, conv_state and the sequence arrays");
  check_on_device(bias, op, "bias");
  VLLMX_CHECK(weight.is_contiguous() && query_start_loc.stride[0] == 1 &&
                  state_indices.stride[0] == 1 && has_initial_state.stride[0] == 1,
              op, "weight and the sequence arrays must be contiguous");
  if (x.shape[1] == 0 || state_indices.shape[0] == 0) return;
  dispatch_float(x.dtype, op, [&](auto v) {
    using T = decltype(v);
    dispatch_k(weight.shape[1], op, [&](auto k) {
      launch_conv<T, decltype(k)::value>(out, x, weight, bias, conv_state, query_start_loc,
                                         state_indices, has_initial_state, silu);
    });
  });
  check_launch(op);
}

}  // namespace

VLLMX_KERNEL(causal_conv1d, kCUDA, causal_conv1d);

}  // namespace vllmx::cuda
