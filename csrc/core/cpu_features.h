// Run-time CPU feature detection: kernels are compiled for the baseline ISA plus per-function
// target attributes; the fastest path the CPU supports is picked once, at first use.
#pragma once

namespace vllmx {

struct CpuFeatures {
  bool avx2 = false;  // with FMA and F16C
  bool avx512 = false;  // F, BW, VL, DQ
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  bool avx_vnni = false;
};

const CpuFeatures& cpu_features();

// The SIMD level every kernel picker uses: 0 scalar, 1 AVX2, 2 AVX-512, 3 AVX-512 VNNI. The best
// the CPU has, capped by the environment variable VLLMX_ISA (scalar|avx2|avx512|vnni), read once
// at start-up, so that the tests run every path of every kernel family on one machine
// (tests/ops/simd_levels.py). A picker asks this, never cpu_features() directly.
int simd_level();

}  // namespace vllmx

#if defined(__x86_64__) || defined(_M_X64)
#define VLLMX_X86 1
#define VLLMX_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define VLLMX_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define VLLMX_TARGET_AVX512VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#else
#define VLLMX_X86 0
#endif

namespace vllmx {
// Threads used by the native ops (OpenMP); n <= 0 restores the default (all cores).
void set_num_threads(int n);
int get_num_threads();
}  // namespace vllmx
