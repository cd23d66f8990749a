// Repacked block weights for the CPU GEMV / GEMM (llama.cpp's "repack" idea, vllmx's layout).
//
// A block-type weight [N, K] is repacked once at load time into panels of kPackRows = 16
// consecutive output rows. Within a panel, block column b (32 elements of K) of all 16 rows is
// stored so that one 64-byte load yields 4 consecutive elements of each of the 16 rows, ready
// for dpbusd against 4 broadcast activation bytes: the kernel accumulates 16 outputs at once
// with no unpacking shuffles and no horizontal sums. A panel of nb = K / 32 blocks holds, in
// this order (offsets from the panel start):
//   qs  nb x 256 bytes (4-/5-bit) or nb x 512 (Q8_0): for each b, chunks c = 0..3 (0..7 for Q8_0)
//       of 64 bytes; byte 4r + i of chunk c is row r's original qs[4c + i]. 4-/5-bit: the low
//       nibble is element 4c + i, the high nibble element 16 + 4c + i. Q8_0: element 4c + i,
//       stored as q + 128 (unsigned).
//   qh  (Q5_0 / Q5_1) nb x 64 bytes: for each b, 8 little-endian u64 masks; bit 4r + i of mask
//       2c is bit 4 of row r's element 4c + i, of mask 2c + 1 that of element 16 + 4c + i.
//   d   nb x 16 f16: the rows' scales.      m  (Q4_1 / Q5_1) nb x 16 f16: the rows' mins.
// Rows past the last whole panel (N % 16) keep the original block layout, after the panels. The
// packed tensor thus has the shape and byte size of the original, under its own dtype id
// (DType::Q4_0_X16 ...), and stays a row-major [N, row_bytes] byte array to every caller.
//
// Arithmetic (the same in the SIMD kernel and its scalar twin, so they agree bit for bit): per
// output element and block, isum = sum(u * xq) - off * sum(xq) exactly in int32 (u the stored
// unsigned weight, off 8 / 16 / 128 for Q4_0 / Q5_0 / Q8_0, 0 for the *_1 types); then
// acc = fma(float(isum), d_w * d_x, acc) and, for the *_1 types, macc = fma(m_w, s_x, macc),
// block after block; out = acc + macc (+ bias). Nothing depends on T or on the tile.
#pragma once
#include <cstdint>

#include "dtype.h"

namespace vllmx {

constexpr int64_t kPackRows = 16;

// The packed dtype of a block type (Q4_0 -> Q4_0_X16), or DType::F32 where there is none.
DType packed_dtype(DType base);
// The block type a packed dtype holds (Q4_0_X16 -> Q4_0), or DType::F32 if t is not packed.
DType packed_base(DType t);
inline bool is_packed(DType t) { return packed_base(t) != DType::F32; }
// Whether repacking pays on this CPU (a SIMD kernel for the packed layout exists).
bool packed_is_fast(DType base);

// Activations prepared for the packed kernels, one row of K elements: K int8 values (the
// 8-bit activation blocks' qs, in element order), then nb f32 block scales d_x, then nb
// per-block terms: int32 off * sum(qs) for the *_0 weight types, f32 s_x for the *_1 types.
inline int64_t packed_x_row_bytes(int64_t K) { return (K + K / 32 * 8 + 63) / 64 * 64; }
// One row of activation blocks (the weight's vec_dot_type: Q8_0 / Q8_1) -> the layout above.
void prepare_packed_x(DType base, const void* xblocks, int64_t K, uint8_t* dst);

// One panel (16 output rows) against nrows (1..kPackedRows) prepared activation rows x_stride
// bytes apart: out[r * out_stride + i] = row i of the panel . activation row r (+ bias[i]).
constexpr int kPackedRows = 8;
using PackedGemmFn = void (*)(const uint8_t* panel, int64_t nb, const uint8_t* x,
                              int64_t x_stride, int nrows, float* out, int64_t out_stride,
                              const float* bias);
// The fastest kernel for a packed layout on this CPU, or its scalar twin (reference = true).
PackedGemmFn packed_gemm(DType base, bool reference);

}  // namespace vllmx
