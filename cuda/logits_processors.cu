// apply_logits_processors on the GPU (allowed ids, bad words, logit bias and min_tokens bans,
// penalties) and apply_token_bitmask (structured output's grammar masks), so that logits stay on
// the device whatever a request asks for (compute_logprobs is in sampler.cu, beside the sampling
// kernel it must agree with). Contracts in csrc/ops.def.
// One block per row; the row's CSR lists live on the GPU and are trusted for their structure
// (the sampler builds them), but an id outside the vocabulary is skipped, never followed.
#include <cmath>

#include "core/op_table.h"
#include "cuda_util.cuh"

namespace vllmx::cuda {

namespace {

constexpr int kThreads = 256;

// A CSR group: row b's entries are ids[indptr[b] .. indptr[b + 1]) (indptr null: no group).
struct Csr {
  const int32_t* indptr;
  const int32_t* ids;
};

struct ProcArgs {
  float* logits;
  int64_t stride;
  int V;
  Csr allowed, words, word_tokens, tail, bias, pen;
  const float* bias_values;
  const int32_t* counts;
  const float *rep, *freq, *pres;
  float* saved;  // scratch: one float per allowed id (the whole batch's)
};

__device__ __forceinline__ bool in_vocab(int32_t id, int V) { return id >= 0 && id < V; }

__global__ void __launch_bounds__(kThreads) logits_processors_kernel(ProcArgs a) {
  pdl_begin();
  const int b = blockIdx.x;
  float* l = a.logits + b * a.stride;
  const int V = a.V;
  if (a.allowed.indptr != nullptr) {
    const int s = a.allowed.indptr[b], e = a.allowed.indptr[b + 1];
    if (e > s) {  // keep only the allowed ids: save them, mask the row, put them back
      for (int j = s + threadIdx.x; j < e; j += kThreads) {
        const int32_t id = a.allowed.ids[j];
        a.saved[j] = in_vocab(id, V) ? l[id] : -INFINITY;
      }
      __syncthreads();
      for (int v = threadIdx.x; v < V; v += kThreads) l[v] = -INFINITY;
      __syncthreads();
      for (int j = s + threadIdx.x; j < e; j += kThreads) {
        const int32_t id = a.allowed.ids[j];
        if (in_vocab(id, V)) l[id] = a.saved[j];
      }
      __syncthreads();
    }
  }
  if (a.words.indptr != nullptr) {  // a word whose prefix ends the output bans its last token
    const int ts = a.tail.indptr[b], te = a.tail.indptr[b + 1];
    for (int w = a.words.indptr[b] + threadIdx.x; w < a.words.indptr[b + 1]; w += kThreads) {
      const int ws = a.word_tokens.indptr[w], we = a.word_tokens.indptr[w + 1];
      const int plen = we - ws - 1;
      bool match = plen >= 0 && plen <= te - ts;
      for (int j = 0; match && j < plen; ++j)
        match = a.word_tokens.ids[ws + j] == a.tail.ids[te - plen + j];
      const int32_t last = plen >= 0 ? a.word_tokens.ids[we - 1] : -1;
      if (match && in_vocab(last, V)) l[last] = -INFINITY;
    }
    __syncthreads();
  }
  if (a.bias.indptr != nullptr) {  // ban ids may repeat bias ids: add atomically
    for (int j = a.bias.indptr[b] + threadIdx.x; j < a.bias.indptr[b + 1]; j += kThreads) {
      const int32_t id = a.bias.ids[j];
      if (in_vocab(id, V)) atomicAdd(l + id, a.bias_values[j]);
    }
    __syncthreads();
  }
  if (a.pen.indptr != nullptr) {  // distinct ids per row: no two threads share one
    const float r = a.rep[b], f = a.freq[b], p = a.pres[b];
    for (int j = a.pen.indptr[b] + threadIdx.x; j < a.pen.indptr[b + 1]; j += kThreads) {
      const int32_t id = a.pen.ids[j];
      if (!in_vocab(id, V)) continue;
      const int32_t c = a.counts[j];
      float x = l[id];
      // The CPU kernel's f32 operations one by one (no fused multiply-add), so both devices
      // give the same bits.
      x = x > 0 ? __fdiv_rn(x, r) : __fmul_rn(x, r);
      x = __fsub_rn(x, __fmul_rn(f, static_cast<float>(c)));
      x = __fsub_rn(x, __fmul_rn(p, static_cast<float>(c > 0)));
      l[id] = x;
    }
  }
}

const int32_t* ids_or_null(const Tensor& t) { return t.defined() ? t.ptr<int32_t>() : nullptr; }

void apply_logits_processors(
    const Tensor& logits, const Tensor& allowed_indptr, const Tensor& allowed_ids,
    const Tensor& bad_words_indptr, const Tensor& bad_word_token_indptr,
    const Tensor& bad_word_tokens, const Tensor& output_tail_indptr, const Tensor& output_tail,
    const Tensor& bias_indptr, const Tensor& bias_ids, const Tensor& bias_values,
    const Tensor& penalty_indptr, const Tensor& penalty_ids, const Tensor& output_counts,
    const Tensor& repetition_penalty, const Tensor& frequency_penalty,
    const Tensor& presence_penalty) {
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs.
  check_rows(logits, "apply_logits_processors", "logits");
  const int64_t B = logits.shape[0], V = logits.shape[1];
  if (B == 0) return;
  static GrowOnlyBuffer saved_buf;
  ProcArgs a{};
  a.logits = logits.ptr<float>();
  a.stride = logits.stride[0];
  a.V = static_cast<int>(V);
  if (allowed_indptr.defined() && allowed_ids.defined() && allowed_ids.numel() > 0) {
    a.allowed = {allowed_indptr.ptr<int32_t>(), allowed_ids.ptr<int32_t>()};
    a.saved = static_cast<float*>(
        saved_buf.get(static_cast<size_t>(allowed_ids.numel()) * sizeof(float)));
  }
  if (bad_words_indptr.defined()) {
    a.words = {bad_words_indptr.ptr<int32_t>(), nullptr};
    a.word_tokens = {bad_word_token_indptr.ptr<int32_t>(), ids_or_null(bad_word_tokens)};
    a.tail = {output_tail_indptr.ptr<int32_t>(), ids_or_null(output_tail)};
  }
  if (bias_indptr.defined() && bias_ids.defined() && bias_ids.numel() > 0) {
    a.bias = {bias_indptr.ptr<int32_t>(), bias_ids.ptr<int32_t>()};
    a.bias_values = bias_values.ptr<float>();
  }
  if (penalty_indptr.defined() && penalty_ids.defined() && penalty_ids.numel() > 0) {
    a.pen = {penalty_indptr.ptr<int32_t>(), penalty_ids.ptr<int32_t>()};
    a.counts = output_counts.ptr<int32_t>();
    a.rep = repetition_penalty.ptr<float>();
    a.freq = frequency_penalty.ptr<float>();
    a.pres = presence_penalty.ptr<float>();
  }
  launch(logits_processors_kernel, static_cast<unsigned>(B), kThreads, 0, stream(), a);
  check_launch("apply_logits_processors kernel");
}

// One thread per logit: the 32 threads of a warp read one mask word (one transaction) and write
// 32 consecutive logits. Threads only ever write -inf, so rows named twice need no care; an
// index outside the batch is skipped (the device cannot report it without a host sync).
__global__ void __launch_bounds__(kThreads)
    token_bitmask_kernel(float* logits, int64_t stride, int B, int V, const uint32_t* bitmask,
                         int words, const int32_t* indices) {
  pdl_begin();
  const int r = blockIdx.y;
  const int v = blockIdx.x * kThreads + threadIdx.x;
  const int row = indices != nullptr ? indices[r] : r;
  if (v >= V || row < 0 || row >= B) return;
  const uint32_t bits = bitmask[static_cast<int64_t>(r) * words + v / 32];
  if (!((bits >> (v % 32)) & 1u)) logits[row * stride + v] = -INFINITY;
}

void apply_token_bitmask(const Tensor& logits, const Tensor& bitmask, const Tensor& indices) {
  // The shapes are the op's contract (csrc/ops.cpp), checked before this runs.
  const char* op = "apply_token_bitmask";
  check_rows(logits, op, "logits");
  check_on_device(bitmask, op, "bitmask");
  check_on_device(indices, op, "indices");
  const int64_t B = logits.shape[0], V = logits.shape[1], R = bitmask.shape[0];
  if (R == 0 || V == 0) return;
  VLLMX_CHECK(R <= 65535, op, "bitmask " + bitmask.str() + " has more rows than a grid holds");
  const dim3 grid(static_cast<unsigned>((V + kThreads - 1) / kThreads), static_cast<unsigned>(R));
  launch(token_bitmask_kernel, grid, kThreads, 0, stream(), logits.ptr<float>(), logits.stride[0],
         static_cast<int>(B), static_cast<int>(V),
         reinterpret_cast<const uint32_t*>(bitmask.ptr<int32_t>()),
         static_cast<int>(bitmask.shape[1]), indices.defined() ? indices.ptr<int32_t>() : nullptr);
  check_launch("apply_token_bitmask kernel");
}

}  // namespace

VLLMX_KERNEL(apply_logits_processors, kCUDA, apply_logits_processors);
VLLMX_KERNEL(apply_token_bitmask, kCUDA, apply_token_bitmask);

}  // namespace vllmx::cuda
