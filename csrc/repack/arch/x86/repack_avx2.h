// The AVX2 (+FMA, F16C) kernels over packed weights (repack_gemm_avx2.cpp,
// repack_gemm_k_avx2.cpp), for the x86 selectors below AVX-512 VNNI: same layout, same bits as
// the scalar twins (repack/repack.h).
#pragma once
#include <immintrin.h>

#include "core/dtype.h"
#include "repack/repack.h"

namespace vllmx {

// Decode and verify steps read each panel byte once from memory: the VNNI and AVX2 kernels
// fetch the 64-byte lines of [p, p + bytes) into L1 ahead of the loop that reads them.
// kPrefetchBytes: how far ahead of a loop (2-8 KiB measured alike; none ~10% slower).
constexpr int64_t kPrefetchBytes = 4096;
inline void prefetch_lines(const void* p, int64_t bytes) {
  for (int64_t l = 0; l < bytes; l += 64)
    _mm_prefetch(static_cast<const char*>(p) + l, _MM_HINT_T0);
}

PackedGemmFn avx2_packed_gemm(DType base);    // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; else nullptr
PackedGemmFn avx2_packed_gemm_k(DType base);  // Q4_K, Q5_K, Q6_K; else nullptr

}  // namespace vllmx
