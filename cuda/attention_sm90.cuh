// Hopper's warpgroup MMAs for the prefill attention kernels on wgmma (sm_90a: cuda/
// attention_prefill_sm90.cu and attention_prefill_ws_sm90.cu): the 128-byte swizzled
// tile layout, its shared-memory descriptors, the instructions by cache dtype and tile width,
// the fences around them, and the Q tile's staging. The instructions are CuTe's wrappers (CUTLASS headers, build-time
// only); the descriptors and layouts are written out here.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "attention.cuh"
#include "cute/arch/mma_sm90_gmma.hpp"

namespace vllmx::cuda::attn::sm90 {

namespace gmma = cute::SM90::GMMA;

// Byte offset of 16-byte chunk c (of D / 8) of row r in a [rows][D] tile stored as wgmma's
// 128-byte swizzle wants it (and a TMA box writes it): D / 64 column blocks of [rows][64
// elements], 128-byte rows, chunk c's slot within a row XORed with the row's index in its 8-row
// (1024-byte) atom.
__device__ __forceinline__ uint32_t swizzled(int r, int c, int rows) {
  return static_cast<uint32_t>(((c >> 3) * rows + r) * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// A shared-memory matrix descriptor for the 128-byte swizzle (layout type 1): start address,
// leading byte offset (MN-major: between 64-element column blocks; K-major: unused, 16), stride
// byte offset (between 8-row atoms: 1024). Addresses in 16-byte units.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         static_cast<uint64_t>(lbo >> 4) << 16 | static_cast<uint64_t>(sbo >> 4) << 32 |
         uint64_t{1} << 62;
}

// 64 x N x 16 with both operands K-major in shared memory (S = Q K^T), and with A from
// registers and B MN-major (O += P V), for the cache dtype KV.
template <typename KV, int N>
struct GmmaSS;
template <>
struct GmmaSS<__nv_bfloat16, 64> {
  using Op = gmma::MMA_64x64x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct GmmaSS<__nv_bfloat16, 128> {
  using Op = gmma::MMA_64x128x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct GmmaSS<__half, 64> {
  using Op = gmma::MMA_64x64x16_F32F16F16_SS<gmma::Major::K, gmma::Major::K>;
};
template <>
struct GmmaSS<__half, 128> {
  using Op = gmma::MMA_64x128x16_F32F16F16_SS<gmma::Major::K, gmma::Major::K>;
};
template <typename KV, int N>
struct GmmaRS;
template <>
struct GmmaRS<__nv_bfloat16, 64> {
  using Op = gmma::MMA_64x64x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>;
};
template <>
struct GmmaRS<__nv_bfloat16, 128> {
  using Op = gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>;
};
template <>
struct GmmaRS<__half, 64> {
  using Op = gmma::MMA_64x64x16_F32F16F16_RS<gmma::Major::K, gmma::Major::MN>;
};
template <>
struct GmmaRS<__half, 128> {
  using Op = gmma::MMA_64x128x16_F32F16F16_RS<gmma::Major::K, gmma::Major::MN>;
};
template <>
struct GmmaRS<__nv_bfloat16, 256> {
  using Op = gmma::MMA_64x256x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>;
};
template <>
struct GmmaRS<__half, 256> {
  using Op = gmma::MMA_64x256x16_F32F16F16_RS<gmma::Major::K, gmma::Major::MN>;
};
// A kernel's two products: S over tiles of BN keys, O over the head size D.
template <typename KV, int BN, int D>
struct Mma {
  using S = typename GmmaSS<KV, BN>::Op;
  using O = typename GmmaRS<KV, D>::Op;
};

// The CuTe wrappers take each accumulator register as its own argument.
template <class Op, int N, size_t... I>
__device__ __forceinline__ void wgmma_ss(uint64_t da, uint64_t db, float (&d)[N],
                                         gmma::ScaleOut sc, std::index_sequence<I...>) {
  Op::fma(da, db, d[I]..., sc);
}
template <class Op, int N, size_t... I>
__device__ __forceinline__ void wgmma_rs(const uint32_t (&a)[4], uint64_t db, float (&d)[N],
                                         std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], db, d[I]..., gmma::ScaleOut::One);
}

// Registers an async MMA writes (or reads) stay where they are across its wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(r[i]);
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) cute::warpgroup_fence_operand(r[i][j]);
}

// This thread's shared-memory writes (cp.async, plain stores) made visible to wgmma, which
// reads shared memory through the async proxy.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// 2^x in one MUFU instruction (exp2f adds range handling the softmax does not need: its
// arguments are <= 0 or -inf, whose 2^x is +0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Query rows f0 .. f0 + ROWS of a CTA's flattened (token, head of kv head g) rows -> rows r0 ..
// of the swizzled Q tile of tile_rows rows, in the cache dtype (the MMA takes one type), by NT
// threads, t this one's index among them; rows at or past R (the sequence's) are zeros.
// kAsync: by cp.async, one committed group (the caller waits on it, then fences the async
// proxy), for q already in the cache dtype.
template <int D, int ROWS, int NT, typename KV, bool kAsync = false>
__device__ __forceinline__ void stage_q(const AttnArgs& a, char* Qs, int tile_rows, int r0,
                                        int f0, int t, int R, int q0, int g) {
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  constexpr bool kKvBf = std::is_same_v<KV, __nv_bfloat16>;
  const int G = a.G;
  const uint16_t* q = static_cast<const uint16_t*>(a.q);
  for (int i = t; i < ROWS * CPR; i += NT) {
    const int r = i / CPR, c = i % CPR, f = f0 + r;
    const int tok = f / G, head = g * G + f % G;
    const uint16_t* src = q + (q0 + tok) * a.q_stride + static_cast<int64_t>(head) * D + c * 8;
    char* dst = Qs + swizzled(r0 + r, c, tile_rows);
    if constexpr (kAsync) {
      cp_async16(dst, f < R ? src : q, f < R);
      continue;
    }
    uint4 v = make_uint4(0, 0, 0, 0);
    if (f < R) {
      v = *reinterpret_cast<const uint4*>(src);
      if (a.q_bf16 != kKvBf) {
        float f8[8];
        unpack8(v, a.q_bf16, f8);
        v = pack8(f8, kKvBf);
      }
    }
    *reinterpret_cast<uint4*>(dst) = v;
  }
  if constexpr (kAsync) cp_async_commit();
}

// The prefill kernels' softmax constants: exp(scale * s) = 2^(s * mul); with a soft cap
// s -> cap * tanh(s * cap_in) first (cap_in = scale / cap), and then mul = log2 e.
struct SoftmaxScale {
  bool softcap;
  float mul, cap_in;
  __device__ __forceinline__ explicit SoftmaxScale(const AttnArgs& a)
      : softcap(a.cap > 0.f),
        mul(softcap ? kLog2e : a.scale * kLog2e),
        cap_in(softcap ? a.scale / a.cap : 0.f) {}
};

// The prefill kernels' softmax over one kBN-key tile of S (wgmma's 64 x kBN accumulators, a
// thread's rows lane / 4 and lane / 4 + 8 of its warp's 16: element i is row (i / 2) % 2, key
// k0 + 8 (i / 4) + 2 (lane % 4) + i % 2). Soft cap first (cap_in = scale / cap), then keys past
// kend, after the row's position pos[h] or before its window's lo[h] to -inf (skipped where
// the CTA-uniform bounds show the whole tile visible); then the online softmax: s becomes
// 2^(s mul - the row's new max), m[h] the new max (in S's units), l[h] the sum after the old
// one times corr, the factor O's row h must take before this tile's P V adds to it:
// rescale(h, corr), called as each row is done.
template <int kBN, int NS, class Rescale>
__device__ __forceinline__ void tile_softmax(float (&s)[NS], const AttnArgs& a,
                                             const SoftmaxScale& sc, int k0, int kend,
                                             int pos_first, int lo_last, const int (&pos)[2],
                                             const int (&lo)[2], int lane, float (&m)[2],
                                             float (&l)[2], const Rescale& rescale) {
  if (sc.softcap) {
#pragma unroll
    for (int i = 0; i < NS; ++i) s[i] = a.cap * tanhf(s[i] * sc.cap_in);
  }
  if (k0 + kBN > kend || k0 + kBN - 1 > pos_first || (a.window > 0 && k0 < lo_last)) {
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int col = k0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2, h = (i / 2) % 2;
      if (!(col < kend && col <= pos[h] && col >= lo[h])) s[i] = -INFINITY;
    }
  }
  // A row's kBN scores sit in the 4 lanes of a quad.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NS / 4; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m[h], mx);
    const float base = mnew == -INFINITY ? 0.f : mnew * sc.mul;  // nothing visible yet: 0
    const float corr = ex2(fmaf(m[h], sc.mul, -base));
    m[h] = mnew;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NS / 4; ++j) {
      s[4 * j + 2 * h] = ex2(fmaf(s[4 * j + 2 * h], sc.mul, -base));
      s[4 * j + 2 * h + 1] = ex2(fmaf(s[4 * j + 2 * h + 1], sc.mul, -base));
      sum += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
    }
    l[h] = l[h] * corr + sum;
    rescale(h, corr);
  }
}

}  // namespace vllmx::cuda::attn::sm90
