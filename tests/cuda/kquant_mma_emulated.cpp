// gemm_skinny_quant.cu's Q4_K / Q5_K and Q6_K stages on the CPU: the warp's 32 threads run kquant_mma.cuh's
// functions in the kernel's loop order, and each mma.sync m16n8k16 is emulated from the
// fragment layouts PTX documents (A: a[0] rows g, k 2t..2t+1; a[1] row g + 8; a[2], a[3] the
// same at k + 8. B: b0 k 2t..2t+1, b1 k 2t+8..2t+9, column g. C: c[0..1] row g, columns 2t,
// 2t + 1; c[2..3] row g + 8), the product summed in f64 and rounded to f32 as the tensor core
// returns it. Built and run by test_kquant_mma.py.
//
// stdin: int32 type (0: Q4_K, 1: Q6_K, 2: Q5_K), int32 bf16 (1: x bf16, 0: f16), int32 T (1..8), then
// 16 rows of one super-block (144 / 210 / 176 bytes), then T x 256 x's 16-bit values. stdout: 16 x T
// float32, out[row][token].
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kquant_mma.cuh"

using namespace vllmx::cuda::kq;

namespace {

float x_value(uint16_t bits, bool bf16) {
  return bf16 ? bits_as_float(uint32_t{bits} << 16) : half_bits_to_float(bits);
}

// One warp-wide mma: d = a . b + c for every thread's fragments.
void mma(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], const float (&c)[32][4],
         bool bf16, float (&d)[32][4]) {
  double A[16][16], B[16][8], C[16][8];
  auto lo = [&](uint32_t r) { return x_value(static_cast<uint16_t>(r & 0xffff), bf16); };
  auto hi = [&](uint32_t r) { return x_value(static_cast<uint16_t>(r >> 16), bf16); };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int r = 0; r < 4; ++r) {
      const int row = g + (r % 2) * 8, k = 2 * t + (r / 2) * 8;
      A[row][k] = lo(a[lane][r]);
      A[row][k + 1] = hi(a[lane][r]);
    }
    for (int r = 0; r < 2; ++r) {
      B[2 * t + 8 * r][g] = lo(b[lane][r]);
      B[2 * t + 8 * r + 1][g] = hi(b[lane][r]);
    }
    for (int e = 0; e < 4; ++e) C[g + (e / 2) * 8][2 * t + e % 2] = c[lane][e];
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e / 2) * 8, col = 2 * t + e % 2;
      double s = C[row][col];
      for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
      d[lane][e] = static_cast<float>(s);
    }
  }
}

uint32_t word(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

struct Warp {
  bool bf16;
  uint32_t magic, ones;
  float off;
  float acc[32][4] = {};
  explicit Warp(bool bf) : bf16(bf) {
    magic = bf ? Codes<true>::kMagic : Codes<false>::kMagic;
    off = bf ? Codes<true>::kOff : Codes<false>::kOff;
    ones = bf ? Codes<true>::kOnes : Codes<false>::kOnes;
  }
  // One sub-block's mmas (1 or 2 a thread: A registers a[i], x's B registers b[i]) and its
  // scales, as the kernel runs them.
  void sub_block(int n, const uint32_t (*a)[32][4], const uint32_t (*b)[32][2],
                 const float (&dl0)[32], const float (&mlp0)[32], const float (&dl1)[32],
                 const float (&mlp1)[32]) {
    uint32_t aones[32][4];
    for (auto& r : aones) r[0] = r[1] = r[2] = r[3] = ones;
    const float zero[32][4] = {};
    float c[32][4], cx[32][4];
    mma(a[0], b[0], zero, bf16, c);
    mma(aones, b[0], zero, bf16, cx);
    for (int i = 1; i < n; ++i) {
      mma(a[i], b[i], c, bf16, c);
      mma(aones, b[i], cx, bf16, cx);
    }
    for (int lane = 0; lane < 32; ++lane)
      scale_acc(acc[lane], c[lane], cx[lane], dl0[lane], mlp0[lane], dl1[lane], mlp1[lane]);
  }
};

uint32_t xword(const std::vector<uint16_t>& xs, int at) {
  uint32_t w;
  std::memcpy(&w, &xs[at], 4);
  return w;
}

// The Q4_K stage (Q5_K: q5, 176-byte blocks with each code's fifth bit in qh): x's rows
// swizzled (kXRow, x_chunk), per 32-byte group j and nibble half the sub-block 2j + hi, two mmas
// (words i = 0, 1 of a thread's 8 bytes).
void q4k(Warp& w, const uint8_t* blk, const std::vector<uint16_t>& x, int T, bool q5) {
  const int bytes = q5 ? 176 : 144, qs_at = q5 ? kQ5kQsAt : 16;
  std::vector<uint16_t> xs(8 * kXRow, 0);
  for (int row = 0; row < T; ++row)
    for (int c = 0; c < 32; ++c)
      std::memcpy(&xs[row * kXRow + x_chunk(row, c) * 8], &x[row * 256 + c * 8], 16);
  for (int j = 0; j < 4; ++j)
    for (int hi = 0; hi < 2; ++hi) {
      const int sb = 2 * j + hi;
      uint32_t a[2][32][4], b[2][32][2];
      float dl0[32], mlp0[32], dl1[32], mlp1[32];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        const uint8_t* w0 = blk + g * bytes;
        const uint8_t* w1 = blk + (g + 8) * bytes;
        const Q4kHead h0(word(w0), word(w0 + 4), word(w0 + 8), word(w0 + 12));
        const Q4kHead h1(word(w1), word(w1 + 4), word(w1 + 8), word(w1 + 12));
        h0.sub(sb, w.off, dl0[lane], mlp0[lane]);
        h1.sub(sb, w.off, dl1[lane], mlp1[lane]);
        for (int i = 0; i < 2; ++i) {
          const uint8_t* q0 = w0 + q4k_qs_offset(j, t, qs_at) + 4 * i;
          const uint8_t* q1 = w1 + q4k_qs_offset(j, t, qs_at) + 4 * i;
          uint32_t c0 = nibbles(word(q0), hi), c1 = nibbles(word(q1), hi);
          if (q5) {
            c0 |= q5k_high_bits(word(w0 + q5k_qh_offset(t) + 4 * i), sb);
            c1 |= q5k_high_bits(word(w1 + q5k_qh_offset(t) + 4 * i), sb);
          }
          afrag(c0, c1, w.magic, a[i][lane]);
          const int at = g * kXRow + x_chunk(g, 4 * sb + t) * 8 + 4 * i;
          b[i][lane][0] = xword(xs, at);
          b[i][lane][1] = xword(xs, at + 2);
        }
      }
      w.sub_block(2, a, b, dl0, mlp0, dl1, mlp1);
    }
}

// The Q6_K stage: x's rows kXRowQ6k long, one mma a 16-element sub-block (hf, qq, l16).
void q6k(Warp& w, const uint8_t* blk, const std::vector<uint16_t>& x, int T) {
  std::vector<uint16_t> xs(8 * kXRowQ6k, 0);
  for (int row = 0; row < T; ++row)
    std::memcpy(&xs[row * kXRowQ6k], &x[row * 256], 512);
  for (int hf = 0; hf < 2; ++hf)
    for (int l16 = 0; l16 < 2; ++l16)
      for (int qq = 0; qq < 4; ++qq) {
        uint32_t a[1][32][4], b[1][32][2];
        float dl0[32], mlp0[32], dl1[32], mlp1[32];
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4;
          const uint8_t* w0 = blk + g * 210;
          const uint8_t* w1 = blk + (g + 8) * 210;
          auto head = [](const uint8_t* p) {
            return Q6kHead(p[208] | (p[209] << 8), word(p + 192), word(p + 196), word(p + 200),
                           word(p + 204));
          };
          head(w0).sub(8 * hf + 2 * qq + l16, w.off, dl0[lane], mlp0[lane]);
          head(w1).sub(8 * hf + 2 * qq + l16, w.off, dl1[lane], mlp1[lane]);
          const int part = qq & 1;
          afrag(q6k_codes(word(w0 + q6k_ql_offset(hf, part, l16, t)),
                          word(w0 + q6k_qh_offset(hf, l16, t)), qq),
                q6k_codes(word(w1 + q6k_ql_offset(hf, part, l16, t)),
                          word(w1 + q6k_qh_offset(hf, l16, t)), qq),
                w.magic, a[0][lane]);
          const int at = g * kXRowQ6k + q6k_x_offset(hf, qq, l16, t);
          b[0][lane][0] = xword(xs, at);
          b[0][lane][1] = xword(xs, at + 2);
        }
        w.sub_block(1, a, b, dl0, mlp0, dl1, mlp1);
      }
}

}  // namespace

int main() {
  int32_t type, bf16_flag, T;
  if (std::fread(&type, 4, 1, stdin) != 1 || std::fread(&bf16_flag, 4, 1, stdin) != 1 ||
      std::fread(&T, 4, 1, stdin) != 1)
    return 1;
  if (T < 1 || T > 8 || type < 0 || type > 2) return 1;
  const int block = type == 0 ? 144 : type == 1 ? 210 : 176;
  std::vector<uint8_t> blocks(16 * block);
  std::vector<uint16_t> x(T * 256);
  if (std::fread(blocks.data(), 1, blocks.size(), stdin) != blocks.size()) return 1;
  if (std::fread(x.data(), 2, x.size(), stdin) != x.size()) return 1;
  Warp w(bf16_flag != 0);
  if (type == 1)
    q6k(w, blocks.data(), x, T);
  else
    q4k(w, blocks.data(), x, T, type == 2);
  std::vector<float> out(16 * T, 0.f);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e / 2) * 8, tok = 2 * t + e % 2;
      if (tok < T) out[row * T + tok] = w.acc[lane][e];
    }
  }
  std::fwrite(out.data(), 4, out.size(), stdout);
  return 0;
}
