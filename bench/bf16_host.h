// bf16 <-> float on the host, for the kernel benches' inputs and float64 references
// (attention_decode_bench.cu, attention_prefill_bench.cu): round to nearest even.
#pragma once
#include <cstdint>
#include <cstring>

namespace bench {

inline uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

}  // namespace bench
