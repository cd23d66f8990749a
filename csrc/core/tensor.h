// A non-owning tensor view. Memory is owned by the caller (numpy arrays on the Python side,
// memory-mapped files for weights). Strides are in elements for dense dtypes; quantized
// tensors are row-major with rows of whole blocks, so only the row stride (in bytes) matters.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/dtype.h"

namespace vllmx {

constexpr int kMaxDims = 4;
enum Device : int32_t { kCPU = 0, kCUDA = 1 };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};  // elements (dense) / bytes of a row (quantized, dim 0)
  int32_t device = kCPU;  // where data lives (kCUDA: a device pointer)

  bool defined() const { return data != nullptr; }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  // A dense tensor whose elements are laid out C-contiguously (size-1 dims' strides ignored).
  bool is_contiguous() const {
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] > 1 && stride[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  // Plain string building (no iostreams: they are not safe in every translation unit we link,
  // e.g. the CUDA ones, and cost a locale lookup per call).
  std::string str() const {
    std::string s = dtype_name(dtype);
    s += "[";
    for (int i = 0; i < ndim; ++i) {
      if (i) s += ", ";
      s += std::to_string(shape[i]);
    }
    return s + "]";
  }
};

// Argument checks throw std::invalid_argument (a ValueError in Python) naming the op and shapes.
[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}
// VLLMX_CHECK(cond, op, message): the message is only built when the check fails (these run on
// every op call, so a passing check must not allocate).
#define VLLMX_CHECK(cond, op, what)       \
  do {                                    \
    if (!(cond)) ::vllmx::fail((op), (what)); \
  } while (0)
inline void check_dtype(const Tensor& t, DType d, const char* op, const char* name) {
  if (t.dtype != d)
    fail(op, std::string(name) + " must be " + dtype_name(d) + ", got " + t.str());
}
inline void check_ndim(const Tensor& t, int nd, const char* op, const char* name) {
  if (t.ndim != nd)
    fail(op, std::string(name) + " must have " + std::to_string(nd) + " dims, got " + t.str());
}

// Matrix g of a stacked weight [G, N, K] (fused_experts' experts, batched_linear's groups), as
// the 2-D [N, K] view linear takes.
inline Tensor stacked_view(const Tensor& w, int64_t g) {
  Tensor v = w;
  const TypeTraits& tt = type_traits(w.dtype);
  const int64_t bytes = tt.quantized ? w.stride[0] : w.stride[0] * tt.type_size;
  v.data = static_cast<uint8_t*>(w.data) + g * bytes;
  v.ndim = 2;
  v.shape[0] = w.shape[1];
  v.shape[1] = w.shape[2];
  v.stride[0] = w.stride[1];
  v.stride[1] = w.stride[2];
  v.shape[2] = v.stride[2] = 0;
  return v;
}
// Group g of a dense [T, G, K] tensor (batched_linear's x and out) as the strided 2-D [T, K]
// view linear takes.
inline Tensor group_view(const Tensor& t, int64_t g) {
  Tensor v = t;
  v.data = static_cast<uint8_t*>(t.data) + g * t.stride[1] * type_traits(t.dtype).type_size;
  v.ndim = 2;
  v.shape[1] = t.shape[2];
  v.stride[1] = t.stride[2];
  v.shape[2] = v.stride[2] = 0;
  return v;
}

}  // namespace vllmx
