#include <cstring>

#include "core/op_table.h"
#include "quant/quant.h"

namespace vllmx {

void embedding(const Tensor& out, const Tensor& ids, const Tensor& table, bool reference) {
  const char* op = "embedding";
  (void)reference;  // a row copy / dequantization has no faster twin worth keeping
  check_dtype(out, DType::F32, op, "out");
  check_dtype(ids, DType::I32, op, "ids");
  check_ndim(ids, 1, op, "ids");
  check_ndim(table, 2, op, "table");
  VLLMX_CHECK(type_traits(table.dtype).supported, op,
        std::string("unsupported table dtype ") + dtype_name(table.dtype));
  const int64_t t = ids.shape[0], vocab = table.shape[0], hidden = table.shape[1];
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == t && out.shape[1] == hidden, op,
        "out " + out.str() + " must be [" + std::to_string(t) + ", " + std::to_string(hidden) +
            "] for table " + table.str());
  const int32_t* idp = ids.ptr<int32_t>();
  for (int64_t i = 0; i < t; ++i)
    VLLMX_CHECK(idp[i] >= 0 && idp[i] < vocab, op,
          "token id " + std::to_string(idp[i]) + " out of range [0, " + std::to_string(vocab) + ")");
  const int64_t rb = row_bytes(table.dtype, hidden);
  const char* base = static_cast<const char*>(table.data);
  float* o = out.ptr<float>();
  for (int64_t i = 0; i < t; ++i)
    dequantize_row(table.dtype, base + idp[i] * rb, o + i * hidden, hidden);
}

VLLMX_KERNEL(embedding, kCPU, embedding);

}  // namespace vllmx
