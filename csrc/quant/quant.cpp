// GGUF block types: dequantization (bit-exact with gguf.quants), activation quantization
// (llama.cpp's reference rounding), the per-type kernel table, and the dequantize / quantize ops.
//
// No floating-point contraction in this file: `d * q + m` must round twice, as numpy does, and
// the SIMD rounding trick below needs a separately rounded product.
#include "core/kernel_pragmas.h"

#include "quant/quant.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/cpu_features.h"
#include "core/half.h"
#include "core/op_table.h"
#include "quant/quant_iq.h"
#include "quant/quant_k.h"
#include "quant/quant_nl.h"
#include "quant/quant_tq.h"

#if VLLMX_X86
#include <immintrin.h>
#endif

namespace vllmx {

namespace {

inline float f16(uint16_t h) { return f16_to_f32(h); }
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

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

#if VLLMX_X86
// roundf (half away from zero) of |v| < 2^23: trunc(v + copysign(0.5 - 2^-25, v)) (the sum's own
// rounding carries exact halves up). Returns the block's int8 values and their sum.
VLLMX_TARGET_AVX512 inline int quantize_block_q8_avx512(const float* x, int8_t* qs, float* d_out) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 m = _mm512_max_ps(_mm512_and_ps(a, absmask), _mm512_and_ps(b, absmask));
  const float amax = _mm512_reduce_max_ps(m);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m512 vid = _mm512_set1_ps(id);
  const __m512 half = _mm512_set1_ps(0.49999997f);
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0x80000000u)));
  __m512 va = _mm512_mul_ps(a, vid), vb = _mm512_mul_ps(b, vid);
  va = _mm512_add_ps(va, _mm512_or_ps(half, _mm512_and_ps(va, sign)));
  vb = _mm512_add_ps(vb, _mm512_or_ps(half, _mm512_and_ps(vb, sign)));
  const __m512i ia = _mm512_cvttps_epi32(va), ib = _mm512_cvttps_epi32(vb);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(ia));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(ib));
  *d_out = d;
  return _mm512_reduce_add_epi32(_mm512_add_epi32(ia, ib));
}

VLLMX_TARGET_AVX512 void quantize_row_q8_0_avx512(const float* x, void* vy, int64_t n) {
  block_q8_0* y = static_cast<block_q8_0*>(vy);
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    float d;
    quantize_block_q8_avx512(x + i * QK8_0, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
  }
}
VLLMX_TARGET_AVX512 void quantize_row_q8_1_avx512(const float* x, void* vy, int64_t n) {
  block_q8_1* y = static_cast<block_q8_1*>(vy);
  for (int64_t i = 0; i < n / QK8_1; ++i) {
    float d;
    const int sum = quantize_block_q8_avx512(x + i * QK8_1, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
    y[i].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}

VLLMX_TARGET_AVX2 inline int quantize_block_q8_avx2(const float* x, int8_t* qs, float* d_out) {
  __m256 v[4];
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    m = _mm256_max_ps(m, _mm256_and_ps(v[k], absmask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  const __m256 half = _mm256_set1_ps(0.49999997f);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  __m256i iv[4];
  for (int k = 0; k < 4; ++k) {
    __m256 t = _mm256_mul_ps(v[k], vid);
    t = _mm256_add_ps(t, _mm256_or_ps(half, _mm256_and_ps(t, sign)));
    iv[k] = _mm256_cvttps_epi32(t);
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
  // pack 32 x i32 -> 32 x i8 in order
  const __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]);  // lanes interleaved by 128-bit halves
  const __m256i p23 = _mm256_packs_epi32(iv[2], iv[3]);
  __m256i p = _mm256_packs_epi16(p01, p23);
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), p);
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  *d_out = d;
  return _mm_cvtsi128_si32(s4);
}
VLLMX_TARGET_AVX2 void quantize_row_q8_0_avx2(const float* x, void* vy, int64_t n) {
  block_q8_0* y = static_cast<block_q8_0*>(vy);
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    float d;
    quantize_block_q8_avx2(x + i * QK8_0, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
  }
}
VLLMX_TARGET_AVX2 void quantize_row_q8_1_avx2(const float* x, void* vy, int64_t n) {
  block_q8_1* y = static_cast<block_q8_1*>(vy);
  for (int64_t i = 0; i < n / QK8_1; ++i) {
    float d;
    const int sum = quantize_block_q8_avx2(x + i * QK8_1, y[i].qs, &d);
    y[i].d = f32_to_f16(d);
    y[i].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}
#endif

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

void quantize_row_q8_0(const float* x, void* y, int64_t n) {
#if VLLMX_X86
  static const FromFloatFn fn = simd_level() >= 2   ? quantize_row_q8_0_avx512
                                : simd_level() >= 1 ? quantize_row_q8_0_avx2
                                                    : quantize_row_q8_0_ref;
  fn(x, y, n);
#else
  quantize_row_q8_0_ref(x, y, n);
#endif
}
void quantize_row_q8_1(const float* x, void* y, int64_t n) {
#if VLLMX_X86
  static const FromFloatFn fn = simd_level() >= 2   ? quantize_row_q8_1_avx512
                                : simd_level() >= 1 ? quantize_row_q8_1_avx2
                                                    : quantize_row_q8_1_ref;
  fn(x, y, n);
#else
  quantize_row_q8_1_ref(x, y, n);
#endif
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
