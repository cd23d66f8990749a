// The packed weight layout (repack.h): dtype mapping, the repack_weight op and the activation
// preparation the packed kernels read. The kernels themselves are in repack_gemm.cpp (scalar
// twins) and arch/x86/repack_gemm.cpp.
#include "repack/repack.h"

#include <cstring>
#include <string>

#include "core/half.h"
#include "core/op_table.h"
#include "quant/quant.h"
#include "repack/arch/arch.h"

namespace vllmx {

DType packed_dtype(DType base) {
  switch (base) {
    case DType::Q4_0: return DType::Q4_0_X16;
    case DType::Q4_1: return DType::Q4_1_X16;
    case DType::Q5_0: return DType::Q5_0_X16;
    case DType::Q5_1: return DType::Q5_1_X16;
    case DType::Q8_0: return DType::Q8_0_X16;
    case DType::Q4_K: return DType::Q4_K_X16;
    case DType::Q5_K: return DType::Q5_K_X16;
    case DType::Q6_K: return DType::Q6_K_X16;
    case DType::F32: return DType::F32_X16;
    case DType::F16: return DType::F16_X16;
    case DType::BF16: return DType::BF16_X16;
    default: return kNotPacked;
  }
}

DType packed_base(DType t) {
  switch (t) {
    case DType::Q4_0_X16: return DType::Q4_0;
    case DType::Q4_1_X16: return DType::Q4_1;
    case DType::Q5_0_X16: return DType::Q5_0;
    case DType::Q5_1_X16: return DType::Q5_1;
    case DType::Q8_0_X16: return DType::Q8_0;
    case DType::Q4_K_X16: return DType::Q4_K;
    case DType::Q5_K_X16: return DType::Q5_K;
    case DType::Q6_K_X16: return DType::Q6_K;
    case DType::F32_X16: return DType::F32;
    case DType::F16_X16: return DType::F16;
    case DType::BF16_X16: return DType::BF16;
    default: return kNotPacked;
  }
}

bool packed_is_fast(DType base) {
  // Where the arch layer has no kernel for the packed layout (on x86: below AVX2; f32: below
  // AVX-512) the scalar twin would run, slower than the row-wise kernels.
  if (base == DType::F32 || base == DType::F16 || base == DType::BF16)
    return dense_panel_is_fast();
  return arch_packed_gemm(base) != nullptr || arch_packed_gemm_k(base) != nullptr;
}

namespace {

// Block parts of the base types (each block struct starts with its f16 d).
struct BaseLayout {
  int64_t type_size, qs_off, qh_off, m_off;  // qh_off / m_off < 0: none
  bool q8;
};
BaseLayout base_layout(DType base) {
  switch (base) {
    case DType::Q4_0: return {18, 2, -1, -1, false};
    case DType::Q4_1: return {20, 4, -1, 2, false};
    case DType::Q5_0: return {22, 6, 2, -1, false};
    case DType::Q5_1: return {24, 8, 4, 2, false};
    default: return {34, 2, -1, -1, true};  // Q8_0
  }
}

// Repacks 16 rows (src, ws bytes apart) of nb blocks into one panel (layout in repack.h).
void repack_panel(const BaseLayout& L, const uint8_t* src, int64_t ws, int64_t nb, uint8_t* dst) {
  const int64_t qsb = L.q8 ? 512 : 256;
  uint8_t* qs = dst;
  uint8_t* qh = dst + nb * qsb;
  uint8_t* d = qh + (L.qh_off >= 0 ? nb * 64 : 0);
  uint8_t* m = d + nb * 32;
  const int chunks = L.q8 ? 8 : 4;
  for (int64_t b = 0; b < nb; ++b) {
    uint64_t masks[8] = {};
    for (int r = 0; r < kPackRows; ++r) {
      const uint8_t* blk = src + r * ws + b * L.type_size;
      for (int c = 0; c < chunks; ++c) {
        uint8_t* o = qs + b * qsb + 64 * c + 4 * r;
        std::memcpy(o, blk + L.qs_off + 4 * c, 4);
        if (L.q8)
          for (int i = 0; i < 4; ++i) o[i] ^= 0x80;  // q + 128
      }
      if (L.qh_off >= 0) {
        uint32_t h;
        std::memcpy(&h, blk + L.qh_off, 4);
        for (int c = 0; c < 4; ++c)
          for (int i = 0; i < 4; ++i) {
            masks[2 * c] |= static_cast<uint64_t>((h >> (4 * c + i)) & 1) << (4 * r + i);
            masks[2 * c + 1] |= static_cast<uint64_t>((h >> (16 + 4 * c + i)) & 1) << (4 * r + i);
          }
      }
      std::memcpy(d + b * 32 + 2 * r, blk, 2);
      if (L.m_off >= 0) std::memcpy(m + b * 32 + 2 * r, blk + L.m_off, 2);
    }
    if (L.qh_off >= 0)
      for (int k = 0; k < 8; ++k) {
        const uint64_t v = masks[k];
        for (int j = 0; j < 8; ++j) qh[b * 64 + 8 * k + j] = static_cast<uint8_t>(v >> (8 * j));
      }
  }
}

// A dense weight (elements of type E) into its *_X16 panels (layout in repack.h).
template <typename E>
void repack_dense(const E* src, int64_t N, int64_t K, E* dst) {
  const int64_t panels = N / kPackRows;
#pragma omp parallel for schedule(static) if (N * K > (1 << 18))
  for (int64_t p = 0; p < panels; ++p) {
    const E* s = src + p * kPackRows * K;
    E* d = dst + p * kPackRows * K;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t r = 0; r < kPackRows; ++r) d[k * kPackRows + r] = s[r * K + k];
  }
  const int64_t done = panels * kPackRows * K;
  std::memcpy(dst + done, src + done, static_cast<size_t>(N * K - done) * sizeof(E));
}

}  // namespace

void repack_weight(const Tensor& out, const Tensor& w) {
  const char* op = "repack_weight";
  VLLMX_CHECK(out.defined() && w.defined(), op, "missing tensor");
  const DType pt = packed_dtype(w.dtype);
  if (pt == kNotPacked)
    fail(op, std::string("no packed layout for ") + w.str() +
                 "; only F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K weights");
  check_ndim(w, 2, op, "w");
  if (out.dtype != pt || out.ndim != 2 || out.shape[0] != w.shape[0] ||
      out.shape[1] != w.shape[1])
    fail(op, "out " + out.str() + " must be " + dtype_name(pt) + "[" +
                 std::to_string(w.shape[0]) + ", " + std::to_string(w.shape[1]) + "] for w " +
                 w.str());
  const int64_t N = w.shape[0], K = w.shape[1], nb = K / type_traits(w.dtype).block_size;
  const int64_t rb = row_bytes(w.dtype, K);
  if (!is_quantized(w.dtype)) {  // f32 / f16 / bf16; strides in elements
    VLLMX_CHECK(N <= 1 || (w.stride[0] == K && out.stride[0] == K), op,
          "w " + w.str() + " and out must have contiguous rows");
    if (w.dtype == DType::F32)
      repack_dense(static_cast<const float*>(w.data), N, K, static_cast<float*>(out.data));
    else
      repack_dense(static_cast<const uint16_t*>(w.data), N, K, static_cast<uint16_t*>(out.data));
    return;
  }
  VLLMX_CHECK(N <= 1 || (w.stride[0] == rb && out.stride[0] == rb), op,
        "w " + w.str() + " and out must have contiguous rows");
  const BaseLayout L = base_layout(w.dtype);
  const bool kq = is_k_quant(w.dtype);
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  uint8_t* dst = static_cast<uint8_t*>(out.data);
  const int64_t panels = N / kPackRows;
#pragma omp parallel for schedule(static) if (N * rb > (1 << 20))
  for (int64_t p = 0; p < panels; ++p) {
    const uint8_t* s = src + p * kPackRows * rb;
    uint8_t* d = dst + p * kPackRows * rb;
    if (kq) repack_panel_k(w.dtype, s, rb, nb, d);
    else repack_panel(L, s, rb, nb, d);
  }
  const int64_t done = panels * kPackRows * rb;
  std::memcpy(dst + done, src + done, static_cast<size_t>(N * rb - done));  // tail rows as is
}

bool can_unpack_row(DType t) {
  const DType base = packed_base(t);
  return base == DType::Q8_0 || base == DType::F32 || base == DType::F16 || base == DType::BF16;
}

void unpack_row(DType t, const void* data, int64_t N, int64_t K, int64_t row, void* dst) {
  const DType base = packed_base(t);
  const int64_t rb = row_bytes(base, K);
  const uint8_t* src = static_cast<const uint8_t*>(data);
  uint8_t* out = static_cast<uint8_t*>(dst);
  if (row >= N / kPackRows * kPackRows) {  // past the last whole panel: stored as it was
    std::memcpy(out, src + row * rb, static_cast<size_t>(rb));
    return;
  }
  const uint8_t* panel = src + row / kPackRows * kPackRows * rb;
  const int64_t r = row % kPackRows;
  if (!is_quantized(base)) {  // element k of the panel's rows at k * 16 + r
    const int64_t esz = type_traits(base).type_size;
    for (int64_t k = 0; k < K; ++k)
      std::memcpy(out + k * esz, panel + (k * kPackRows + r) * esz, static_cast<size_t>(esz));
    return;
  }
  // Q8_0, repack_panel undone: block b's chunk c holds row r's qs[4c .. 4c + 3] at 4r, as
  // q + 128; the panel's d follow its qs, 16 a block.
  const BaseLayout L = base_layout(DType::Q8_0);
  const int64_t nb = K / 32, qsb = 512;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = out + b * L.type_size;
    std::memcpy(blk, panel + nb * qsb + b * 32 + 2 * r, 2);
    for (int c = 0; c < 8; ++c)
      for (int i = 0; i < 4; ++i)
        blk[L.qs_off + 4 * c + i] = panel[b * qsb + 64 * c + 4 * r + i] ^ 0x80;
  }
}

void prepare_packed_x(DType base, const void* xblocks, int64_t K, uint8_t* dst) {
  if (is_k_quant(base)) return prepare_packed_x_k(base, xblocks, K, dst);
  const int64_t nb = K / 32;
  int8_t* qs = reinterpret_cast<int8_t*>(dst);
  float* dx = reinterpret_cast<float*>(dst + K);
  uint8_t* cx = dst + K + 4 * nb;
  if (base == DType::Q4_1 || base == DType::Q5_1) {
    const block_q8_1* x = static_cast<const block_q8_1*>(xblocks);
    for (int64_t b = 0; b < nb; ++b) {
      std::memcpy(qs + 32 * b, x[b].qs, 32);
      dx[b] = f16_to_f32(x[b].d);
      const float s = f16_to_f32(x[b].s);
      std::memcpy(cx + 4 * b, &s, 4);
    }
    return;
  }
  const int32_t off = base == DType::Q4_0 ? 8 : base == DType::Q5_0 ? 16 : 128;
  const block_q8_0* x = static_cast<const block_q8_0*>(xblocks);
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(qs + 32 * b, x[b].qs, 32);
    dx[b] = f16_to_f32(x[b].d);
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) sum += x[b].qs[j];
    const int32_t c = off * sum;
    std::memcpy(cx + 4 * b, &c, 4);
  }
}

VLLMX_KERNEL(repack_weight, kCPU, repack_weight);

}  // namespace vllmx
