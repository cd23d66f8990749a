// What the packed kernels read, as offsets (the layout and its arithmetic are in repack.h):
// the parts of a panel and a prepared activation row. Shared by the scalar twins
// (repack_gemm.cpp, repack_gemm_k.cpp) and the arch kernels (arch/x86/repack_gemm*.cpp).
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/quant_k.h"
#include "repack/repack.h"

namespace vllmx {

// ---------------------------------------------------------------- 32-element block types

enum PackKind { kP4_0, kP4_1, kP5_0, kP5_1, kP8_0 };

template <int KIND>
struct Pack {
  static constexpr bool q8 = KIND == kP8_0;
  static constexpr bool has_qh = KIND == kP5_0 || KIND == kP5_1;
  static constexpr bool has_m = KIND == kP4_1 || KIND == kP5_1;
  static constexpr int64_t qs_bytes = q8 ? 512 : 256;
  static constexpr int64_t type_size = q8 ? 34 : 18 + (has_qh ? 4 : 0) + (has_m ? 2 : 0);
  // Offsets of the parts of a panel of nb blocks.
  static int64_t qh_off(int64_t nb) { return nb * qs_bytes; }
  static int64_t d_off(int64_t nb) { return qh_off(nb) + (has_qh ? nb * 64 : 0); }
  static int64_t m_off(int64_t nb) { return d_off(nb) + nb * 32; }
};

// Prepared activation row (repack.h): qs [K], d_x f32 [nb], term f32 / int32 [nb].
struct XRow {
  const int8_t* qs;
  const float* d;
  const uint8_t* term;
  XRow(const uint8_t* row, int64_t nb)
      : qs(reinterpret_cast<const int8_t*>(row)),
        d(reinterpret_cast<const float*>(row + nb * 32)),
        term(row + nb * 32 + nb * 4) {}
  int32_t term_i(int64_t b) const {
    int32_t v;
    std::memcpy(&v, term + 4 * b, 4);
    return v;
  }
  float term_f(int64_t b) const {
    float v;
    std::memcpy(&v, term + 4 * b, 4);
    return v;
  }
};

// ---------------------------------------------------------------- k-quants

enum KKind { kQ4K, kQ5K, kQ6K };

template <int KIND>
struct PackK {
  static constexpr bool q6 = KIND == kQ6K;
  static constexpr bool has_min = !q6;
  static constexpr int64_t type_size = KIND == kQ4K ? 144 : KIND == kQ5K ? 176 : 210;
  static constexpr int64_t block_bytes = kPackRows * type_size;  // one super-block of a panel
  // Offsets inside a super-block of the panel (repack.h).
  static constexpr int64_t qh_off = 32 * 64;
  static constexpr int64_t sc_off = q6 ? qh_off + 16 * 64 : qh_off + (KIND == kQ5K ? 8 * 64 : 0);
  static constexpr int64_t d_off = sc_off + (q6 ? 4 : 3) * 64;
  static constexpr int64_t dmin_off = d_off + 32;
};

// Prepared activation row (repack.h): qs [K], d_x f32 [nb], 16 int32 terms per super-block.
struct XRowK {
  const int8_t* qs;
  const float* d;
  const int32_t* term;
  XRowK(const uint8_t* row, int64_t nb)
      : qs(reinterpret_cast<const int8_t*>(row)),
        d(reinterpret_cast<const float*>(row + nb * QK_K)),
        term(reinterpret_cast<const int32_t*>(row + nb * QK_K + 4 * nb)) {}
};

}  // namespace vllmx
