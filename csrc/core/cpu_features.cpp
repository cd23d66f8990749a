#include "core/cpu_features.h"

#include <cstdlib>
#include <string>

namespace vllmx {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
#if VLLMX_X86
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    c.avx512 = c.avx2 && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    c.avx512_vnni = c.avx512 && __builtin_cpu_supports("avx512vnni");
    c.avx512_bf16 = c.avx512 && __builtin_cpu_supports("avx512bf16");
    c.avx_vnni = c.avx2 && __builtin_cpu_supports("avxvnni");
#endif
    return c;
  }();
  return f;
}

int simd_level() {
  static const int level = [] {
    const CpuFeatures& f = cpu_features();
    int l = f.avx512_vnni ? 3 : f.avx512 ? 2 : f.avx2 ? 1 : 0;
    if (const char* e = std::getenv("VLLMX_ISA")) {
      const std::string v(e);
      const int cap = v == "scalar" ? 0 : v == "avx2" ? 1 : v == "avx512" ? 2 : 3;
      if (cap < l) l = cap;
    }
    return l;
  }();
  return level;
}

}  // namespace vllmx

#include <omp.h>

namespace vllmx {

void set_num_threads(int n) { omp_set_num_threads(n > 0 ? n : omp_get_num_procs()); }
int get_num_threads() { return omp_get_max_threads(); }

}  // namespace vllmx
