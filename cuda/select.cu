// argmax and zero_rows_at_position on the GPU (contracts in csrc/ops.def): one block a row
// for argmax, each thread a strided scan then a block reduction of (value, index) pairs, ties
// to the lower index (the CPU's std::max_element); one thread an element for the zeroing.
#include "core/op_table.h"
#include "cuda_util.cuh"

namespace vllmx::cuda {

namespace {

constexpr int kThreads = 256;

struct MaxAt {
  float v;
  int id;
};

template <typename T>
__global__ void argmax_kernel(int32_t* __restrict__ out, int64_t out_stride,
                              const T* __restrict__ x, int64_t x_stride, int n) {
  pdl_begin();
  const T* row = x + static_cast<int64_t>(blockIdx.x) * x_stride;
  MaxAt best{-INFINITY, -1};
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = to_f32(row[i]);
    if (best.id < 0 || v > best.v) best = {v, i};  // (i rises: the first of equals stays)
  }
  best = block_reduce<kThreads>(best, [](MaxAt a, MaxAt b) {
    if (a.id < 0) return b;
    if (b.id < 0) return a;
    return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a;
  });
  if (threadIdx.x == 0) out[blockIdx.x * out_stride] = best.id;
}

template <typename T>
__global__ void zero_rows_kernel(T* __restrict__ x, int64_t x_stride, int d,
                                 const int32_t* __restrict__ positions, int64_t pos_stride,
                                 int64_t rows, int64_t position) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * d) return;
  const int64_t t = i / d;
  if (positions[t * pos_stride] == position) x[t * x_stride + i % d] = from_f32<T>(0.0f);
}

void argmax(const Tensor& out_ids, const Tensor& x) {
  const char* op = "cuda.argmax";
  check_rows(x, op, "x");
  check_act(x, op, "x");
  check_on_device(out_ids, op, "out_ids");
  if (x.shape[0] == 0) return;
  dispatch_float(x.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(argmax_kernel<T>, static_cast<unsigned>(x.shape[0]), kThreads, 0, stream(),
           out_ids.ptr<int32_t>(), out_ids.stride[0], x.ptr<T>(), x.stride[0],
           static_cast<int>(x.shape[1]));
  });
  check_launch(op);
}

void zero_rows_at_position(const Tensor& x, const Tensor& positions, int64_t position) {
  const char* op = "cuda.zero_rows_at_position";
  check_rows(x, op, "x");
  check_act(x, op, "x");
  check_on_device(positions, op, "positions");
  const int64_t n = x.shape[0] * x.shape[1];
  if (n == 0) return;
  dispatch_float(x.dtype, op, [&](auto z) {
    using T = decltype(z);
    launch(zero_rows_kernel<T>, static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads,
           0, stream(), x.ptr<T>(), x.stride[0], static_cast<int>(x.shape[1]),
           positions.ptr<int32_t>(), positions.stride[0], x.shape[0], position);
  });
  check_launch(op);
}

}  // namespace

VLLMX_KERNEL(argmax, kCUDA, argmax);
VLLMX_KERNEL(zero_rows_at_position, kCUDA, zero_rows_at_position);

}  // namespace vllmx::cuda
