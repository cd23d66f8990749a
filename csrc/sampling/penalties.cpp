// apply_logits_processors: vLLM V1's built-in logits processors over a batch, in place, in
// vLLM's order (Sampler.apply_logits_processors):
//   1. allowed_token_ids: every other token -> -inf;
//   2. bad words: a word's last token -> -inf when its other tokens end the output so far
//      (single-token words always);
//   3. sparse additions: logit_bias values, and -inf for the EOS / stop ids that min_tokens
//      still forbids (the caller merges both lists; -inf + x stays -inf);
//   4. penalties over the tokens seen in the prompt or the output: repetition
//      (logit > 0 ? logit / r : logit * r), then logit -= frequency * count, then
//      logit -= presence * (count > 0), where count is the token's count in the output.
// Every input is per row and sparse (CSR: indptr [B + 1] into flat lists), so the work is
// O(distinct tokens) per row, plus one O(V) fill for rows with allowed_token_ids.
//
// Fast path: float arithmetic, rows in parallel, the allowed mask as save / fill / restore.
// Reference twin: double arithmetic and an explicit boolean mask.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/op_table.h"


namespace vllmx {

// The groups of apply_logits_processors (ops.def), each optional (its indptr undefined).
struct LogitsProcessorArgs {
  Tensor allowed_indptr, allowed_ids;
  Tensor bad_words_indptr, bad_word_token_indptr, bad_word_tokens, output_tail_indptr, output_tail;
  Tensor bias_indptr, bias_ids, bias_values;
  Tensor penalty_indptr, penalty_ids, output_counts;
  Tensor repetition_penalty, frequency_penalty, presence_penalty;
};

}  // namespace vllmx

namespace vllmx {

namespace {

constexpr const char* kOp = "apply_logits_processors";
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Csr {
  const int32_t* indptr = nullptr;
  const int32_t* ids = nullptr;
  bool on() const { return indptr != nullptr; }
  int32_t begin(int64_t b) const { return indptr[b]; }
  int32_t end(int64_t b) const { return indptr[b + 1]; }
};

// Checks indptr's contents (its shape is the op's contract): non-decreasing from 0 to the n
// entries of its flat list.
void check_indptr(const Tensor& indptr, int64_t rows, int64_t n, const char* name) {
  VLLMX_CHECK(indptr.ndim == 1 && indptr.shape[0] == rows + 1, kOp,
        std::string(name) + " " + indptr.str() + " must be [" + std::to_string(rows + 1) + "]");
  const int32_t* p = indptr.ptr<int32_t>();
  VLLMX_CHECK(p[0] == 0 && p[rows] == n, kOp,
        std::string(name) + " must start at 0 and end at " + std::to_string(n) + " (got " +
            std::to_string(p[0]) + " .. " + std::to_string(p[rows]) + ")");
  for (int64_t b = 0; b < rows; ++b)
    VLLMX_CHECK(p[b] <= p[b + 1], kOp, std::string(name) + " must be non-decreasing");
}

int64_t flat_len(const Tensor& t, DType d, const char* name) {
  check_dtype(t, d, kOp, name);
  check_ndim(t, 1, kOp, name);
  return t.shape[0];
}

void check_ids(const Tensor& t, int64_t V, const char* name) {
  const int32_t* p = t.ptr<int32_t>();
  for (int64_t i = 0; i < t.shape[0]; ++i)
    VLLMX_CHECK(p[i] >= 0 && p[i] < V, kOp,
          std::string(name) + " holds token id " + std::to_string(p[i]) +
              ", outside the vocabulary of " + std::to_string(V));
}

Csr csr_group(const Tensor& indptr, const Tensor& ids, int64_t B, int64_t V, const char* iname,
              const char* name, bool are_tokens = true) {
  if (!indptr.defined()) return {};
  const int64_t n = ids.defined() ? flat_len(ids, DType::I32, name) : 0;
  check_indptr(indptr, B, n, iname);
  if (are_tokens && n) check_ids(ids, V, name);
  return {indptr.ptr<int32_t>(), n ? ids.ptr<int32_t>() : nullptr};
}

struct Args {
  Csr allowed, words, word_tokens, tail, bias, pen;
  const float* bias_values = nullptr;
  const int32_t* counts = nullptr;
  const float *rep = nullptr, *freq = nullptr, *pres = nullptr;
};

// True when the last len - 1 tokens of word w equal the end of the row's output tail.
bool word_prefix_matches(const Args& a, int64_t b, int32_t w) {
  const int32_t ws = a.word_tokens.begin(w), we = a.word_tokens.end(w);
  const int32_t plen = we - ws - 1;
  const int32_t ts = a.tail.begin(b), te = a.tail.end(b);
  if (plen > te - ts) return false;
  for (int32_t j = 0; j < plen; ++j)
    if (a.word_tokens.ids[ws + j] != a.tail.ids[te - plen + j]) return false;
  return true;
}

void row_fast(float* l, int64_t V, int64_t b, const Args& a, std::vector<float>& saved) {
  if (a.allowed.on() && a.allowed.end(b) > a.allowed.begin(b)) {
    const int32_t s = a.allowed.begin(b), e = a.allowed.end(b);
    saved.resize(static_cast<size_t>(e - s));
    for (int32_t j = s; j < e; ++j) saved[j - s] = l[a.allowed.ids[j]];
    std::fill(l, l + V, -kInf);
    for (int32_t j = s; j < e; ++j) l[a.allowed.ids[j]] = saved[j - s];
  }
  if (a.words.on()) {
    for (int32_t w = a.words.begin(b); w < a.words.end(b); ++w)
      if (word_prefix_matches(a, b, w)) l[a.word_tokens.ids[a.word_tokens.end(w) - 1]] = -kInf;
  }
  if (a.bias.on()) {
    for (int32_t j = a.bias.begin(b); j < a.bias.end(b); ++j) l[a.bias.ids[j]] += a.bias_values[j];
  }
  if (a.pen.on()) {
    const float r = a.rep[b], f = a.freq[b], p = a.pres[b];
    for (int32_t j = a.pen.begin(b); j < a.pen.end(b); ++j) {
      float& x = l[a.pen.ids[j]];
      const int32_t c = a.counts[j];
      x = x > 0 ? x / r : x * r;
      x -= f * static_cast<float>(c);
      x -= p * static_cast<float>(c > 0);
    }
  }
}

void row_reference(float* l, int64_t V, int64_t b, const Args& a) {
  if (a.allowed.on() && a.allowed.end(b) > a.allowed.begin(b)) {
    std::vector<char> keep(static_cast<size_t>(V), 0);
    for (int32_t j = a.allowed.begin(b); j < a.allowed.end(b); ++j) keep[a.allowed.ids[j]] = 1;
    for (int64_t v = 0; v < V; ++v)
      if (!keep[v]) l[v] = -kInf;
  }
  if (a.words.on()) {
    for (int32_t w = a.words.begin(b); w < a.words.end(b); ++w) {
      const int32_t ws = a.word_tokens.begin(w), we = a.word_tokens.end(w);
      const int32_t ts = a.tail.begin(b), te = a.tail.end(b);
      bool match = we - ws - 1 <= te - ts;
      for (int32_t k = 1; match && k < we - ws; ++k)  // k-th token before the last
        match = a.word_tokens.ids[we - 1 - k] == a.tail.ids[te - k];
      if (match) l[a.word_tokens.ids[we - 1]] = -kInf;
    }
  }
  std::vector<double> x(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) x[v] = l[v];
  if (a.bias.on())
    for (int32_t j = a.bias.begin(b); j < a.bias.end(b); ++j)
      x[a.bias.ids[j]] += static_cast<double>(a.bias_values[j]);
  if (a.pen.on()) {
    std::vector<char> seen(static_cast<size_t>(V), 0);
    std::vector<int64_t> count(static_cast<size_t>(V), 0);
    for (int32_t j = a.pen.begin(b); j < a.pen.end(b); ++j) {
      seen[a.pen.ids[j]] = 1;
      count[a.pen.ids[j]] += a.counts[j];
    }
    const double r = a.rep[b], f = a.freq[b], p = a.pres[b];
    for (int64_t v = 0; v < V; ++v) {
      if (!seen[v]) continue;
      x[v] = x[v] > 0 ? x[v] / r : x[v] * r;
      x[v] -= f * static_cast<double>(count[v]) + p * (count[v] > 0 ? 1.0 : 0.0);
    }
  }
  for (int64_t v = 0; v < V; ++v) l[v] = static_cast<float>(x[v]);
}

const float* penalty_vec(const Tensor& t, int64_t B, const char* name) {
  check_dtype(t, DType::F32, kOp, name);
  VLLMX_CHECK(t.ndim == 1 && t.shape[0] == B, kOp,
        std::string(name) + " " + t.str() + " must have one entry per row (" +
            std::to_string(B) + ")");
  return t.ptr<float>();
}

}  // namespace

void apply_logits_processors(const Tensor& logits, const LogitsProcessorArgs& p, bool reference) {
  // The shapes are the op's contract (csrc/ops.cpp); here the lists' contents, read on the host.
  const int64_t B = logits.shape[0], V = logits.shape[1];
  Args a;
  a.allowed = csr_group(p.allowed_indptr, p.allowed_ids, B, V, "allowed_indptr", "allowed_ids");
  if (p.bad_words_indptr.defined()) {
    VLLMX_CHECK(p.bad_word_token_indptr.defined() && p.output_tail_indptr.defined(), kOp,
          "bad words need bad_word_token_indptr, bad_word_tokens and output_tail(_indptr)");
    const int64_t W = p.bad_word_token_indptr.defined() ? p.bad_word_token_indptr.shape[0] - 1 : 0;
    check_indptr(p.bad_words_indptr, B, W, "bad_words_indptr");
    a.words = {p.bad_words_indptr.ptr<int32_t>(), nullptr};
    a.word_tokens = csr_group(p.bad_word_token_indptr, p.bad_word_tokens, W, V,
                              "bad_word_token_indptr", "bad_word_tokens");
    for (int64_t w = 0; w < W; ++w)
      VLLMX_CHECK(a.word_tokens.end(w) > a.word_tokens.begin(w), kOp,
            "bad word " + std::to_string(w) + " has no tokens");
    a.tail = csr_group(p.output_tail_indptr, p.output_tail, B, V, "output_tail_indptr",
                       "output_tail", false);
  }
  a.bias = csr_group(p.bias_indptr, p.bias_ids, B, V, "bias_indptr", "bias_ids");
  if (a.bias.on()) {
    const int64_t n = a.bias.indptr[B];
    if (n) {
      VLLMX_CHECK(p.bias_values.defined() && flat_len(p.bias_values, DType::F32, "bias_values") == n,
            kOp, "bias_values must be f32 [" + std::to_string(n) + "]");
      a.bias_values = p.bias_values.ptr<float>();
    }
  }
  a.pen = csr_group(p.penalty_indptr, p.penalty_ids, B, V, "penalty_indptr", "penalty_ids");
  if (a.pen.on()) {
    const int64_t n = a.pen.indptr[B];
    if (n) {
      VLLMX_CHECK(p.output_counts.defined() &&
                flat_len(p.output_counts, DType::I32, "output_counts") == n,
            kOp, "output_counts must be i32 [" + std::to_string(n) + "]");
      a.counts = p.output_counts.ptr<int32_t>();
    }
    a.rep = penalty_vec(p.repetition_penalty, B, "repetition_penalty");
    a.freq = penalty_vec(p.frequency_penalty, B, "frequency_penalty");
    a.pres = penalty_vec(p.presence_penalty, B, "presence_penalty");
    for (int64_t b = 0; b < B; ++b)
      VLLMX_CHECK(a.rep[b] > 0 && std::isfinite(a.rep[b]), kOp,
            "repetition_penalty[" + std::to_string(b) + "] = " + std::to_string(a.rep[b]) +
                " must be finite and > 0");
  }
  if (B == 0) return;
  float* lg = logits.ptr<float>();
  const int64_t ls = logits.stride[0];
#pragma omp parallel if (B > 1)
  {
    std::vector<float> saved;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      if (reference)
        row_reference(lg + b * ls, V, b, a);
      else
        row_fast(lg + b * ls, V, b, a, saved);
    }
  }
}


// The op table passes the groups as the op's arguments, in LogitsProcessorArgs's order.
void apply_logits_processors_kernel(const Tensor& logits, const Tensor& allowed_indptr,
                                    const Tensor& allowed_ids, const Tensor& bad_words_indptr,
                                    const Tensor& bad_word_token_indptr,
                                    const Tensor& bad_word_tokens, const Tensor& output_tail_indptr,
                                    const Tensor& output_tail, const Tensor& bias_indptr,
                                    const Tensor& bias_ids, const Tensor& bias_values,
                                    const Tensor& penalty_indptr, const Tensor& penalty_ids,
                                    const Tensor& output_counts, const Tensor& repetition_penalty,
                                    const Tensor& frequency_penalty,
                                    const Tensor& presence_penalty, bool reference) {
  const LogitsProcessorArgs p{allowed_indptr,  allowed_ids,        bad_words_indptr,
                              bad_word_token_indptr, bad_word_tokens, output_tail_indptr,
                              output_tail,     bias_indptr,        bias_ids,
                              bias_values,     penalty_indptr,     penalty_ids,
                              output_counts,   repetition_penalty, frequency_penalty,
                              presence_penalty};
  apply_logits_processors(logits, p, reference);
}

VLLMX_KERNEL(apply_logits_processors, kCPU, apply_logits_processors_kernel);

}  // namespace vllmx
