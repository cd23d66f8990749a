// The pick every x86 quant kernel file makes: the kernels of the SIMD level the CPU has.
#pragma once
#include "core/cpu_features.h"

namespace vllmx {

// simd_level() (which VLLMX_ISA caps): 1 AVX2, 2 AVX-512BW, 3 AVX-512 VNNI; below AVX2 nothing.
template <class K>
K by_level(const K& avx2, const K& avx512, const K& vnni) {
  const int level = simd_level();
  return level >= 3 ? vnni : level >= 2 ? avx512 : level >= 1 ? avx2 : K{};
}

}  // namespace vllmx
