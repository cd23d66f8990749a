// Q4_K blocks as m16n8k16 fragments whose scales apply after the product (gemm_skinny_quant.cu's
// Q4_K stage): what each thread of a warp reads of a super-block and of x, the A registers it
// builds from the 4-bit codes, and how a sub-block's product becomes output. Host and device
// code, so that tests/cuda/test_kquant_mma.py checks the mapping on the CPU (an emulated mma
// over these functions against the f64 product of gguf's dequantized weights).
//
// Why: dequantizing each weight to x's dtype before the mma (d * sc * q - dmin * m in f32, then
// rounded and packed) costs ~5 instructions a weight, and at batch 1-8 that work, not the
// memory, limited the quantized skinny GEMM (Q4_K at 0.7-1.0 TB/s of the H200's 4.3). Here the
// code q itself is the A operand: the byte under a magic exponent is off + q exactly (bf16
// 0x43qq = 128 + q, f16 0x64qq = 1024 + q), one byte permute for two weights. Every mma then
// covers 16 elements of one 32-element sub-block, so its f32 result C = sum x (off + q) takes
// the sub-block's scale afterwards:
//   sum x (dl q - ml) = dl C - (off dl + ml) X,   X = sum x,
// with X from one more mma over all-ones A (the same x fragments), so no weight is ever rounded
// to x's dtype. dl = d * sc and ml = dmin * m are the f32 products gguf's dequantization forms.
//
// Thread (g, t) of a warp (g = lane / 4, t = lane % 4) holds rows g and g + 8 of its 16. Per
// 32-byte group j of qs (low nibbles: sub-block 2j, high: 2j + 1) it reads bytes 8t .. 8t + 8
// of each row (two words; word i gives elements 8t + 4i .. 8t + 4i + 3 of both sub-blocks), so
// the quad's four threads cover each sub-block's 32 elements and mma (sub-block, i) takes, as
// k = 2t, 2t + 1, 2t + 8, 2t + 9, the four elements of thread t's word i. x's B fragments are
// the same elements: 8t .. 8t + 8 of the sub-block, one 16-byte load for both words.
#pragma once
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define VLLMX_KQ_FN __host__ __device__ __forceinline__
#else
#define VLLMX_KQ_FN inline
#endif

namespace vllmx::cuda::kq {

VLLMX_KQ_FN uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (uint64_t{y} << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

VLLMX_KQ_FN float bits_as_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

VLLMX_KQ_FN float fma_f32(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

// An f16 (the blocks' d and dmin) as f32.
VLLMX_KQ_FN float half_bits_to_float(uint32_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
#else
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return bits_as_float(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return bits_as_float(sign | ((exp + 112) << 23) | (man << 13));
  const float f = static_cast<float>(man) * 5.9604644775390625e-8f;  // man * 2^-24
  return sign ? -f : f;
#endif
}

// x's dtype, for the magic bytes and the offset they put under each code.
template <bool kBf>
struct Codes {
  static constexpr uint32_t kMagic = kBf ? 0x43434343u : 0x64646464u;  // 128 / 1024 + q
  static constexpr float kOff = kBf ? 128.f : 1024.f;
  static constexpr uint32_t kOnes = kBf ? 0x3F803F80u : 0x3C003C00u;  // 1.0, 1.0
};

// A super-block's d, dmin and 6-bit scales and mins (llama.cpp's get_scale_min_k4, four
// sub-blocks a word, one a byte), from its first 16 bytes as little-endian words.
struct Q4kHead {
  float d, dmin, nd23, ndmin23;  // -d * 2^23, -dmin * 2^23
  uint32_t sc[2], mn[2];         // sub-blocks 0-3, 4-7
  VLLMX_KQ_FN Q4kHead(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3)
      : d(half_bits_to_float(w0 & 0xffffu)), dmin(half_bits_to_float(w0 >> 16)) {
    nd23 = d * -8388608.f;
    ndmin23 = dmin * -8388608.f;
    sc[0] = w1 & 0x3F3F3F3Fu;
    mn[0] = w2 & 0x3F3F3F3Fu;
    sc[1] = (w3 & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
    mn[1] = ((w3 >> 4) & 0x0F0F0F0Fu) | ((w2 >> 2) & 0x30303030u);
  }
  // Sub-block sb's dl = d * sc and off * dl + dmin * m (each f32 product rounded once: the
  // byte under 2^23's exponent is 2^23 + sc, and d * (2^23 + sc) - d * 2^23 is d * sc before
  // the FMA rounds).
  VLLMX_KQ_FN void sub(int sb, float off, float& dl, float& mlp) const {
    const uint32_t sel = 0x7540u | static_cast<uint32_t>(sb % 4);
    dl = fma_f32(d, bits_as_float(byte_perm(sc[sb / 4], 0x4B000000u, sel)), nd23);
    const float ml = fma_f32(dmin, bits_as_float(byte_perm(mn[sb / 4], 0x4B000000u, sel)), ndmin23);
    mlp = fma_f32(off, dl, ml);
  }
};

// Where thread t's 8 bytes of qs group j start in the block (Q5_K: qs_at 48, after qh).
VLLMX_KQ_FN int q4k_qs_offset(int j, int t, int qs_at = 16) { return qs_at + 32 * j + 8 * t; }

// Q5_K (176 bytes: Q4_K's head, qh[32], then Q4_K's qs): element l of sub-block sb has a fifth
// bit, bit sb of qh[l]. Thread t's 8 bytes of qh (16 + 8t) hold it for the 8 elements whose
// codes it reads in every qs group; this puts those bits of a word's 4 elements at bit 4 of
// their bytes.
constexpr int kQ5kQhAt = 16, kQ5kQsAt = 48;
VLLMX_KQ_FN int q5k_qh_offset(int t) { return kQ5kQhAt + 8 * t; }
VLLMX_KQ_FN uint32_t q5k_high_bits(uint32_t qh, int sb) { return ((qh >> sb) & 0x01010101u) << 4; }

// A word's low (hi = 0) or high nibbles, one a byte.
VLLMX_KQ_FN uint32_t nibbles(uint32_t w, int hi) { return (hi ? w >> 4 : w) & 0x0F0F0F0Fu; }

// The A registers of one mma from the four codes (bytes) of row g (c0) and row g + 8 (c1):
// elements 0, 1 as k = 2t, 2t + 1 and 2, 3 as k = 2t + 8, 2t + 9, each off + q.
VLLMX_KQ_FN void afrag(uint32_t c0, uint32_t c1, uint32_t magic, uint32_t (&a)[4]) {
  a[0] = byte_perm(c0, magic, 0x5140u);
  a[1] = byte_perm(c1, magic, 0x5140u);
  a[2] = byte_perm(c0, magic, 0x5342u);
  a[3] = byte_perm(c1, magic, 0x5342u);
}

// x's layout for this stage in shared memory: rows of 256 elements, no padding; a row's 16-byte
// chunk c is stored at c ^ 4 on odd rows, so that the eight threads of a quarter warp (rows g,
// g + 1, chunks 4 sb + t) read eight different bank groups.
constexpr int kXRow = 256;
VLLMX_KQ_FN int x_chunk(int row, int c) { return c ^ ((row & 1) << 2); }

// Q6_K (210-byte super-blocks: ql[128], qh[64], 16 int8 scales, f16 d) likewise, with its
// 16-element sub-blocks one mma each. Element 128 hf + 32 qq + l has its low 4 bits in
// ql[64 hf + 32 (qq & 1) + l] (the high nibble for qq >= 2) and its top 2 in bits 2 qq of
// qh[32 hf + l], scale sc[8 hf + 2 qq + l / 16], value d * sc * (q - 32). Thread t reads, per
// (hf, l16 = l / 16), the words of ql and qh at l = 16 l16 + 4 t (elements 4t .. 4t + 3 of the
// four sub-blocks qq = 0..3 there), and x's 4 elements of each, one 8-byte load.
VLLMX_KQ_FN int q6k_ql_offset(int hf, int part, int l16, int t) {
  return 64 * hf + 32 * part + 16 * l16 + 4 * t;
}
VLLMX_KQ_FN int q6k_qh_offset(int hf, int l16, int t) { return 128 + 32 * hf + 16 * l16 + 4 * t; }
VLLMX_KQ_FN int q6k_x_offset(int hf, int qq, int l16, int t) {
  return 128 * hf + 32 * qq + 16 * l16 + 4 * t;
}
// The four 6-bit codes (bytes) of sub-block qq from the ql word of part qq & 1 and the qh word.
VLLMX_KQ_FN uint32_t q6k_codes(uint32_t ql, uint32_t qh, int qq) {
  return ((qq >= 2 ? ql >> 4 : ql) & 0x0F0F0F0Fu) | (((qh >> (2 * qq)) & 0x03030303u) << 4);
}
// x's rows for Q6_K: 272 elements, so that a half warp's 8-byte loads (rows g .. g + 3, 8 bytes
// at 8t) fall on 32 banks.
constexpr int kXRowQ6k = 272;

// A Q6_K super-block's d and 16 scales (four little-endian words).
struct Q6kHead {
  float d, nd;  // -d * (2^23 + 2^22)
  uint32_t sc[4];
  VLLMX_KQ_FN Q6kHead(uint32_t d_bits, uint32_t s0, uint32_t s1, uint32_t s2, uint32_t s3)
      : d(half_bits_to_float(d_bits)), sc{s0, s1, s2, s3} {
    nd = d * -12582912.f;
  }
  // Sub-block sidx's d * sc (the signed byte under 2^23 + 2^22's exponent, d times that less
  // d times the power, before one rounding) and (off + 32) d sc: the product's offset (off)
  // and Q6_K's own (q - 32).
  VLLMX_KQ_FN void sub(int sidx, float off, float& dl, float& mlp) const {
    const int32_t s = static_cast<int8_t>((sc[sidx / 4] >> (8 * (sidx % 4))) & 0xffu);
    dl = fma_f32(d, bits_as_float(0x4B400000u + static_cast<uint32_t>(s)), nd);
    mlp = dl * (off + 32.f);
  }
};

// A sub-block's products into the output: c (rows g, g + 8 x tokens 2t, 2t + 1) times dl, less
// (off dl + ml) X, row by row in the one order every batch size takes.
VLLMX_KQ_FN void scale_acc(float (&acc)[4], const float (&c)[4], const float (&cx)[4], float dl0,
                           float mlp0, float dl1, float mlp1) {
  acc[0] = fma_f32(-mlp0, cx[0], fma_f32(dl0, c[0], acc[0]));
  acc[1] = fma_f32(-mlp0, cx[1], fma_f32(dl0, c[1], acc[1]));
  acc[2] = fma_f32(-mlp1, cx[2], fma_f32(dl1, c[2], acc[2]));
  acc[3] = fma_f32(-mlp1, cx[3], fma_f32(dl1, c[3], acc[3]));
}

}  // namespace vllmx::cuda::kq
