// The packed k-quant layout (repack.h): one panel of 16 rows of Q4_K / Q5_K / Q6_K super-blocks,
// and the Q8_K activations prepared for its kernels (repack_gemm_k.cpp).
#include <cstddef>
#include <cstring>

#include "quant/quant_k.h"
#include "repack/repack.h"

namespace vllmx {

namespace {

// Writes 4 bytes of each of the 16 rows into one 64-byte chunk: byte 4r + i = row r's
// field[off + i], where row r's field starts at src + r * ws.
inline void chunk(const uint8_t* src, int64_t ws, int64_t off, uint8_t* dst) {
  for (int r = 0; r < kPackRows; ++r) std::memcpy(dst + 4 * r, src + r * ws + off, 4);
}

// The 16 rows' f16 field at off, one after another.
inline void halves(const uint8_t* src, int64_t ws, int64_t off, uint8_t* dst) {
  for (int r = 0; r < kPackRows; ++r) std::memcpy(dst + 2 * r, src + r * ws + off, 2);
}

}  // namespace

void repack_panel_k(DType base, const uint8_t* src, int64_t ws, int64_t nb, uint8_t* dst) {
  const int64_t ts = type_traits(base).type_size;
  for (int64_t s = 0; s < nb; ++s) {
    const uint8_t* b = src + s * ts;  // super-block s of row 0; row r is at b + r * ws
    uint8_t* o = dst + s * kPackRows * ts;
    if (base == DType::Q6_K) {
      for (int c = 0; c < 32; ++c)  // chunk 16c + 8h + k <- ql[64c + 32h + 4k]
        chunk(b, ws, offsetof(block_q6_K, ql) + 4 * c, o + 64 * c);
      o += 32 * 64;
      for (int c = 0; c < 16; ++c)  // chunk 8c + k <- qh[32c + 4k]
        chunk(b, ws, offsetof(block_q6_K, qh) + 4 * c, o + 64 * c);
      o += 16 * 64;
      for (int c = 0; c < 4; ++c) chunk(b, ws, offsetof(block_q6_K, scales) + 4 * c, o + 64 * c);
      halves(b, ws, offsetof(block_q6_K, d), o + 4 * 64);
      continue;
    }
    const bool q5 = base == DType::Q5_K;
    const int64_t qs = q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    for (int c = 0; c < 32; ++c) chunk(b, ws, qs + 4 * c, o + 64 * c);  // chunk 8j + c
    o += 32 * 64;
    if (q5) {
      for (int c = 0; c < 8; ++c) chunk(b, ws, offsetof(block_q5_K, qh) + 4 * c, o + 64 * c);
      o += 8 * 64;
    }
    for (int c = 0; c < 3; ++c) chunk(b, ws, offsetof(block_q4_K, scales) + 4 * c, o + 64 * c);
    o += 3 * 64;
    halves(b, ws, offsetof(block_q4_K, d), o);
    halves(b, ws, offsetof(block_q4_K, dmin), o + 32);
  }
}

void prepare_packed_x_k(DType base, const void* xblocks, int64_t K, uint8_t* dst) {
  const int64_t nb = K / QK_K;
  const block_q8_K* x = static_cast<const block_q8_K*>(xblocks);
  float* dx = reinterpret_cast<float*>(dst + K);
  uint8_t* terms = dst + K + 4 * nb;
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(dst + QK_K * b, x[b].qs, QK_K);
    dx[b] = x[b].d;
    int32_t t[16] = {};
    if (base == DType::Q6_K) {
      for (int g = 0; g < 16; ++g) t[g] = 32 * x[b].bsums[g];
    } else {
      int32_t s[8];  // sums over the 32-element groups of the Q4_K / Q5_K scales
      for (int j = 0; j < 8; ++j) s[j] = x[b].bsums[2 * j] + x[b].bsums[2 * j + 1];
      auto pair = [](int32_t lo, int32_t hi) {
        return static_cast<int32_t>((static_cast<uint32_t>(hi) << 16) |
                                    (static_cast<uint32_t>(lo) & 0xFFFF));
      };
      t[0] = pair(s[0], s[2]);
      t[1] = pair(s[1], s[3]);
      t[2] = pair(s[4], s[6]);
      t[3] = pair(s[5], s[7]);
    }
    std::memcpy(terms + 64 * b, t, 64);
  }
}

}  // namespace vllmx
