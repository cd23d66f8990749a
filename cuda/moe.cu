// MoE routing on the GPU: topk_softmax and grouped_topk (contracts in csrc/ops.def), one block
// per token. topk_softmax's block is one warp, and no lane reads another's logits: lane l owns
// the experts e = l (mod 32), keeps the best it has not given up, and k rounds of a warp
// argmax (shuffles only, ties to the lower expert id) pick the token's experts in order; only
// the winner's lane looks again at its own experts, for the best below the pick (the order
// (value desc, id asc) is total, so "below the last pick" is "not yet chosen": no flags). The
// first pick is the row's max; lane j keeps pick j and writes it once at the end. (It replaced
// a version with a chosen-flag array, barriers each round and lane 0 rewriting the weights in
// global memory, and moved the traced time little: 14.4 -> 13.9 us in a batch-8 decode step of
// Qwen3.5-35B-A3B on an H100, ~10 us of it added to the step, where vLLM's topkGating takes
// 4.8 us: what holds it is not its own work.) grouped_topk: scores and choice scores in shared
// memory, block reductions.
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

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
    if (beats(other, b)) b = other;
  }
  return b;
}

// The lane's best expert among its own (e = lane, lane + 32, ...) that the pick `below` beats.
__device__ __forceinline__ Best lane_best(const float* row, int E, int lane, Best below) {
  Best b{-FLT_MAX, -1};
  for (int e = lane; e < E; e += 32) {
    const Best c{row[e], e};
    if ((below.id < 0 || beats(below, c)) && beats(c, b)) b = c;
  }
  return b;
}

template <typename T>
__global__ void topk_softmax_kernel(float* __restrict__ weights, int32_t* __restrict__ ids,
                                    const T* __restrict__ gating, int E, int k,
                                    int64_t g_stride, int64_t w_stride, int64_t i_stride,
                                    bool renormalize) {
  pdl_begin();
  extern __shared__ float row[];  // E logits as f32, each read only by the lane that owns it
  const int lane = threadIdx.x;
  const int64_t t = blockIdx.x;
  const T* g = gating + t * g_stride;
  for (int e = lane; e < E; e += 32) row[e] = to_f32(g[e]);
  Best mine = lane_best(row, E, lane, Best{0.f, -1});
  Best kept{0.f, -1};  // lane j: pick j
  float m = 0.f, picked_sum = 0.f;
  for (int j = 0; j < k; ++j) {
    const Best b = warp_best(mine);
    if (j == 0) m = b.v;
    picked_sum += expf(b.v - m);
    if (lane == j) kept = b;
    if (lane == (b.id & 31)) mine = lane_best(row, E, lane, b);
  }
  float denom = picked_sum;
  if (!renormalize) {
    float s = 0.f;
    for (int e = lane; e < E; e += 32) s += expf(row[e] - m);
    denom = detail::warp_sum(s);
  }
  if (lane < k) {
    ids[t * i_stride + lane] = kept.id;
    weights[t * w_stride + lane] = expf(kept.v - m) / denom;
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
  VLLMX_CHECK(k <= 32 && k <= E, op, "top_k " + std::to_string(k) + " must be at most 32 (a " +
              "warp's lanes keep the picks) and at most the " + std::to_string(E) + " experts");
  if (T == 0) return;
  const size_t smem = static_cast<size_t>(E) * sizeof(float);
  dispatch_float(gating_output.dtype, op, [&](auto z) {
    using TG = decltype(z);
    launch(topk_softmax_kernel<TG>, static_cast<unsigned>(T), 32, smem, stream(),
           topk_weights.ptr<float>(), topk_ids.ptr<int32_t>(), gating_output.ptr<TG>(),
           static_cast<int>(E), static_cast<int>(k), gating_output.stride[0],
           topk_weights.stride[0], topk_ids.stride[0], renormalize);
  });
  check_launch("topk_softmax kernel");
}

// grouped_topk (contract in csrc/ops.def), one block per token as topk_softmax: scores and
// choice scores in shared memory, each group's score by one thread (best + second best with a
// choice bias, else best; the CPU kernel's scan), the topk_group best groups and then the k
// best eligible experts by block argmax rounds (ties to the lower id, as the CPU's sorted
// insertion keeps them).
template <typename T>
__global__ void grouped_topk_kernel(float* __restrict__ weights, int32_t* __restrict__ ids,
                                    const T* __restrict__ gating, const float* __restrict__ bias,
                                    int E, int G, int topk_group, int k, int64_t g_stride,
                                    int64_t w_stride, int64_t i_stride, bool sigmoid,
                                    bool renormalize, float scaling) {
  pdl_begin();
  extern __shared__ float grouped_smem[];
  float* scores = grouped_smem;         // [E]
  float* choice = scores + E;           // [E]
  float* group_score = choice + E;      // [G]
  bool* eligible = reinterpret_cast<bool*>(group_score + G);  // [E], then [G] groups taken
  bool* group_taken = eligible + E;
  const int64_t t = blockIdx.x;
  const T* g = gating + t * g_stride;
  for (int e = threadIdx.x; e < E; e += kThreads) scores[e] = to_f32(g[e]);
  if (!sigmoid) {
    Best top{-FLT_MAX, -1};
    for (int e = threadIdx.x; e < E; e += kThreads)
      if (beats(Best{scores[e], e}, top)) top = Best{scores[e], e};
    const float m = block_best(top).v;
    __syncthreads();  // (every thread has read scores[] for the max)
    float s = 0.f;
    for (int e = threadIdx.x; e < E; e += kThreads) s += (scores[e] = expf(scores[e] - m));
    const float denom = block_reduce<kThreads>(s, Sum{});
    for (int e = threadIdx.x; e < E; e += kThreads) scores[e] /= denom;
  } else {
    for (int e = threadIdx.x; e < E; e += kThreads) scores[e] = 1.f / (1.f + expf(-scores[e]));
  }
  for (int e = threadIdx.x; e < E; e += kThreads) {
    choice[e] = bias != nullptr ? scores[e] + bias[e] : scores[e];
    eligible[e] = G == topk_group;
  }
  __syncthreads();
  const int per = E / G;
  for (int grp = threadIdx.x; grp < G; grp += kThreads) {
    const float* c = choice + grp * per;
    float best = -INFINITY, second = -INFINITY;
    for (int i = 0; i < per; ++i) {
      if (c[i] > best) {
        second = best;
        best = c[i];
      } else if (c[i] > second) {
        second = c[i];
      }
    }
    group_score[grp] = bias != nullptr ? best + second : best;
    group_taken[grp] = false;
  }
  __syncthreads();
  if (G != topk_group) {
    for (int j = 0; j < topk_group; ++j) {
      Best b{-FLT_MAX, -1};
      for (int grp = threadIdx.x; grp < G; grp += kThreads)
        if (!group_taken[grp] && beats(Best{group_score[grp], grp}, b))
          b = Best{group_score[grp], grp};
      b = block_best(b);
      if (threadIdx.x == 0) group_taken[b.id] = true;
      for (int i = threadIdx.x; i < per; i += kThreads) eligible[b.id * per + i] = true;
      __syncthreads();
    }
  }
  float picked_sum = 0.f;
  for (int j = 0; j < k; ++j) {
    Best b{-FLT_MAX, -1};
    for (int e = threadIdx.x; e < E; e += kThreads)
      if (eligible[e] && beats(Best{choice[e], e}, b)) b = Best{choice[e], e};
    b = block_best(b);
    if (threadIdx.x == 0) {
      eligible[b.id] = false;
      ids[t * i_stride + j] = b.id;
      weights[t * w_stride + j] = scores[b.id];  // scaled below
    }
    picked_sum += scores[b.id];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float norm = renormalize ? scaling / picked_sum : scaling;
    for (int j = 0; j < k; ++j) weights[t * w_stride + j] *= norm;
  }
}

void grouped_topk(const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& gating_output,
                  const Tensor& bias, int64_t num_expert_group, int64_t topk_group,
                  bool sigmoid, bool renormalize, float routed_scaling_factor) {
  const char* op = "grouped_topk";
  check_rows(gating_output, op, "gating_output");
  check_act(gating_output, op, "gating_output");
  check_rows(topk_weights, op, "topk_weights");
  check_rows(topk_ids, op, "topk_ids");
  check_on_device(bias, op, "e_score_correction_bias");
  const int64_t T = gating_output.shape[0], E = gating_output.shape[1], k = topk_ids.shape[1];
  VLLMX_CHECK(E <= 8192, op, "at most 8192 experts, got gating_output " + gating_output.str());
  VLLMX_CHECK(!bias.defined() || (bias.dtype == DType::F32 && bias.stride[0] == 1), op,
              "e_score_correction_bias " + bias.str() + " must be contiguous f32");
  if (T == 0) return;
  const size_t smem = static_cast<size_t>(2 * E + num_expert_group) * sizeof(float) +
                      static_cast<size_t>(E + num_expert_group) * sizeof(bool);
  dispatch_float(gating_output.dtype, op, [&](auto z) {
    using TG = decltype(z);
    launch(grouped_topk_kernel<TG>, static_cast<unsigned>(T), kThreads, smem, stream(),
           topk_weights.ptr<float>(), topk_ids.ptr<int32_t>(), gating_output.ptr<TG>(),
           bias.defined() ? bias.ptr<float>() : nullptr, static_cast<int>(E),
           static_cast<int>(num_expert_group), static_cast<int>(topk_group),
           static_cast<int>(k), gating_output.stride[0], topk_weights.stride[0],
           topk_ids.stride[0], sigmoid, renormalize, routed_scaling_factor);
  });
  check_launch("grouped_topk kernel");
}

// remap_expert_ids (contract in csrc/ops.def): one thread an id.
__global__ void remap_expert_ids_kernel(int32_t* __restrict__ ids, int64_t rows, int k,
                                        int64_t stride, int64_t start, int64_t count) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * k) return;
  int32_t& e = ids[(i / k) * stride + i % k];
  e = (e >= start && e < start + count) ? static_cast<int32_t>(e - start) : -1;
}

void remap_expert_ids(const Tensor& topk_ids, int64_t start, int64_t count) {
  const int64_t n = topk_ids.shape[0] * topk_ids.shape[1];
  if (n == 0) return;
  launch(remap_expert_ids_kernel, static_cast<unsigned>((n + 255) / 256), 256, 0, stream(),
         topk_ids.ptr<int32_t>(), topk_ids.shape[0], static_cast<int>(topk_ids.shape[1]),
         topk_ids.stride[0], start, count);
  check_launch("remap_expert_ids kernel");
}

}  // namespace

VLLMX_KERNEL(topk_softmax, kCUDA, topk_softmax);
VLLMX_KERNEL(remap_expert_ids, kCUDA, remap_expert_ids);
VLLMX_KERNEL(grouped_topk, kCUDA, grouped_topk);

}  // namespace vllmx::cuda
