// add_lora_linear on the GPU (vLLM's punica add_lora_linear, the bgmv shape: each row with its
// own adapter slot; rows of one slot read its matrices from L2 after the first). Contract in
// csrc/ops.def. Two kernels: shrink h[t, :] = A[s] x[t] (f32, in a grow-only workspace: a
// captured graph keeps pointing at it), then expand y[t, o_i:o_i+1] += B[s, o_i:o_i+1] h[t, i r:
// (i + 1) r] (f32 sums, rounded once into y's dtype). The rows' slots and the slices' offsets
// are read on the device, so a CUDA graph replays the op with the slots the rows have at each
// step; rows of slot -1 return at once. A row's result depends on its x row, its slot and
// nothing else: batch-invariant.
#include <algorithm>
#include <string>

#include "cuda_util.cuh"
#include "core/op_table.h"

namespace vllmx::cuda {
namespace {

constexpr int kShrinkWarps = 8;     // outputs (ranks) a shrink block computes, one per warp
constexpr int kExpandThreads = 256;  // outputs an expand block computes, one per thread
// One warp per (row, rank): the dot of x's row with A[s]'s row over K, 16-byte loads where
// rows allow them.
template <typename T, bool kVec>
__global__ void lora_shrink_kernel(const T* __restrict__ x, int64_t x_stride,
                                   const T* __restrict__ a, int64_t K, int64_t R,
                                   const int32_t* __restrict__ slots, float* __restrict__ h) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int s = slots[t];
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.y) * kShrinkWarps + (threadIdx.x >> 5);
  if (s < 0 || r >= R) return;
  const T* xr = x + t * x_stride;
  const T* ar = a + (static_cast<int64_t>(s) * R + r) * K;
  float acc = 0.0f;
  if constexpr (kVec) {
    constexpr int N = Vec16<T>::N;
    for (int64_t k = static_cast<int64_t>(lane) * N; k < K; k += 32 * N) {
      Vec16<T> xv, av;
      xv.load(xr + k);
      av.load(ar + k);
#pragma unroll
      for (int j = 0; j < N; ++j) acc = fmaf(xv.f[j], av.f[j], acc);
    }
  } else {
    for (int64_t k = lane; k < K; k += 32) acc = fmaf(to_f32(xr[k]), to_f32(ar[k]), acc);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) h[t * R + r] = acc;
}

// One thread per (row, output column): its slice's rank-r dot, added into y.
template <typename T>
__global__ void lora_expand_kernel(T* __restrict__ y, int64_t y_stride,
                                   const float* __restrict__ h, int64_t R,
                                   const T* __restrict__ b, int64_t N, int64_t r,
                                   const int32_t* __restrict__ slots,
                                   const int32_t* __restrict__ offsets, int num_slices) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int s = slots[t];
  const int64_t n = static_cast<int64_t>(blockIdx.y) * kExpandThreads + threadIdx.x;
  if (s < 0 || n >= N) return;
  int i = 0;  // n's slice: y's columns [offsets[i], offsets[i + 1])
  while (i + 1 < num_slices && n >= offsets[i + 1]) ++i;
  const float* hr = h + t * R + i * r;
  const T* br = b + (static_cast<int64_t>(s) * N + n) * r;
  float acc = 0.0f;
  for (int64_t j = 0; j < r; ++j) acc = fmaf(hr[j], to_f32(br[j]), acc);
  T* yp = y + t * y_stride + n;
  *yp = from_f32<T>(to_f32(*yp) + acc);
}

float* workspace(size_t floats) {
  static GrowOnlyBuffer buf;
  return static_cast<float*>(buf.get(std::max<size_t>(floats, 4) * sizeof(float)));
}

void add_lora_linear(const Tensor& y, const Tensor& x, const Tensor& lora_a,
                     const Tensor& lora_b, const Tensor& lora_indices,
                     const Tensor& output_slices) {
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs.
  const char* op = "cuda.add_lora_linear";
  check_rows(y, op, "y");
  check_rows(x, op, "x");
  check_act(x, op, "x");
  for (const Tensor* t : {&y, &lora_a, &lora_b})
    if (t->dtype != x.dtype)
      fail(op, "y, lora_a and lora_b must have x's dtype " + std::string(dtype_name(x.dtype)) +
                   ", got " + t->str());
  for (const Tensor* t : {&lora_a, &lora_b}) {
    check_on_device(*t, op, "lora stacks");
    if (t->stride[2] != 1 || t->stride[1] != t->shape[2] ||
        t->stride[0] != t->shape[1] * t->shape[2])
      fail(op, "lora stacks must be contiguous, got " + t->str());
  }
  for (const Tensor* t : {&lora_indices, &output_slices}) {
    check_on_device(*t, op, "lora_indices / output_slices");
    if (t->stride[0] != 1) fail(op, "lora_indices and output_slices must be contiguous");
  }
  const int64_t T = x.shape[0], K = x.shape[1], N = y.shape[1];
  const int64_t R = lora_a.shape[1], r = lora_b.shape[2];
  const int num_slices = static_cast<int>(output_slices.shape[0] - 1);
  if (T == 0 || N == 0) return;
  float* h = workspace(static_cast<size_t>(T * R));
  const int32_t* slots = lora_indices.ptr<int32_t>();
  dispatch_float(x.dtype, op, [&](auto v) {
    using E = decltype(v);
    const dim3 shrink_grid(static_cast<unsigned>(T),
                           static_cast<unsigned>((R + kShrinkWarps - 1) / kShrinkWarps));
    const bool vec = K % Vec16<E>::N == 0 && vec16_ok<E>(x.data, x.stride[0]) &&
                     vec16_ok<E>(lora_a.data, K);
    if (vec)
      launch(lora_shrink_kernel<E, true>, shrink_grid, kShrinkWarps * 32, 0, stream(),
             x.ptr<E>(), x.stride[0], lora_a.ptr<E>(), K, R, slots, h);
    else
      launch(lora_shrink_kernel<E, false>, shrink_grid, kShrinkWarps * 32, 0, stream(),
             x.ptr<E>(), x.stride[0], lora_a.ptr<E>(), K, R, slots, h);
    const dim3 expand_grid(static_cast<unsigned>(T),
                           static_cast<unsigned>((N + kExpandThreads - 1) / kExpandThreads));
    launch(lora_expand_kernel<E>, expand_grid, kExpandThreads, 0, stream(), y.ptr<E>(),
           y.stride[0], static_cast<const float*>(h), R, lora_b.ptr<E>(), N, r, slots,
           output_slices.ptr<int32_t>(), num_slices);
  });
  check_launch(op);
}

}  // namespace

VLLMX_KERNEL(add_lora_linear, kCUDA, add_lora_linear);

}  // namespace vllmx::cuda
