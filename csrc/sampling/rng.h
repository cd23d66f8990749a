// The sampler's per-request generator, xoroshiro128++, shared by the CPU and CUDA samplers so that
// a seeded request draws the same stream on either. State: u64[2]; an all-zero state (invalid for
// xoroshiro) is replaced by the splitmix64 expansion of 0. u = (next() >> 11) * 2^-53 in [0, 1).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define VLLMX_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define VLLMX_HOST_DEVICE inline
#endif

namespace vllmx::rng {

VLLMX_HOST_DEVICE uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

VLLMX_HOST_DEVICE uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

VLLMX_HOST_DEVICE uint64_t xoroshiro_next(uint64_t* s) {
  if (s[0] == 0 && s[1] == 0) {
    uint64_t x = 0;
    s[0] = splitmix64(x);
    s[1] = splitmix64(x);
  }
  const uint64_t s0 = s[0];
  uint64_t s1 = s[1];
  const uint64_t result = rotl(s0 + s1, 17) + s0;
  s1 ^= s0;
  s[0] = rotl(s0, 49) ^ s1 ^ (s1 << 21);
  s[1] = rotl(s1, 28);
  return result;
}

VLLMX_HOST_DEVICE double uniform01(uint64_t* s) {
  return static_cast<double>(xoroshiro_next(s) >> 11) * 0x1.0p-53;
}

// Element i of the uniform stream `seed` in [0, 1), from i alone (counter-based): the fill_uniform
// op gives the same values on any device and thread count. 24 bits: exact in f32.
VLLMX_HOST_DEVICE float hashed_uniform01(uint64_t seed, uint64_t i) {
  uint64_t x = seed ^ (i * 0xD1B54A32D192ED03ull);
  return static_cast<float>(splitmix64(x) >> 40) * 0x1.0p-24f;
}

// low + span * u, rounded twice on both devices: nvcc would contract it into one fma (a
// different last bit); the CPU file that calls it turns contraction off (kernel_pragmas.h).
VLLMX_HOST_DEVICE float hashed_uniform(uint64_t seed, uint64_t i, float low, float span) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(low, __fmul_rn(span, hashed_uniform01(seed, i)));
#else
  return low + span * hashed_uniform01(seed, i);
#endif
}

}  // namespace vllmx::rng
