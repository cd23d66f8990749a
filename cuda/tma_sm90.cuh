// Hopper's tensor memory accelerator and transaction barriers, for the sm_90a kernels that
// stream tiles through a producer warp (gemm_skinny_bulk_sm90.cu; the long prompts' prefill
// attention, attention_prefill_ws_sm90.cu): mbarrier helpers, one 2-D box copy, and the
// host's tensor maps (tma_sm90.cu). Compiled for sm_90a only (cmake/cutlass_sm90.cmake).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "mma.cuh"

namespace vllmx::cuda::tma {

using detail::smem_addr;

constexpr int kBoxCols = 64;  // a box row: 64 16-bit elements, one 128-byte swizzled line

__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count));
}
// After the barriers' init, before any other thread uses them.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// The producer's arrival on a stage's full barrier, announcing the bytes its copies will bring.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT;\n}" ::"r"(smem_addr(b)),
      "r"(parity)
      : "memory");
}
// The box of map at (col, row) into shared dst, counted on barrier b.
__device__ __forceinline__ void tma_box(void* dst, const CUtensorMap& map, int col, int row,
                                        uint64_t* b) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(col), "r"(row), "r"(smem_addr(b))
      : "memory");
}

// A 2-D tensor map over `rows` rows of `cols` 16-bit elements (row_stride elements apart) at
// base: boxes of kBoxCols elements x box_rows rows, 128-byte swizzled, zeros past its edges.
// Encoded once per distinct argument set (a map is a function of its arguments alone; eager
// launches would otherwise encode on every call). False where the driver refuses it.
bool cached_map(CUtensorMap* map, const void* base, int64_t cols, int64_t rows,
                int64_t row_stride, int box_rows);
// The same over f32 values, one row a box of box_cols (a multiple of 4), unswizzled: scales
// that travel with a pipeline stage (row_stride a multiple of 4 too).
bool cached_map_f32(CUtensorMap* map, const float* base, int64_t cols, int64_t rows,
                    int64_t row_stride, int box_cols);

}  // namespace vllmx::cuda::tma
