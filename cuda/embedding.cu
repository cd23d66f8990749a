// embedding on the GPU: rows of a dense (f32 / f16 / bf16) or GGUF block table (Q8_0, Q4_0,
// Q4_1, the k-quants Q4_K / Q5_K / Q6_K, IQ4_NL / IQ4_XS) gathered by token id and dequantized
// bit-exactly with the CPU's formulas; out-of-range ids give rows of zeros (the ids live on the
// device and cannot be checked without a host sync). Also the f32 cast of the sampler's logits
// (ops.to_float32 gathers rows through it).
#include <algorithm>
#include <type_traits>

#include "core/op_table.h"
#include "cuda_util.cuh"

namespace vllmx::cuda {

namespace {

constexpr int kThreads = 256;

// ---- embedding ----
// One GGUF block element as f32, bit-exact with csrc/quant/quant.cpp (no FMA contraction).
__device__ __forceinline__ float f16_bits(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}
// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block's 12 scale bytes.
__device__ __forceinline__ void scale_min_k4(const uint8_t* q, int j, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

template <int kType>
__device__ __forceinline__ float dequant(const uint8_t* row, int64_t e) {
  if constexpr (kType == static_cast<int>(DType::Q4_K) ||
                kType == static_cast<int>(DType::Q5_K)) {
    constexpr bool k5 = kType == static_cast<int>(DType::Q5_K);
    const uint8_t* blk = row + e / 256 * (k5 ? 176 : 144);
    const int i = static_cast<int>(e % 256), j = i / 32, l = i % 32;
    int sc, m;
    scale_min_k4(blk + 4, j, sc, m);
    const uint8_t qb = blk[(k5 ? 48 : 16) + 32 * (j / 2) + l];
    int q = j % 2 ? qb >> 4 : qb & 0xF;
    if constexpr (k5) q |= ((blk[16 + l] >> j) & 1) << 4;
    return __fsub_rn(__fmul_rn(__fmul_rn(f16_bits(blk), static_cast<float>(sc)),
                               static_cast<float>(q)),
                     __fmul_rn(f16_bits(blk + 2), static_cast<float>(m)));
  }
  if constexpr (kType == static_cast<int>(DType::IQ4_NL) ||
                kType == static_cast<int>(DType::IQ4_XS)) {
    // kvalues_iq4nl (csrc/quant/quant_nl.h); IQ4_XS: d * (6-bit scale - 32) per 32 values.
    constexpr int8_t kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};
    const bool xs = kType == static_cast<int>(DType::IQ4_XS);
    const uint8_t* blk = row + (xs ? e / 256 * 136 : e / 32 * 18);
    const int i = static_cast<int>(xs ? e % 256 : e % 32), ib = i / 32, l = i % 32;
    float dl = f16_bits(blk);
    if (xs) {
      const int lo = (blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
      const int hi = ((blk[2] | (blk[3] << 8)) >> (2 * ib)) & 3;
      dl = __fmul_rn(dl, static_cast<float>((lo | (hi << 4)) - 32));
    }
    const uint8_t qb = blk[(xs ? 8 + 16 * ib : 2) + l % 16];
    return __fmul_rn(dl, static_cast<float>(kv[l < 16 ? qb & 0xF : qb >> 4]));
  }
  if constexpr (kType == static_cast<int>(DType::Q6_K)) {
    const uint8_t* blk = row + e / 256 * 210;
    const int i = static_cast<int>(e % 256), h = i / 128, qt = i % 128 / 32, l = i % 32;
    const uint8_t lb = blk[64 * h + 32 * (qt % 2) + l];
    const int hi = (blk[128 + 32 * h + l] >> (2 * qt)) & 3;
    const int q = ((qt >= 2 ? lb >> 4 : lb & 0xF) | (hi << 4)) - 32;
    const int8_t sc = static_cast<int8_t>(blk[192 + 8 * h + l / 16 + 2 * qt]);
    return __fmul_rn(__fmul_rn(f16_bits(blk + 208), static_cast<float>(sc)),
                     static_cast<float>(q));
  }
  const int64_t b = e / 32;
  const int j = static_cast<int>(e % 32);
  if constexpr (kType == static_cast<int>(DType::Q8_0)) {
    const uint8_t* blk = row + b * 34;
    return __fmul_rn(static_cast<float>(static_cast<int8_t>(blk[2 + j])), f16_bits(blk));
  } else if constexpr (kType == static_cast<int>(DType::Q4_0)) {
    const uint8_t* blk = row + b * 18;
    const int q = j < 16 ? (blk[2 + j] & 0x0F) : (blk[2 + j - 16] >> 4);
    return __fmul_rn(f16_bits(blk), static_cast<float>(q - 8));
  } else {  // Q4_1
    const uint8_t* blk = row + b * 20;
    const int q = j < 16 ? (blk[4 + j] & 0x0F) : (blk[4 + j - 16] >> 4);
    return __fadd_rn(__fmul_rn(f16_bits(blk), static_cast<float>(q)), f16_bits(blk + 2));
  }
}

// grid (rows, column slices): a row as wide as a vocabulary (logits cast to f32 for the
// sampler) is spread over many CTAs, not looped over by one.
__device__ __forceinline__ int64_t col0() {
  return static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t col_step() {
  return static_cast<int64_t>(gridDim.y) * blockDim.x;
}

template <typename To, typename Tt>
__global__ void embedding_dense_kernel(To* out, const int32_t* ids, const Tt* table,
                                       int64_t vocab, int64_t hidden, int64_t table_stride) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  To* o = out + t * hidden;
  if (id < 0 || id >= vocab) {
    for (int64_t i = col0(); i < hidden; i += col_step()) o[i] = from_f32<To>(0.0f);
    return;
  }
  const Tt* row = table + id * table_stride;
  for (int64_t i = col0(); i < hidden; i += col_step()) o[i] = from_f32<To>(to_f32(row[i]));
}

template <typename To, int kType>
__global__ void embedding_quant_kernel(To* out, const int32_t* ids, const uint8_t* table,
                                       int64_t vocab, int64_t hidden, int64_t row_bytes) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  To* o = out + t * hidden;
  if (id < 0 || id >= vocab) {
    for (int64_t i = col0(); i < hidden; i += col_step()) o[i] = from_f32<To>(0.0f);
    return;
  }
  const uint8_t* row = table + id * row_bytes;
  for (int64_t i = col0(); i < hidden; i += col_step()) o[i] = from_f32<To>(dequant<kType>(row, i));
}

}  // namespace

void embedding(const Tensor& out, const Tensor& ids, const Tensor& table) {
  const char* op = "cuda.embedding";
  check_rows(out, op, "out");
  check_on_device(ids, op, "ids");
  check_on_device(table, op, "table");
  check_act(out, op, "out");
  check_dtype(ids, DType::I32, op, "ids");
  check_ndim(ids, 1, op, "ids");
  check_ndim(table, 2, op, "table");
  const int64_t t = ids.shape[0], vocab = table.shape[0], hidden = table.shape[1];
  VLLMX_CHECK(out.ndim == 2 && out.shape[0] == t && out.shape[1] == hidden &&
            (t == 0 || out.stride[0] == hidden),
        op, "out " + out.str() + " must be contiguous [" + std::to_string(t) + ", " +
                std::to_string(hidden) + "] for table " + table.str());
  if (t == 0) return;
  const DType td = table.dtype;
  // About 4 elements per thread; t <= 2^31 rows (grid x), <= 65535 slices (grid y).
  const dim3 grid(static_cast<unsigned>(t),
                  static_cast<unsigned>(std::min<int64_t>(65535, std::max<int64_t>(
                      1, hidden / (4 * kThreads)))));
  dispatch_float(out.dtype, op, [&](auto o) {
    using To = decltype(o);
    To* op_ = out.ptr<To>();
    if (is_float_act(td)) {
      VLLMX_CHECK(table.stride[1] == 1, op, "table " + table.str() + " must be row-major");
      dispatch_float(td, op, [&](auto w) {
        using Tt = decltype(w);
        launch(embedding_dense_kernel<To, Tt>, grid, kThreads, 0, stream(),
            op_, ids.ptr<int32_t>(), table.ptr<Tt>(), vocab, hidden, table.stride[0]);
      });
    } else {
      const int64_t rb = table.stride[0];  // bytes per row of blocks
      VLLMX_CHECK(rb >= row_bytes(td, hidden), op, "table " + table.str() + " rows are too short");
      const uint8_t* tp = table.ptr<uint8_t>();
      const int32_t* ip = ids.ptr<int32_t>();
      auto quant = [&](auto type) {
        launch(embedding_quant_kernel<To, decltype(type)::value>, grid, kThreads, 0, stream(),
               op_, ip, tp, vocab, hidden, rb);
      };
#define VLLMX_EMBED(T) \
  case DType::T: quant(std::integral_constant<int, static_cast<int>(DType::T)>{}); break;
      switch (td) {
        VLLMX_EMBED(Q8_0) VLLMX_EMBED(Q4_0) VLLMX_EMBED(Q4_1) VLLMX_EMBED(Q4_K) VLLMX_EMBED(Q5_K)
        VLLMX_EMBED(Q6_K) VLLMX_EMBED(IQ4_NL) VLLMX_EMBED(IQ4_XS)
#undef VLLMX_EMBED
        default:
          fail(op, std::string("table dtype ") + dtype_name(td) +
                       " is not supported on the GPU (f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q4_K, "
                       "Q5_K, Q6_K, IQ4_NL, IQ4_XS)");
      }
    }
  });
  check_launch("embedding kernel");
}

VLLMX_KERNEL(embedding, kCUDA, embedding);

}  // namespace vllmx::cuda
