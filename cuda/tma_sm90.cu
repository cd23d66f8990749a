// The host side of tma_sm90.cuh: tensor maps, encoded through the driver's entry point (the
// runtime library links no libcuda) and cached.
#include "tma_sm90.cuh"

#include <cudaTypedefs.h>

#include <mutex>
#include <unordered_map>

namespace vllmx::cuda::tma {

namespace {

// f32: cols f32 values a row, boxes of box_cols x box_rows unswizzled; else 16-bit elements,
// boxes of kBoxCols x box_rows with the 128-byte swizzle.
bool make_map(CUtensorMap* map, const void* base, int64_t cols, int64_t rows,
              int64_t row_stride, int box_cols, int box_rows, bool f32) {
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                             cudaEnableDefault, &q);
#else
    const cudaError_t err =
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q);
#endif
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride) * (f32 ? 4 : 2)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 2,
                const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                f32 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Encoding is host work on every eager launch (mixed steps, enforce_eager; a graph captures its
// maps once), so the weights' and caches' maps (and the activation buffers', per T) are encoded
// once. Cleared when full; a buffer freed and reallocated at the same address with the same
// shape gets the same, still right, map.
bool cached(CUtensorMap* map, const void* base, int64_t cols, int64_t rows, int64_t row_stride,
            int box_cols, int box_rows, bool f32) {
  struct Key {
    const void* base;
    int64_t cols, rows, stride;
    int box_cols, box_rows;
    bool f32;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      size_t h = std::hash<const void*>()(k.base);
      for (int64_t v : {k.cols, k.rows, k.stride, int64_t{k.box_cols}, int64_t{k.box_rows},
                        int64_t{k.f32}})
        h = h * 1000003u ^ std::hash<int64_t>()(v);
      return h;
    }
  };
  static std::mutex mu;
  static std::unordered_map<Key, CUtensorMap, KeyHash> cache;
  const Key key{base, cols, rows, row_stride, box_cols, box_rows, f32};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) {
    *map = it->second;
    return true;
  }
  if (!make_map(map, base, cols, rows, row_stride, box_cols, box_rows, f32)) return false;
  if (cache.size() >= 4096) cache.clear();
  cache.emplace(key, *map);
  return true;
}

}  // namespace

bool cached_map(CUtensorMap* map, const void* base, int64_t cols, int64_t rows,
                int64_t row_stride, int box_rows) {
  return cached(map, base, cols, rows, row_stride, kBoxCols, box_rows, false);
}

bool cached_map_f32(CUtensorMap* map, const float* base, int64_t cols, int64_t rows,
                    int64_t row_stride, int box_cols) {
  return cached(map, base, cols, rows, row_stride, box_cols, 1, true);
}

}  // namespace vllmx::cuda::tma
