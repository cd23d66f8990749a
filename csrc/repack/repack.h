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
//
// Dense weights (F32_X16, F16_X16, BF16_X16; kernels in linear.cpp): a panel holds, for k = 0 ..
// K - 1 in turn, the 16 rows' k-th elements (64 or 32 bytes), so that the kernel accumulates 16
// outputs at once with one load a k (upcast exactly to f32) against broadcast activations, as
// an outer product: each output's sum runs over k in
// order (even and odd k in two sums, added at the end), the same for any number of activation
// rows, hence the same bits in any batch. Rows past the last whole panel follow as they were.
//
// k-quants (Q4_K, Q5_K, Q6_K; repack_k.cpp, kernels in repack_gemm_k.cpp) use the same idea over
// 256-element super-blocks: a panel holds, for each super-block s in turn, 16 x type_size bytes
// (a "chunk" is 64 bytes whose byte 4r + i belongs to row r; qs etc. are the GGUF fields):
//   Q4_K / Q5_K: qs 32 chunks, chunk 8j + c: qs[32j + 4c + i]; its low nibble is element
//       64j + 4c + i (scale group 2j), its high nibble element 64j + 32 + 4c + i (group 2j + 1).
//     Q5_K then qh 8 chunks, chunk c: qh[4c + i]; bit 2j + h is bit 4 of element
//       64j + 32h + 4c + i.
//     scales 3 chunks: chunk w holds the row's 12 scale bytes 4w .. 4w + 3 (as u32 words, so
//       the 6-bit scales and mins unpack with the vec_dot's word arithmetic, 16 rows at once);
//     d 16 f16, dmin 16 f16.
//   Q6_K: ql 32 chunks, chunk 16c + 8h + k: ql[64c + 32h + 4k + i]; low nibble element
//       128c + 32h + 4k + i, high nibble element 128c + 32(h + 2) + 4k + i.
//     qh 16 chunks, chunk 8c + k: qh[32c + 4k + i]; bits 2s, 2s + 1 are bits 4, 5 of element
//       128c + 32s + 4k + i.   scales 4 chunks, chunk w: scales[4w + i].   d 16 f16.
// Their arithmetic is the k-quant vec_dot's (quant_k_dot.cpp): per row and super-block the exact
// int32 isum = sum_g scale_g * dot_g (offsets folded in for Q6_K) and imin = sum_g min_g *
// sum_g(xq), then sumf += (d * d_x) * isum and sumf -= (dmin * d_x) * imin in super-block order.
// Integer sums are exact in any order, so a packed k-quant row equals its vec_dot bit for bit.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace vllmx {

constexpr int64_t kPackRows = 16;

// What packed_dtype / packed_base answer where there is no packed layout (a dtype no weight has).
constexpr DType kNotPacked = DType::U8;
// The packed dtype of a weight type (Q4_0 -> Q4_0_X16, BF16 -> BF16_X16), or kNotPacked.
DType packed_dtype(DType base);
// The weight type a packed dtype holds (Q4_0_X16 -> Q4_0), or kNotPacked if t is not packed.
DType packed_base(DType t);
inline bool is_packed(DType t) { return packed_base(t) != kNotPacked; }
// Whether repacking pays on this CPU (a SIMD kernel for the packed layout exists).
bool packed_is_fast(DType base);
// Whether this CPU has the SIMD kernels of dense panels (linear.cpp: AVX-512).
bool dense_panel_is_fast();

inline bool is_k_quant(DType base) {
  return base == DType::Q4_K || base == DType::Q5_K || base == DType::Q6_K;
}

// Row `row` of a packed [N, K] weight in its base layout (row_bytes(base, K) bytes at dst): a
// tied embedding's lookups read the lm_head's packed copy, so the mapped table stays unread.
// For packed Q8_0 and the dense panels (can_unpack_row).
bool can_unpack_row(DType t);
void unpack_row(DType t, const void* data, int64_t N, int64_t K, int64_t row, void* dst);

// Activations prepared for the packed kernels, one row of K elements: K int8 values (the
// 8-bit activation blocks' qs, in element order), then nb f32 block scales d_x, then per block:
//   32-element types: one term, int32 off * sum(qs) for the *_0 weight types, f32 s_x for *_1;
//   k-quants (Q8_K activations): 16 int32 terms; for Q6_K 32 * sum of the 16 qs of group g,
//     for Q4_K / Q5_K four int16 pairs of the 32-element sums S_j, (S0, S2), (S1, S3),
//     (S4, S6), (S5, S7), matching the kernel's pairs of mins (then 12 zeros).
inline int64_t packed_x_row_bytes(DType base, int64_t K) {
  const int64_t per_block = is_k_quant(base) ? K / 256 * (4 + 64) : K / 32 * 8;
  return (K + per_block + 63) / 64 * 64;
}
// One row of activation blocks (the weight's vec_dot_type: Q8_0 / Q8_1 / Q8_K) -> the layout
// above.
void prepare_packed_x(DType base, const void* xblocks, int64_t K, uint8_t* dst);

// One panel (16 output rows) against nrows (1..kPackedRows) prepared activation rows x_stride
// bytes apart: out[r * out_stride + i] = row i of the panel . activation row r (+ bias[i]).
constexpr int kPackedRows = 8;
// nb counts blocks of the base type (32 or 256 elements).
using PackedGemmFn = void (*)(const uint8_t* panel, int64_t nb, const uint8_t* x,
                              int64_t x_stride, int nrows, float* out, int64_t out_stride,
                              const float* bias);
// The fastest kernel for a packed layout on this CPU, or its scalar twin (reference = true).
PackedGemmFn packed_gemm(DType base, bool reference);

// The k-quant halves of the above (repack_k.cpp, repack_gemm_k.cpp).
void repack_panel_k(DType base, const uint8_t* src, int64_t row_stride, int64_t nb, uint8_t* dst);
void prepare_packed_x_k(DType base, const void* xblocks, int64_t K, uint8_t* dst);
PackedGemmFn packed_gemm_k(DType base, bool reference);

}  // namespace vllmx
