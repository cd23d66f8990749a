// GGUF block types: dequantization (bit-exact with gguf.quants), activation quantization
// (llama.cpp's reference rounding; the SIMD rows with the same bits are in arch/x86/quant.cpp),
// the per-type kernel table, and the dequantize / quantize ops.
//
// No floating-point contraction in this file: `d * q + m` must round twice, as numpy does.
#include "core/kernel_pragmas.h"

#include "quant/quant.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/half.h"
#include "core/op_table.h"
#include "quant/arch/arch.h"
#include "quant/quant_iq.h"
#include "quant/quant_k.h"
#include "quant/quant_nl.h"
#include "quant/quant_tq.h"

namespace vllmx {

namespace {

inline float f16(uint16_t h) { return f16_to_f32(h); }

// ---- to_float (scalar; written so the compiler vectorizes the inner loops) ----

void to_float_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void to_float_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}
void to_float_bf16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}

void to_float_q4_0(const void* src, float* dst, int64_t n) {
  const block_q4_0* b = static_cast<const block_q4_0*>(src);
  for (int64_t i = 0; i < n / QK4_0; ++i, dst += QK4_0) {
    const float d = f16(b[i].d);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((b[i].qs[j] & 0x0F) - 8);
      dst[j + 16] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}
void to_float_q4_1(const void* src, float* dst, int64_t n) {
  const block_q4_1* b = static_cast<const block_q4_1*>(src);
  for (int64_t i = 0; i < n / QK4_1; ++i, dst += QK4_1) {
    const float d = f16(b[i].d), m = f16(b[i].m);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(b[i].qs[j] & 0x0F) + m;
      dst[j + 16] = d * static_cast<float>(b[i].qs[j] >> 4) + m;
    }
  }
}
void to_float_q5_0(const void* src, float* dst, int64_t n) {
  const block_q5_0* b = static_cast<const block_q5_0*>(src);
  for (int64_t i = 0; i < n / QK5_0; ++i, dst += QK5_0) {
    const float d = f16(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int q0 = (b[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
      const int q1 = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      dst[j] = d * static_cast<float>(q0 - 16);
      dst[j + 16] = d * static_cast<float>(q1 - 16);
    }
  }
}
void to_float_q5_1(const void* src, float* dst, int64_t n) {
  const block_q5_1* b = static_cast<const block_q5_1*>(src);
  for (int64_t i = 0; i < n / QK5_1; ++i, dst += QK5_1) {
    const float d = f16(b[i].d), m = f16(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int q0 = (b[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
      const int q1 = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      dst[j] = d * static_cast<float>(q0) + m;
      dst[j + 16] = d * static_cast<float>(q1) + m;
    }
  }
}
void to_float_q8_0(const void* src, float* dst, int64_t n) {
  const block_q8_0* b = static_cast<const block_q8_0*>(src);
  for (int64_t i = 0; i < n / QK8_0; ++i, dst += QK8_0) {
    const float d = f16(b[i].d);
    for (int j = 0; j < QK8_0; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}
void to_float_q8_1(const void* src, float* dst, int64_t n) {
  const block_q8_1* b = static_cast<const block_q8_1*>(src);
  for (int64_t i = 0; i < n / QK8_1; ++i, dst += QK8_1) {
    const float d = f16(b[i].d);
    for (int j = 0; j < QK8_1; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// ---- activation quantization ----

// One block: d = amax / 127, q = roundf(x * (1 / d)); returns sum(q).
inline int quantize_block_q8_ref(const float* x, int8_t* qs, float* d_out) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    const int q = static_cast<int>(std::roundf(x[j] * id));
    qs[j] = static_cast<int8_t>(q);
    sum += q;
  }
  *d_out = d;
  return sum;
}

}  // namespace

void quantize_row_q8_0_ref(const float* x, void* vy, int64_t n) {
  block_q8_0* y = static_cast<block_q8_0*>(vy);
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    float d;
    quantize_block_q8_ref(x + i * QK8_0, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
  }
}
void quantize_row_q8_1_ref(const float* x, void* vy, int64_t n) {
  block_q8_1* y = static_cast<block_q8_1*>(vy);
  for (int64_t i = 0; i < n / QK8_1; ++i) {
    float d;
    const int sum = quantize_block_q8_ref(x + i * QK8_1, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
    y[i].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}

namespace {
// The arch layer's row quantizer for t, else the scalar reference (picked once per type).
FromFloatFn fastest(DType t, FromFloatFn ref) {
  const FromFloatFn fast = arch_quantize_row(t);
  return fast ? fast : ref;
}
}  // namespace

void quantize_row_q8_0(const float* x, void* y, int64_t n) {
  static const FromFloatFn fn = fastest(DType::Q8_0, quantize_row_q8_0_ref);
  fn(x, y, n);
}
void quantize_row_q8_1(const float* x, void* y, int64_t n) {
  static const FromFloatFn fn = fastest(DType::Q8_1, quantize_row_q8_1_ref);
  fn(x, y, n);
}

// ---- the table ----

namespace {
struct QuantTable {
  QuantTraits t[kMaxDType];
  QuantTable() {
    auto set = [&](DType d, ToFloatFn tf, FromFloatFn ff, FromFloatFn ffr, VecDotFn vd,
                   VecDotFn vdr, DType vdt) {
      QuantTraits& q = t[static_cast<int>(d)];
      q.to_float = tf;
      q.from_float = ff;
      q.from_float_ref = ffr;
      q.vec_dot = vd;
      q.vec_dot_ref = vdr;
      q.vec_dot_type = vdt;
      q.vec_dot_rows = select_vec_dot_rows(d);
    };
    set(DType::Q4_0, to_float_q4_0, nullptr, nullptr, select_vec_dot(DType::Q4_0),
        vec_dot_q4_0_q8_0_ref, DType::Q8_0);
    set(DType::Q4_1, to_float_q4_1, nullptr, nullptr, select_vec_dot(DType::Q4_1),
        vec_dot_q4_1_q8_1_ref, DType::Q8_1);
    set(DType::Q5_0, to_float_q5_0, nullptr, nullptr, select_vec_dot(DType::Q5_0),
        vec_dot_q5_0_q8_0_ref, DType::Q8_0);
    set(DType::Q5_1, to_float_q5_1, nullptr, nullptr, select_vec_dot(DType::Q5_1),
        vec_dot_q5_1_q8_1_ref, DType::Q8_1);
    set(DType::Q8_0, to_float_q8_0, quantize_row_q8_0, quantize_row_q8_0_ref,
        select_vec_dot(DType::Q8_0), vec_dot_q8_0_q8_0_ref, DType::Q8_0);
    set(DType::Q8_1, to_float_q8_1, quantize_row_q8_1, quantize_row_q8_1_ref, nullptr, nullptr,
        DType::Q8_1);
    set(DType::Q2_K, dequantize_row_q2_K, nullptr, nullptr, select_vec_dot(DType::Q2_K),
        vec_dot_q2_K_q8_K_ref, DType::Q8_K);
    set(DType::Q3_K, dequantize_row_q3_K, nullptr, nullptr, select_vec_dot(DType::Q3_K),
        vec_dot_q3_K_q8_K_ref, DType::Q8_K);
    set(DType::Q4_K, dequantize_row_q4_K, nullptr, nullptr, select_vec_dot(DType::Q4_K),
        vec_dot_q4_K_q8_K_ref, DType::Q8_K);
    set(DType::Q5_K, dequantize_row_q5_K, nullptr, nullptr, select_vec_dot(DType::Q5_K),
        vec_dot_q5_K_q8_K_ref, DType::Q8_K);
    set(DType::Q6_K, dequantize_row_q6_K, nullptr, nullptr, select_vec_dot(DType::Q6_K),
        vec_dot_q6_K_q8_K_ref, DType::Q8_K);
    set(DType::Q8_K, dequantize_row_q8_K, quantize_row_q8_K, quantize_row_q8_K_ref, nullptr,
        nullptr, DType::Q8_K);
    register_quant_nl(t);  // IQ4_NL, IQ4_XS, MXFP4
    register_quant_tq(t);  // TQ1_0, TQ2_0
    register_quant_fp8(t);  // F8_E4M3_B128 (dequantization only: the GPU's weights)
    // IQ1/IQ2/IQ3 i-quants (quant_iq.h): each family picks its own SIMD kernels
    for (DType d : {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S,
                    DType::IQ1_S, DType::IQ1_M}) {
      IqKernels k;
      if (!iq2_kernels(d, &k) && !iq3_kernels(d, &k) && !iq1_kernels(d, &k)) continue;
      set(d, k.to_float, nullptr, nullptr, k.vec_dot, k.vec_dot_ref, DType::Q8_K);
      t[static_cast<int>(d)].vec_dot_rows = k.vec_dot_rows;
    }
  }
};
}  // namespace

const QuantTraits* quant_traits(DType t) {
  static const QuantTable table;
  const int i = static_cast<int>(t);
  if (i < 0 || i >= kMaxDType || table.t[i].to_float == nullptr) return nullptr;
  return &table.t[i];
}

namespace {
ToFloatFn row_converter(DType t, const char* op) {
  switch (t) {
    case DType::F32: return to_float_f32;
    case DType::F16: return to_float_f16;
    case DType::BF16: return to_float_bf16;
    default: break;
  }
  const QuantTraits* q = quant_traits(t);
  if (q == nullptr)
    fail(op, std::string("unsupported dtype ") + dtype_name(t) + " (id " +
                 std::to_string(static_cast<int>(t)) + ")");
  return q->to_float;
}

// Bytes between consecutive rows of a tensor viewed as [rows, last dim].
int64_t row_step_bytes(const Tensor& t) {
  if (t.ndim < 2) return 0;
  if (is_quantized(t.dtype)) return t.stride[t.ndim - 2];
  return t.stride[t.ndim - 2] * type_traits(t.dtype).type_size;
}
}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t bs = type_traits(t).block_size;
  ToFloatFn fn = row_converter(t, "dequantize_row");
  if (n % bs != 0)
    fail("dequantize_row", std::string(dtype_name(t)) + " row of " + std::to_string(n) +
                               " elements is not a multiple of the block size " +
                               std::to_string(bs));
  fn(src, dst, n);
}

// ---- ops ----

void dequantize(const Tensor& out, const Tensor& src, bool reference) {
  const char* op = "dequantize";
  VLLMX_CHECK(src.defined() && out.defined(), op, "missing tensor");
  ToFloatFn fn = row_converter(src.dtype, op);
  check_dtype(out, DType::F32, op, "out");
  VLLMX_CHECK(src.ndim >= 1, op, "src must have at least 1 dim, got " + src.str());
  VLLMX_CHECK(out.numel() == src.numel(),
        op, "out " + out.str() + " and src " + src.str() + " differ in element count");
  const int64_t n = src.size(-1);
  const int64_t bs = type_traits(src.dtype).block_size;
  VLLMX_CHECK(n % bs == 0, op, "src " + src.str() + ": last dim is not a multiple of the block size");
  const int64_t rows = n == 0 ? 0 : src.numel() / n;
  const int64_t step = row_step_bytes(src);
  const uint8_t* s = static_cast<const uint8_t*>(src.data);
  float* o = out.ptr<float>();
  if (reference) {
    for (int64_t r = 0; r < rows; ++r) fn(s + r * step, o + r * n, n);
    return;
  }
#pragma omp parallel for schedule(static) if (rows * n > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) fn(s + r * step, o + r * n, n);
}

void quantize(const Tensor& out, const Tensor& src, bool reference) {
  const char* op = "quantize";
  VLLMX_CHECK(src.defined() && out.defined(), op, "missing tensor");
  check_dtype(src, DType::F32, op, "src");
  if (out.dtype != DType::Q8_0 && out.dtype != DType::Q8_1 && out.dtype != DType::Q8_K)
    fail(op, std::string("unsupported output dtype ") + dtype_name(out.dtype) + " (id " +
                 std::to_string(static_cast<int>(out.dtype)) + "); only Q8_0, Q8_1 and Q8_K");
  VLLMX_CHECK(src.ndim >= 1 && out.ndim == src.ndim, op,
        "out " + out.str() + " and src " + src.str() + " differ in shape");
  for (int i = 0; i < src.ndim; ++i)
    VLLMX_CHECK(out.shape[i] == src.shape[i], op,
          "out " + out.str() + " and src " + src.str() + " differ in shape");
  const int64_t n = src.size(-1);
  const int64_t bs = type_traits(out.dtype).block_size;
  VLLMX_CHECK(n % bs == 0, op,
        "src " + src.str() + ": last dim is not a multiple of " + std::to_string(bs));
  const QuantTraits* q = quant_traits(out.dtype);
  FromFloatFn fn = reference ? q->from_float_ref : q->from_float;
  const int64_t rows = n == 0 ? 0 : src.numel() / n;
  const int64_t ostep = row_step_bytes(out);
  const int64_t sstep = src.ndim >= 2 ? src.stride[src.ndim - 2] : 0;
  uint8_t* o = static_cast<uint8_t*>(out.data);
  const float* s = src.ptr<float>();
  if (reference) {
    for (int64_t r = 0; r < rows; ++r) fn(s + r * sstep, o + r * ostep, n);
    return;
  }
#pragma omp parallel for schedule(static) if (rows * n > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) fn(s + r * sstep, o + r * ostep, n);
}

VLLMX_KERNEL(dequantize, kCPU, dequantize);
VLLMX_KERNEL(quantize, kCPU, quantize);

}  // namespace vllmx
