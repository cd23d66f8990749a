// add_lora_linear on the GPU (vLLM's punica add_lora_linear, the bgmv shape: each row with its
// own adapter slot; rows of one slot read its matrices from L2 after the first). Contract in
// csrc/ops.def. One kernel, a block a (row, output slice): the slice's shrink h = A[s, i r:
// (i + 1) r] x[t] (f32, in shared memory; a warp a rank at a time, lanes over K), then its
// expand y[t, o_i:o_i+1] += B[s, o_i:o_i+1] h (a thread a column, f32 sums rounded once into
// y's dtype). Each (row, slice) computes its shrink once, as the two kernels this replaces did
// (a shrink, then an expand per column block): one kernel a projection instead of two, whose
// fixed cost was most of what LoRA added to a decode step (H100, Qwen3-0.6B's shape at batch
// 32, 4 adapters: 2.8 + 3.8 us added a projection, 0.74 ms a step). The rows' slots and the
// slices' offsets are read on the device, so a CUDA graph replays the op with the slots the
// rows have at each step; rows of slot -1 return at once. A row's result depends on its x row,
// its slot and nothing else: batch-invariant, and the same bits as the two kernels (the same
// dot products in the same order).
#include <algorithm>
#include <string>

#include "cuda_util.cuh"
#include "core/op_table.h"
#include "mma.cuh"  // warp_sum

namespace vllmx::cuda {
namespace {

constexpr int kLoraWarps = 8;
constexpr int kLoraThreads = kLoraWarps * 32;

template <typename T, bool kVec>
__global__ void __launch_bounds__(kLoraThreads) lora_kernel(
    T* __restrict__ y, int64_t y_stride, const T* __restrict__ x, int64_t x_stride,
    const T* __restrict__ a, int64_t K, int64_t R, const T* __restrict__ b, int64_t N,
    int64_t r, const int32_t* __restrict__ slots, const int32_t* __restrict__ offsets) {
  extern __shared__ float h_s[];  // the slice's r shrink values
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int i = blockIdx.y, s = slots[t];
  if (s < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* xr = x + t * x_stride;
  for (int64_t j = warp; j < r; j += kLoraWarps) {
    const T* ar = a + (static_cast<int64_t>(s) * R + i * r + j) * K;
    float acc = 0.0f;
    if constexpr (kVec) {
      constexpr int V = Vec16<T>::N;
      for (int64_t k = static_cast<int64_t>(lane) * V; k < K; k += 32 * V) {
        Vec16<T> xv, av;
        xv.load(xr + k);
        av.load(ar + k);
#pragma unroll
        for (int e = 0; e < V; ++e) acc = fmaf(xv.f[e], av.f[e], acc);
      }
    } else {
      for (int64_t k = lane; k < K; k += 32) acc = fmaf(to_f32(xr[k]), to_f32(ar[k]), acc);
    }
    acc = detail::warp_sum(acc);
    if (lane == 0) h_s[j] = acc;
  }
  __syncthreads();
  T* yr = y + t * y_stride;
  for (int64_t n = offsets[i] + threadIdx.x; n < offsets[i + 1]; n += kLoraThreads) {
    const T* br = b + (static_cast<int64_t>(s) * N + n) * r;
    float acc = 0.0f;
    for (int64_t j = 0; j < r; ++j) acc = fmaf(h_s[j], to_f32(br[j]), acc);
    yr[n] = from_f32<T>(to_f32(yr[n]) + acc);
  }
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
  const int32_t* slots = lora_indices.ptr<int32_t>();
  const size_t smem = static_cast<size_t>(r) * sizeof(float);
  VLLMX_CHECK(smem <= 48 * 1024, op, "rank " + std::to_string(r) + " is too large");
  dispatch_float(x.dtype, op, [&](auto v) {
    using E = decltype(v);
    const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(num_slices));
    const bool vec = K % Vec16<E>::N == 0 && vec16_ok<E>(x.data, x.stride[0]) &&
                     vec16_ok<E>(lora_a.data, K);
    auto run = [&](auto kernel) {
      launch(kernel, grid, kLoraThreads, smem, stream(), y.ptr<E>(), y.stride[0], x.ptr<E>(),
             x.stride[0], lora_a.ptr<E>(), K, R, lora_b.ptr<E>(), N, r, slots,
             output_slices.ptr<int32_t>());
    };
    vec ? run(lora_kernel<E, true>) : run(lora_kernel<E, false>);
  });
  check_launch(op);
}

}  // namespace

VLLMX_KERNEL(add_lora_linear, kCUDA, add_lora_linear);

}  // namespace vllmx::cuda
