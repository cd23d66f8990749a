#include <algorithm>
#include <cstring>

#include <vector>

#include "core/op_table.h"
#include "quant/quant.h"
#include "repack/repack.h"

namespace vllmx {

namespace {

// The shapes and dtypes embedding and embedding_shard share: f32 out [T, H] for i32 ids [T] over
// a table [V, H] of a supported dtype.
void check_lookup(const char* op, const Tensor& out, const Tensor& ids, const Tensor& table) {
  check_dtype(out, DType::F32, op, "out");
  check_dtype(ids, DType::I32, op, "ids");
  check_ndim(ids, 1, op, "ids");
  check_ndim(table, 2, op, "table");
  VLLMX_CHECK(type_traits(table.dtype).supported || can_unpack_row(table.dtype), op,
        std::string("unsupported table dtype ") + dtype_name(table.dtype));
  const int64_t t = ids.shape[0], hidden = table.shape[1];
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == t && out.shape[1] == hidden, op,
        "out " + out.str() + " must be [" + std::to_string(t) + ", " + std::to_string(hidden) +
            "] for table " + table.str());
}

}  // namespace

void embedding(const Tensor& out, const Tensor& ids, const Tensor& table, bool reference) {
  const char* op = "embedding";
  (void)reference;  // a row copy / dequantization has no faster twin worth keeping
  check_lookup(op, out, ids, table);
  const int64_t t = ids.shape[0], vocab = table.shape[0], hidden = table.shape[1];
  const int32_t* idp = ids.ptr<int32_t>();
  for (int64_t i = 0; i < t; ++i)
    VLLMX_CHECK(idp[i] >= 0 && idp[i] < vocab, op,
          "token id " + std::to_string(idp[i]) + " out of range [0, " + std::to_string(vocab) + ")");
  float* o = out.ptr<float>();
  if (is_packed(table.dtype)) {  // a tied lm_head's packed copy: each row unpacked first
    VLLMX_CHECK(can_unpack_row(table.dtype), op,
          std::string("a packed ") + dtype_name(table.dtype) + " table is not read by row");
    const DType base = packed_base(table.dtype);
    std::vector<uint8_t> row(static_cast<size_t>(row_bytes(base, hidden)));
    for (int64_t i = 0; i < t; ++i) {
      unpack_row(table.dtype, table.data, vocab, hidden, idp[i], row.data());
      dequantize_row(base, row.data(), o + i * hidden, hidden);
    }
    return;
  }
  const int64_t rb = row_bytes(table.dtype, hidden);
  const char* base = static_cast<const char*>(table.data);
  for (int64_t i = 0; i < t; ++i)
    dequantize_row(table.dtype, base + idp[i] * rb, o + i * hidden, hidden);
}

// A vocab-parallel embedding's share (tensor parallelism): the rows of ids in this rank's
// [vocab_start, vocab_start + rows) looked up, zeros for the others (all_reduce sums them).
void embedding_shard(const Tensor& out, const Tensor& ids, const Tensor& table,
                     int64_t vocab_start) {
  const char* op = "embedding_shard";
  check_lookup(op, out, ids, table);
  VLLMX_CHECK(!is_packed(table.dtype), op, "a packed table is not read by row here");
  VLLMX_CHECK(out.stride[1] == 1, op, "out " + out.str() + " needs unit columns");
  VLLMX_CHECK(vocab_start >= 0, op, "vocab_start must be >= 0");
  const int64_t t = ids.shape[0], rows = table.shape[0], hidden = table.shape[1];
  const int64_t rb = row_bytes(table.dtype, hidden);
  const char* base = static_cast<const char*>(table.data);
  const int32_t* idp = ids.ptr<int32_t>();
  for (int64_t i = 0; i < t; ++i) {
    VLLMX_CHECK(idp[i] >= 0, op, "token id " + std::to_string(idp[i]) + " is negative");
    float* o = out.ptr<float>() + i * out.stride[0];
    const int64_t row = idp[i] - vocab_start;
    if (row >= 0 && row < rows)
      dequantize_row(table.dtype, base + row * rb, o, hidden);
    else
      std::fill(o, o + hidden, 0.0f);
  }
}

VLLMX_KERNEL(embedding, kCPU, embedding);
VLLMX_KERNEL(embedding_shard, kCPU, embedding_shard);

}  // namespace vllmx
