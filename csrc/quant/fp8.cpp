// fp8 e4m3 on the CPU: per_token_group_quant_fp8, scaled_mm and fp8_linear (the two in a row;
// contracts in csrc/ops.def), the scalar twins of cuda/fp8.cu: the same scales and codes bit
// for bit (f32 division, round to nearest even), and scaled_mm's sums in the order a reference
// reads plainly (each group's dot, exact in f32 or, as the reference, in double, scaled, then
// summed over the groups).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/op_table.h"
#include "core/tensor.h"
#include "layers/cpu_kernels.h"
#include "quant/quant.h"

namespace vllmx {

namespace {

constexpr int kGroup = 128;
constexpr float kFp8Max = 448.f;
constexpr float kMinAmax = 1e-10f;  // vLLM's eps: an all-zero group gets a tiny scale, not 0

// OCP E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
// (m / 8 * 2^-6); 0x7f / 0xff are NaN, there are no infinities.
float e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 0xF, m = code & 7;
  if (e == 0xF && m == 7) return NAN;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                         : std::ldexp(static_cast<float>(8 + m), e - 10);
  return code & 0x80 ? -v : v;
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int c = 0; c < 256; ++c) a[c] = e4m3_value(static_cast<uint8_t>(c));
    return a;
  }();
  return t;
}

// v (finite, |v| <= 448) to the nearest code, ties to the even code (the one whose mantissa's
// last bit is 0): positive codes 0 .. 0x7e increase with their values. The sign is kept, so a
// negative value too small for a subnormal is -0 (0x80), as the GPU's cvt.rn.satfinite gives.
uint8_t e4m3_code(float v) {
  const auto& t = e4m3_table();
  const float a = std::fabs(v);
  int lo = 0, hi = 0x7E;  // t[lo] <= a <= t[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (t[mid] <= a ? lo : hi) = mid;
  }
  const float dlo = a - t[lo], dhi = t[hi] - a;
  const int c = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint8_t>(c | (std::signbit(v) ? 0x80 : 0));
}

// F8_E4M3_B128 rows: blocks of an f32 scale and 128 codes, each value code * scale.
void dequantize_row_f8_b128(const void* src, float* dst, int64_t n) {
  const auto& tab = e4m3_table();
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n / kGroup; ++b, p += 4 + kGroup) {
    float s;
    std::memcpy(&s, p, 4);
    for (int i = 0; i < kGroup; ++i) dst[b * kGroup + i] = tab[p[4 + i]] * s;
  }
}

}  // namespace

void per_token_group_quant_fp8(const Tensor& out_q, const Tensor& out_s, const Tensor& x,
                               bool /*reference: the same arithmetic*/) {
  const int64_t T = x.shape[0], K = x.shape[1], G = K / kGroup;
  const int xd = static_cast<int>(x.dtype);
  float v[kGroup];
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* row_in = static_cast<const uint8_t*>(x.data) +
                            t * x.stride[0] * type_traits(x.dtype).type_size;
    uint8_t* q = out_q.ptr<uint8_t>() + t * out_q.stride[0];
    for (int64_t g = 0; g < G; ++g) {
      float amax = 0.f;
      for (int i = 0; i < kGroup; ++i) {
        v[i] = load_f32(row_in, g * kGroup + i, xd);
        amax = std::max(amax, std::fabs(v[i]));
      }
      const float s = std::max(amax, kMinAmax) / kFp8Max;
      out_s.ptr<float>()[g * T + t] = s;
      for (int i = 0; i < kGroup; ++i)
        q[g * kGroup + i] = e4m3_code(std::clamp(v[i] / s, -kFp8Max, kFp8Max));
    }
  }
}

void scaled_mm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& a_s,
               const Tensor& b_s, const Tensor& bias, bool reference) {
  const int64_t T = a.shape[0], K = a.shape[1], N = b.shape[0], G = K / kGroup;
  const auto& tab = e4m3_table();
  const int od = static_cast<int>(out.dtype);
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* ar = a.ptr<uint8_t>() + t * a.stride[0];
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* br = b.ptr<uint8_t>() + n * b.stride[0];
      double acc_d = 0.0;
      float acc = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        const float sc = a_s.ptr<float>()[g * T + t] * b_s.ptr<float>()[g * N + n];
        double dot = 0.0;
        float dot_f = 0.f;
        for (int64_t k = g * kGroup; k < (g + 1) * kGroup; ++k) {
          if (reference)
            dot += static_cast<double>(tab[ar[k]]) * tab[br[k]];
          else
            dot_f += tab[ar[k]] * tab[br[k]];
        }
        if (reference)
          acc_d += dot * a_s.ptr<float>()[g * T + t] * b_s.ptr<float>()[g * N + n];
        else
          acc += dot_f * sc;
      }
      float y = reference ? static_cast<float>(acc_d) : acc;
      if (bias.defined()) y += load_f32(bias.data, n, od);
      void* o = static_cast<uint8_t*>(out.data) +
                (t * out.stride[0] + n) * type_traits(out.dtype).type_size;
      if (out.dtype == DType::F32)
        *static_cast<float*>(o) = y;
      else if (out.dtype == DType::F16)
        *static_cast<uint16_t*>(o) = f32_to_f16(y);
      else
        *static_cast<uint16_t*>(o) = f32_to_bf16(y);
    }
  }
}

// per_token_group_quant_fp8 into a scratch of this thread's, then scaled_mm: the op's
// definition, run as written.
void fp8_linear(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& w_s,
                const Tensor& bias, bool reference) {
  static thread_local std::vector<uint8_t> codes;
  static thread_local std::vector<float> scales;
  const int64_t T = x.shape[0], K = x.shape[1];
  codes.resize(static_cast<size_t>(T * K));
  scales.resize(static_cast<size_t>(T * K / kGroup));
  Tensor q = f32_matrix(nullptr, T, K);
  q.data = codes.data();
  q.dtype = DType::F8_E4M3;
  const Tensor s = f32_matrix(scales.data(), K / kGroup, T);
  per_token_group_quant_fp8(q, s, x, reference);
  scaled_mm(out, q, w, s, w_s, bias, reference);
}

void register_quant_fp8(QuantTraits* table) {
  table[static_cast<int>(DType::F8_E4M3_B128)].to_float = dequantize_row_f8_b128;
}

VLLMX_KERNEL(per_token_group_quant_fp8, kCPU, per_token_group_quant_fp8);
VLLMX_KERNEL(scaled_mm, kCPU, scaled_mm);
VLLMX_KERNEL(fp8_linear, kCPU, fp8_linear);

}  // namespace vllmx
