// gemm_skinny_quant.cu's Q4_K stage on the CPU: the warp's 32 threads run kquant_mma.cuh's
// functions in the kernel's loop order, and each mma.sync m16n8k16 is emulated from the
// fragment layouts PTX documents (A: a[0] rows g, k 2t..2t+1; a[1] row g + 8; a[2], a[3] the
// same at k + 8. B: b0 k 2t..2t+1, b1 k 2t+8..2t+9, column g. C: c[0..1] row g, columns 2t,
// 2t + 1; c[2..3] row g + 8), the product summed in f64 and rounded to f32 as the tensor core
// returns it. Built and run by test_kquant_mma.py.
//
// stdin: int32 bf16 (1: x bf16, 0: f16), int32 T (1..8), then 16 rows x 144 bytes of Q4_K
// super-blocks, then T x 256 x's 16-bit values. stdout: 16 x T float32, out[row][token].
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

}  // namespace

int main() {
  int32_t bf16_flag, T;
  if (std::fread(&bf16_flag, 4, 1, stdin) != 1 || std::fread(&T, 4, 1, stdin) != 1) return 1;
  if (T < 1 || T > 8) return 1;
  const bool bf16 = bf16_flag != 0;
  std::vector<uint8_t> blocks(16 * 144);
  std::vector<uint16_t> x(T * 256);
  if (std::fread(blocks.data(), 1, blocks.size(), stdin) != blocks.size()) return 1;
  if (std::fread(x.data(), 2, x.size(), stdin) != x.size()) return 1;

  // x as the kernel's shared memory holds it: 8 token rows (zeros past T), chunks swizzled.
  std::vector<uint16_t> xs(8 * kXRow, 0);
  for (int row = 0; row < T; ++row)
    for (int c = 0; c < 32; ++c)
      std::memcpy(&xs[row * kXRow + x_chunk(row, c) * 8], &x[row * 256 + c * 8], 16);

  const uint32_t magic = bf16 ? Codes<true>::kMagic : Codes<false>::kMagic;
  const float off = bf16 ? Codes<true>::kOff : Codes<false>::kOff;
  const uint32_t ones = bf16 ? Codes<true>::kOnes : Codes<false>::kOnes;
  float acc[32][4] = {};
  const uint8_t* blk = blocks.data();
  for (int j = 0; j < 4; ++j) {
    for (int hi = 0; hi < 2; ++hi) {
      const int sb = 2 * j + hi;
      uint32_t a0[32][4], a1[32][4], aones[32][4], b_lo[32][2], b_hi[32][2];
      float dl0[32], mlp0[32], dl1[32], mlp1[32];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        const uint8_t* w0 = blk + g * 144;
        const uint8_t* w1 = blk + (g + 8) * 144;
        const Q4kHead h0(word(w0), word(w0 + 4), word(w0 + 8), word(w0 + 12));
        const Q4kHead h1(word(w1), word(w1 + 4), word(w1 + 8), word(w1 + 12));
        h0.sub(sb, off, dl0[lane], mlp0[lane]);
        h1.sub(sb, off, dl1[lane], mlp1[lane]);
        const uint8_t* q0 = w0 + q4k_qs_offset(j, t);
        const uint8_t* q1 = w1 + q4k_qs_offset(j, t);
        afrag(nibbles(word(q0), hi), nibbles(word(q1), hi), magic, a0[lane]);
        afrag(nibbles(word(q0 + 4), hi), nibbles(word(q1 + 4), hi), magic, a1[lane]);
        for (int r = 0; r < 4; ++r) aones[lane][r] = ones;
        uint32_t xv[4];
        std::memcpy(xv, &xs[g * kXRow + x_chunk(g, 4 * sb + t) * 8], 16);
        b_lo[lane][0] = xv[0], b_lo[lane][1] = xv[1], b_hi[lane][0] = xv[2], b_hi[lane][1] = xv[3];
      }
      const float zero[32][4] = {};
      float c[32][4], cx[32][4];
      mma(a0, b_lo, zero, bf16, c);
      mma(a1, b_hi, c, bf16, c);
      mma(aones, b_lo, zero, bf16, cx);
      mma(aones, b_hi, cx, bf16, cx);
      for (int lane = 0; lane < 32; ++lane)
        scale_acc(acc[lane], c[lane], cx[lane], dl0[lane], mlp0[lane], dl1[lane], mlp1[lane]);
    }
  }
  std::vector<float> out(16 * T, 0.f);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e / 2) * 8, tok = 2 * t + e % 2;
      if (tok < T) out[row * T + tok] = acc[lane][e];
    }
  }
  std::fwrite(out.data(), 4, out.size(), stdout);
  return 0;
}
