// MoE routing on the GPU: topk_softmax (contract in csrc/ops.def). One block per token: the
// router row's max and softmax denominator by block reductions, then k rounds of a block
// argmax (ties to the lower expert id) over the experts not yet chosen. E is at most a few
// hundred and k at most 8 or so, so one pass per round over the row is cheap; the row stays in
// shared memory as f32.
#include <cfloat>

#include "core/op_table.h"
#include "cuda_util.cuh"

namespace vllmx::cuda {

namespace {

constexpr int kThreads = 128;

struct Best {
  float v;
  int id;
};

// a beats b: a larger value, or the same value and a lower id (id -1: nothing).
__device__ __forceinline__ bool beats(Best a, Best b) {
  return a.id >= 0 && (b.id < 0 || a.v > b.v || (a.v == b.v && a.id < b.id));
}

// The block's best (value, id) pair.
__device__ Best block_best(Best b) {
  return block_reduce<kThreads>(b, [](Best x, Best y) { return beats(y, x) ? y : x; });
}

template <typename T>
__global__ void topk_softmax_kernel(float* __restrict__ weights, int32_t* __restrict__ ids,
                                    const T* __restrict__ gating, int E, int k,
                                    int64_t g_stride, int64_t w_stride, int64_t i_stride,
                                    bool renormalize) {
  pdl_begin();
  extern __shared__ float row[];  // E logits, then E chosen flags
  bool* chosen = reinterpret_cast<bool*>(row + E);
  const int64_t t = blockIdx.x;
  const T* g = gating + t * g_stride;
  for (int e = threadIdx.x; e < E; e += kThreads) {
    row[e] = to_f32(g[e]);
    chosen[e] = false;
  }
  __syncthreads();
  Best top{-FLT_MAX, -1};
  for (int e = threadIdx.x; e < E; e += kThreads)
    if (beats(Best{row[e], e}, top)) top = Best{row[e], e};
  const float m = block_best(top).v;
  float s = 0.0f;
  if (!renormalize)
    for (int e = threadIdx.x; e < E; e += kThreads) s += expf(row[e] - m);
  const float denom_all = renormalize ? 0.0f : block_reduce<kThreads>(s, Sum{});
  float picked_sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    Best b{-FLT_MAX, -1};
    for (int e = threadIdx.x; e < E; e += kThreads)
      if (!chosen[e] && beats(Best{row[e], e}, b)) b = Best{row[e], e};
    b = block_best(b);
    if (threadIdx.x == 0) {
      chosen[b.id] = true;
      ids[t * i_stride + j] = b.id;
      weights[t * w_stride + j] = expf(b.v - m);  // scaled below
    }
    picked_sum += expf(b.v - m);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float denom = renormalize ? picked_sum : denom_all;
    for (int j = 0; j < k; ++j) weights[t * w_stride + j] /= denom;
  }
}

void topk_softmax(const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& gating_output,
                  bool renormalize) {
  const char* op = "topk_softmax";
  check_rows(gating_output, op, "gating_output");
  check_act(gating_output, op, "gating_output");
  check_rows(topk_weights, op, "topk_weights");
  check_rows(topk_ids, op, "topk_ids");
  const int64_t T = gating_output.shape[0], E = gating_output.shape[1], k = topk_ids.shape[1];
  VLLMX_CHECK(E <= 8192, op, "at most 8192 experts, got gating_output " + gating_output.str());
  if (T == 0) return;
  const size_t smem = static_cast<size_t>(E) * (sizeof(float) + sizeof(bool));
  dispatch_float(gating_output.dtype, op, [&](auto z) {
    using TG = decltype(z);
    launch(topk_softmax_kernel<TG>, static_cast<unsigned>(T), kThreads, smem, stream(),
           topk_weights.ptr<float>(), topk_ids.ptr<int32_t>(), gating_output.ptr<TG>(),
           static_cast<int>(E), static_cast<int>(k), gating_output.stride[0],
           topk_weights.stride[0], topk_ids.stride[0], renormalize);
  });
  check_launch("topk_softmax kernel");
}

}  // namespace

VLLMX_KERNEL(topk_softmax, kCUDA, topk_softmax);

}  // namespace vllmx::cuda
