// Shared by the linear kernels (linear.cu: GEMM, the generic kernel and ops; linear_plan.cu: the
// plan; gemv.cu: the GEMV): the argument block, how a weight chunk is read, the mma.sync GEMM's
// tiles and the plan. Internal to the CUDA sources.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda_util.cuh"
#include "gemm_sm90.h"
#include "mma.cuh"

namespace vllmx::cuda::lin {

using namespace detail;

// How w is read, relative to x's 16-bit dtype.
enum WKind : int {
  kWSame = 0, kWF16 = 1, kWBF16 = 2, kWQ8_0 = 3, kWQ4_0 = 4, kWQ4_1 = 5,
  kWQ4_K = 6, kWQ5_K = 7, kWQ6_K = 8,  // the k-quants of Q4_K_M / Q5_K_M / Q6_K files
  kWIQ4_NL = 9, kWIQ4_XS = 10           // 4-bit codes into the non-linear kvalues_iq4nl table
};

__host__ __device__ constexpr bool is_quant(int wk) { return wk >= kWQ8_0; }

// The chunk reader of a block-quantized weight dtype, -1 for any other dtype: the one list of
// the block types the CUDA linear takes.
__host__ __device__ constexpr int quant_kind(DType dt) {
  switch (dt) {
    case DType::Q8_0: return kWQ8_0;
    case DType::Q4_0: return kWQ4_0;
    case DType::Q4_1: return kWQ4_1;
    case DType::Q4_K: return kWQ4_K;
    case DType::Q5_K: return kWQ5_K;
    case DType::Q6_K: return kWQ6_K;
    case DType::IQ4_NL: return kWIQ4_NL;
    case DType::IQ4_XS: return kWIQ4_XS;
    default: return -1;
  }
}

// f(std::integral_constant<int, wk>{}) for a block kind wk (is_quant), so that a kernel's
// template is instantiated for each block type from one list.
template <class F>
__host__ __device__ __forceinline__ void visit_quant_kind(int wk, F&& f) {
  switch (wk) {
    case kWQ8_0: f(std::integral_constant<int, kWQ8_0>{}); break;
    case kWQ4_0: f(std::integral_constant<int, kWQ4_0>{}); break;
    case kWQ4_1: f(std::integral_constant<int, kWQ4_1>{}); break;
    case kWQ4_K: f(std::integral_constant<int, kWQ4_K>{}); break;
    case kWQ5_K: f(std::integral_constant<int, kWQ5_K>{}); break;
    case kWQ6_K: f(std::integral_constant<int, kWQ6_K>{}); break;
    case kWIQ4_NL: f(std::integral_constant<int, kWIQ4_NL>{}); break;
    default: f(std::integral_constant<int, kWIQ4_XS>{}); break;
  }
}
__host__ __device__ constexpr int block_bytes(int wk) {
  return wk == kWQ8_0 ? 34 : wk == kWQ4_0 || wk == kWIQ4_NL ? 18 : wk == kWQ4_1 ? 20
       : wk == kWQ4_K ? 144 : wk == kWQ5_K ? 176 : wk == kWQ6_K ? 210 : 136;  // IQ4_XS
}
__host__ __device__ constexpr int block_elems(int wk) {  // 256: super-blocks of 8 sub-blocks
  return wk == kWQ4_K || wk == kWQ5_K || wk == kWQ6_K || wk == kWIQ4_XS ? 256 : 32;
}

// Small integers as f32 without an I2F conversion (a quarter-rate instruction on Hopper, the
// block dequantizers' bottleneck): q's bits under the exponent of 2^23 (+ 2^22 for signed q),
// minus that power: exact for |q| < 2^22.
__device__ __forceinline__ float small_uint_to_float(uint32_t q) {
  return __int_as_float(0x4B000000u | q) - 8388608.f;
}
__device__ __forceinline__ float small_int_to_float(int q) {
  return __int_as_float(0x4B400000 + q) - 12582912.f;
}

// kvalues_iq4nl[q] (-127, -104, ..., 113), four to a word, picked by a byte permute (no table
// in memory, whose per-lane indices would serialize).
__device__ __forceinline__ float iq4nl_value(int q) {
  const uint32_t lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, q & 7);
  const uint32_t hi = __byte_perm(0x26190D01u, 0x71594535u, q & 7);
  return small_int_to_float(static_cast<int8_t>((q & 8 ? hi : lo) & 0xff));
}

struct LinearArgs {
  const void* x;
  const void* w;
  const void* bias;  // like out, or nullptr
  void* out;
  int T, N, K;
  int64_t x_stride, out_stride;  // elements
  int64_t w_stride;              // elements (dense) or bytes (block types)
  bool pair_store;               // out rows allow 32-bit stores of two elements
  // GEMV only (rms_norm_linear): x is replaced by rms_norm(x + res) * norm_w, computed on the
  // fly; CTA 0 writes x + res to res_out. norm_w nullptr: plain x.
  const float* norm_w = nullptr;
  const void* res = nullptr;  // or nullptr: no residual add
  void* res_out = nullptr;    // with res
  int64_t res_stride = 0, res_out_stride = 0;
  float eps = 0.f;
  // Grouped products (fused_experts, fused_moe.cu): the rows of x and out come in tiles of
  // tile_rows, each one expert's; tile_expert[row / tile_rows] names it (< 0: a padding tile,
  // nothing computed or written) and w is that expert's [N, K] slice of a stacked [E, N, K]
  // weight, w_expert_stride bytes after the previous expert's. nullptr: one w for every row.
  const int* tile_expert = nullptr;
  int tile_rows = 0;
  int64_t w_expert_stride = 0;
  // Grouped products may read x's rows through a map instead of a gathered copy (the GEMM and
  // generic kernels): row r of the product is x's row x_row_of[r] / x_row_div, zeros where
  // x_row_of[r] < 0 (a padding row). nullptr: row r is x's row r.
  const int* x_row_of = nullptr;
  int x_row_div = 1;
  // fp8 products (the skinny TMA kernel, for fp8_linear): x holds e4m3 codes, and each 128-wide
  // group g of K is scaled by w_scale[g * N + n] and x_scale[g * x_scale_stride + t].
  const float* w_scale = nullptr;
  const float* x_scale = nullptr;
  int64_t x_scale_stride = 0;
};

// The row of x that row r of a product reads, -1 for zeros (r past T or a padding row).
__device__ __forceinline__ int x_row(const LinearArgs& a, int r) {
  if (r >= a.T) return -1;
  if (a.x_row_of == nullptr) return r;
  const int p = a.x_row_of[r];
  return p < 0 ? -1 : p / a.x_row_div;
}

// The weight a row of a grouped product reads (or a.w), nullptr for a padding tile's rows.
__device__ __forceinline__ const void* row_weights(const LinearArgs& a, int row) {
  if (a.tile_expert == nullptr) return a.w;
  const int e = a.tile_expert[row / a.tile_rows];
  return e < 0 ? nullptr : static_cast<const char*>(a.w) + e * a.w_expert_stride;
}

// ------------------------------------------------------------------ w chunks (8 elements)
// A chunk is w[n, k .. k + 8) with k a multiple of 8. raw holds what the global loads fetched
// (for the k-quants already cut down to the chunk's scale, min and bits); chunk_to_float turns
// it into f32. For block types x = q * d (+ m), for the k-quants x = (d * sc) * q - dmin * m,
// as gguf.quants.dequantize computes them in f32.

// The 6-bit scale and min of sub-block j (0..7) from a Q4_K / Q5_K block's 12 scale bytes,
// given as three little-endian words (llama.cpp's get_scale_min_k4).
__device__ __forceinline__ uint32_t kquant_scale_min(uint32_t s0, uint32_t s1, uint32_t s2,
                                                     int j) {
  auto byte = [&](int i) -> uint32_t {
    const uint32_t w = i < 4 ? s0 : i < 8 ? s1 : s2;
    return (w >> (8 * (i % 4))) & 0xff;
  };
  uint32_t sc, m;
  if (j < 4) {
    sc = byte(j) & 63;
    m = byte(j + 4) & 63;
  } else {
    sc = (byte(j + 4) & 0xf) | ((byte(j - 4) >> 6) << 4);
    m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
  return sc | (m << 8);
}

// A chunk's words from global memory (read-only loads) or, kGlobal false, from shared memory
// (the skinny GEMM's staged blocks, which keep their global alignment modulo 16).
template <bool kGlobal>
struct ChunkLoad {
  static __device__ __forceinline__ uint32_t u16(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    if constexpr (kGlobal) return __ldg(h);
    else return *h;
  }
  static __device__ __forceinline__ uint32_t u32(const uint8_t* p) {
    const uint32_t* u = reinterpret_cast<const uint32_t*>(p);
    if constexpr (kGlobal) return __ldg(u);
    else return *u;
  }
  static __device__ __forceinline__ uint32_t u16x2(const uint8_t* p) {  // 2-byte aligned p
    return u16(p) | (u16(p + 2) << 16);
  }
};

// The chunk of elements k .. k + 8 of a block-quantized row that starts at blk_row (k counted
// from there; blk_row is at a block boundary).
template <int WK, bool kGlobal = true>
__device__ __forceinline__ uint4 load_block_chunk(const uint8_t* blk_row, int k) {
  using L = ChunkLoad<kGlobal>;
  const uint8_t* blk = blk_row + (k / block_elems(WK)) * block_bytes(WK);
  const int c = (k / 8) % 4;  // which 8 elements of the 32-element (sub-)block
  uint4 r;
  if constexpr (WK == kWQ4_K || WK == kWQ5_K) {
    // d, dmin (f16), scales[12], [Q5_K: qh[32]], qs[128]: sub-block j = e / 32 of the 256
    // holds its 4 low bits in qs[32 (j / 2) + l] (low nibble for even j, high for odd);
    // Q5_K's fifth bit is bit j of qh[l]. 16-byte aligned blocks.
    const int e = k % 256, j = e / 32, l = e % 32;
    r.x = L::u32(blk);
    r.w = kquant_scale_min(L::u32(blk + 4), L::u32(blk + 8), L::u32(blk + 12), j);
    const int qs0 = (WK == kWQ4_K ? 16 : 48) + 32 * (j / 2) + l;
    r.y = L::u32(blk + qs0);
    r.z = L::u32(blk + qs0 + 4);
    if constexpr (WK == kWQ5_K) {
      const uint32_t h0 = L::u32(blk + 16 + l);
      const uint32_t h1 = L::u32(blk + 16 + l + 4);
      uint32_t bits = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        bits |= ((h0 >> (8 * i + j)) & 1u) << i;
        bits |= ((h1 >> (8 * i + j)) & 1u) << (4 + i);
      }
      r.w |= bits << 16;
    }
    return r;
  } else if constexpr (WK == kWIQ4_XS) {
    // d (f16), scales_h (2 bits a sub-block), scales_l[4] (4 bits a sub-block), qs[128]: sub-
    // block ib = e / 32's codes in qs[16 ib ..], value l in the low nibble of byte l, value
    // l + 16 in the high one. 8-byte aligned blocks.
    const int e = k % 256, ib = e / 32, l = e % 32;
    const uint32_t head = L::u32(blk), sl = L::u32(blk + 4);
    r.x = head;
    r.w = ((sl >> (8 * (ib / 2) + 4 * (ib % 2))) & 0xF) | (((head >> (16 + 2 * ib)) & 3) << 4);
    const uint8_t* qs = blk + 8 + 16 * ib + l % 16;
    r.y = L::u32(qs);
    r.z = L::u32(qs + 4);
    return r;
  } else if constexpr (WK == kWQ6_K) {
    // ql[128], qh[64], scales[16] (i8), d (f16); 210-byte blocks, so 2-byte loads. Element
    // e: half h = e / 128, quarter q = e % 128 / 32, l = e % 32: its low 4 bits are
    // ql[64 h + 32 (q % 2) + l] (high nibble for q >= 2), its top 2 bits bits 2q.. of
    // qh[32 h + l], its scale scales[8 h + l / 16 + 2 q].
    const int e = k % 256, h = e / 128, q = e % 128 / 32, l = e % 32;
    const uint8_t* ql = blk + 64 * h + 32 * (q % 2) + l;
    r.y = L::u16x2(ql);
    r.z = L::u16x2(ql + 4);
    const uint8_t* qh = blk + 128 + 32 * h + l;
    const uint32_t h0 = L::u16x2(qh), h1 = L::u16x2(qh + 4);
    uint32_t bits = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      bits |= ((h0 >> (8 * i + 2 * q)) & 3u) << (2 * i);
      bits |= ((h1 >> (8 * i + 2 * q)) & 3u) << (8 + 2 * i);
    }
    const int si = 8 * h + l / 16 + 2 * q;
    const uint32_t sc2 = L::u16(blk + 192 + 2 * (si / 2));
    const uint32_t sc = si % 2 ? sc2 >> 8 : sc2 & 0xff;
    r.x = L::u16(blk + 208) | (sc << 16);
    r.w = bits;
    return r;
  } else if constexpr (WK == kWQ8_0) {  // d (f16), qs[32] (i8); 2-byte aligned
    r.x = L::u16(blk);
    const uint8_t* q = blk + 2 + c * 8;
    r.y = L::u16x2(q);
    r.z = L::u16x2(q + 4);
  } else if constexpr (WK == kWQ4_0 || WK == kWIQ4_NL) {  // d, qs[16]: j low nibble, j + 16 high
    r.x = L::u16(blk);
    const uint8_t* q = blk + 2 + (c & 1) * 8;
    r.y = L::u16x2(q);
    r.z = L::u16x2(q + 4);
  } else {  // Q4_1: d, m, qs[16]; 4-byte aligned
    r.x = L::u32(blk);
    r.y = L::u32(blk + 4 + (c & 1) * 8);
    r.z = L::u32(blk + 8 + (c & 1) * 8);
  }
  r.w = 0;
  return r;
}

// Chunk w[n, k .. k + 8) (k a multiple of 8): 16 bytes of a dense row, or what the block
// types' loads fetched (for the k-quants already cut down to the chunk's scale, min and bits).
template <int WK>
__device__ __forceinline__ uint4 load_chunk(const void* w, int64_t w_stride, int n, int k) {
  if constexpr (!is_quant(WK)) {
    const uint16_t* row = static_cast<const uint16_t*>(w) + n * w_stride;
    return __ldg(reinterpret_cast<const uint4*>(row + k));
  } else {
    return load_block_chunk<WK>(static_cast<const uint8_t*>(w) + n * w_stride, k);
  }
}

template <int WK>
__device__ __forceinline__ void chunk_to_float(const uint4& r, int k, bool same_bf16,
                                               float (&f)[8]) {
  if constexpr (WK == kWSame) {
    unpack8(r, same_bf16, f);
  } else if constexpr (WK == kWF16 || WK == kWBF16) {
    unpack8(r, WK == kWBF16, f);
  } else if constexpr (WK == kWQ4_K || WK == kWQ5_K) {
    const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(r.x & 0xffff)));
    const float dmin = __half2float(__ushort_as_half(static_cast<uint16_t>(r.x >> 16)));
    const float dl = __fmul_rn(d, small_uint_to_float(r.w & 63));
    const float ml = __fmul_rn(dmin, small_uint_to_float((r.w >> 8) & 63));
    const int shift = (k % 256 / 32) % 2 ? 4 : 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int q0 = ((r.y >> (8 * j)) >> shift) & 0xf, q1 = ((r.z >> (8 * j)) >> shift) & 0xf;
      if constexpr (WK == kWQ5_K) {
        q0 |= ((r.w >> (16 + j)) & 1) << 4;
        q1 |= ((r.w >> (20 + j)) & 1) << 4;
      }
      // (rounded twice, as the CPU's dequantize and numpy do: no contraction into an FMA)
      f[j] = __fsub_rn(__fmul_rn(dl, small_uint_to_float(q0)), ml);
      f[4 + j] = __fsub_rn(__fmul_rn(dl, small_uint_to_float(q1)), ml);
    }
  } else if constexpr (WK == kWIQ4_NL || WK == kWIQ4_XS) {
    const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(r.x & 0xffff)));
    const float dl = WK == kWIQ4_XS ? __fmul_rn(d, small_int_to_float(static_cast<int>(r.w) - 32))
                                    : d;
    const int shift = (WK == kWIQ4_XS ? k % 32 >= 16 : (k / 8) % 4 >= 2) ? 4 : 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[j] = __fmul_rn(dl, iq4nl_value(((r.y >> (8 * j)) >> shift) & 0xf));
      f[4 + j] = __fmul_rn(dl, iq4nl_value(((r.z >> (8 * j)) >> shift) & 0xf));
    }
  } else if constexpr (WK == kWQ6_K) {
    const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(r.x & 0xffff)));
    const float dl = __fmul_rn(d, small_int_to_float(static_cast<int8_t>((r.x >> 16) & 0xff)));
    const int shift = k % 128 / 32 >= 2 ? 4 : 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q0 = (((r.y >> (8 * j)) >> shift) & 0xf) | (((r.w >> (2 * j)) & 3) << 4);
      const int q1 = (((r.z >> (8 * j)) >> shift) & 0xf) | (((r.w >> (8 + 2 * j)) & 3) << 4);
      f[j] = __fmul_rn(dl, small_int_to_float(q0 - 32));
      f[4 + j] = __fmul_rn(dl, small_int_to_float(q1 - 32));
    }
  } else {
    const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(r.x & 0xffff)));
    if constexpr (WK == kWQ8_0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        f[j] = d * small_int_to_float(static_cast<int8_t>((r.y >> (8 * j)) & 0xff));
        f[4 + j] = d * small_int_to_float(static_cast<int8_t>((r.z >> (8 * j)) & 0xff));
      }
    } else {
      const int shift = ((k / 8) % 4) >= 2 ? 4 : 0;
      const float m =
          WK == kWQ4_1 ? __half2float(__ushort_as_half(static_cast<uint16_t>(r.x >> 16))) : 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int q0 = ((r.y >> (8 * j)) >> shift) & 0xf;
        const int q1 = ((r.z >> (8 * j)) >> shift) & 0xf;
        if constexpr (WK == kWQ4_0) {
          f[j] = small_int_to_float(q0 - 8) * d;
          f[4 + j] = small_int_to_float(q1 - 8) * d;
        } else {
          f[j] = small_uint_to_float(q0) * d + m;
          f[4 + j] = small_uint_to_float(q1) * d + m;
        }
      }
    }
  }
}

// v as a 16-bit store would round it, back in f32.
__device__ __forceinline__ float round_to(float v, bool bf) {
  return bits_to_float(float_to_bits(v, bf), bf);
}

__device__ __forceinline__ void store_out(const LinearArgs& a, bool bf, int t, int n, float v0,
                                          float v1, bool two) {
  uint16_t* o = static_cast<uint16_t*>(a.out) + t * a.out_stride + n;
  if (a.bias != nullptr) {
    const uint16_t* bp = static_cast<const uint16_t*>(a.bias) + n;
    v0 += bits_to_float(bp[0], bf);
    if (two) v1 += bits_to_float(bp[1], bf);
  }
  if (two && a.pair_store) {
    *reinterpret_cast<uint32_t*>(o) = pack2_bits(v0, v1, bf);
  } else {
    o[0] = float_to_bits(v0, bf);
    if (two) o[1] = float_to_bits(v1, bf);
  }
}

// GEMV up to 4 rows (same-dtype weights up to 2: kSkinnyMinT): beyond that its f32 FMAs (8 x 4
// rows per 16-byte chunk) hold it far below the copy bandwidth (T = 8 measured 1.0-2.1 TB/s on
// the H200), and the mma GEMM does better.
constexpr int kGemvMaxT = 4;

// gemv.cu: the GEMV for x of T <= max_t (1 or kGemvMaxT) rows, bf16 (else f16) x, w read as
// gk (kWF16 / kWBF16 / a block kind); silu_gated: w is [gate; up] and out act(gate) * up.
void launch_gemv(const LinearArgs& a, bool bf16_x, int gk, int max_t, bool silu_gated,
                 cudaStream_t s);

// linear.cu's mma.sync GEMM (gemm_kernel) on tiles of BM x BN outputs, BK deep, WM x WN a warp,
// STAGES cp.async stages. Here for the planner too, which sizes GemmLarge's grid.
template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_>
struct GemmConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int MT = WM / 16, NT = WN / 8;
  static constexpr int LDS = BK + 8;  // smem row stride in elements: conflict-free ldmatrix
  static constexpr int kSmemBytes = STAGES * (BM + BN) * LDS * 2;
  static constexpr int kAChunks = BM * BK / 8 / kThreads;  // 16-byte chunks per thread
  static constexpr int kBChunks = BN * BK / 8 / kThreads;
  static_assert(NT % 2 == 0 && BK % 32 == 0 && STAGES >= 2, "tile shape");
  static_assert(BM * BK / 8 % kThreads == 0 && BN * BK / 8 % kThreads == 0, "tile loads");
};
using GemmLarge = GemmConfig<128, 128, 32, 64, 32, 4>;  // 8 warps, 80 KB smem
using GemmSmall = GemmConfig<32, 64, 64, 32, 16, 4>;    // 4 warps, 54 KB smem (small T / N)

// linear.cu: a grouped product (a.tile_expert set) of x and w of dtype xt (bf16 / f16 / f32,
// one dtype), in row tiles of a.tile_rows rows: the tensor-core GEMM where x is 16-bit and K a
// multiple of 8 (tensor_cores below), else the generic kernel. grouped_tile_rows picks the tile
// height the caller pads each expert's rows to, from the rows and experts of the product.
int grouped_tile_rows(bool tensor_cores, int64_t rows, int64_t experts);
// Whether a grouped product's rows an expert are many (prefill): 128-row tiles, and on Hopper
// the grouped wgmma GEMM's straight tiles (fused_moe.cu's sm90_tile; its swapped ones take
// decode batches with enough experts).
bool grouped_rows_many(int64_t rows, int64_t experts);
void launch_grouped_linear(const LinearArgs& a, DType xt, cudaStream_t s);

// gemm_skinny.cu: the skinny GEMM (swapped operands, split-K) for kSkinnyMinT <= T <=
// kSkinnyMaxT, x and w of one 16-bit dtype (bf16 if bf16_x, else f16). From 3 rows it beats the
// GEMV's f32 FMAs (8 x 3-4 per 16-byte chunk) on same-dtype weights: on the H200, batch-4
// decode of Llama-3-8B 558 -> 731 tok/s at 1024 tokens of context, 470 -> 597 at 7936, and of
// Qwen3-0.6B 2176 -> 2609 (bench/gpu_ab.sh, one run). Block weights stay on the GEMV to 4.
constexpr int kSkinnyMinT = 3;
constexpr int kSkinnyMaxT = 32;
void launch_gemm_skinny(const LinearArgs& a, bool bf16_x, cudaStream_t s);
// The CTAs an SM (1 or 2) with which launch_gemm_skinny runs an N x K product on its TMA-fed
// kernel on this GPU, or 0 where it runs the cp.async one (gemm_skinny_bulk_sm90.cu; only where
// VLLMX_WITH_SM90_GEMM builds it).
int skinny_bulk_ctas_per_sm(int64_t N, int64_t K);
// gemm_skinny_bulk_sm90.cu's kernel on fp8 weights and quantized x (a's K and strides in
// bytes, its scales set; fp8_linear, cuda/fp8.cu), up to kFp8SkinnyBulkMaxT tokens on Hopper:
// out (bf16, else f16) = the scaled product. False, launching nothing, where the GPU or the
// operands' alignment do not suit it.
constexpr int kFp8SkinnyBulkMaxT = 32;
bool launch_fp8_skinny_bulk(const LinearArgs& a, bool bf16_out, cudaStream_t s);

// gemm_skinny_quant.cu: the skinny GEMM for block weights (wk a block kind, K a multiple of
// 256) from quant_skinny_min_t(wk) to kSkinnyMaxT rows: 16-byte copies of the blocks into
// shared memory, dequantized into the mma's fragments, where the GEMV's narrow loads of 18- to
// 210-byte blocks leave the H200's bandwidth mostly unused. From one row for the k-quants,
// whose stages take a thread's sub-blocks whole (H200, T = 1, Llama-3-8B's shapes,
// bench/results/gpu_linear_q4_k_q6_k_skinny.json: Q4_K 744-1010 GB/s against the GEMV's
// 545-756, Q6_K 988-1235 against 577-758; Q5_K's scale-after stage at T = 8 10.2-42.2 us
// where its GEMV takes 28.6-154.7 at T = 1, gpu_linear_kquant_scale_after.json); from two for
// the others, where at one row the GEMV ties or wins (Q4_0 and Q8_0 on 28672 x 4096: 1057 /
// 1921 GB/s against 965 / 1712).
constexpr int quant_skinny_min_t(int wk) {
  return wk == kWQ4_K || wk == kWQ5_K || wk == kWQ6_K ? 1 : 2;
}
void launch_gemm_skinny_quant(const LinearArgs& a, bool bf16_x, int wk, cudaStream_t s);

// What set_linear_tuning (runtime.h) forces; the engine never sets it. path: -1 the planner's
// own, else a ForcedPath (linear_plan.cu); skinny_waves: the skinny GEMMs' CTAs per SM that their
// split-K aims at (0: two for dense weights, the one-token-tile occupancy for block weights);
// decomposition / splits / swizzle / raster: the CUTLASS GEMMs'
// scheduler (Sm90Schedule's fields; -1, 0, 0 and -1: the planner's).
struct LinearTuning {
  int path = -1;
  int skinny_waves = 0;
  int decomposition = -1;
  int splits = 0;
  int swizzle = 0;
  int raster = -1;
};
const LinearTuning& linear_tuning();
// The tile run length (Sm90Schedule::swizzle) for a T x N x K product on a CUTLASS tile: longer
// runs where its tiles fill more than a wave and K is at most kSm90SwizzleMaxK (linear_plan.cu's
// swizzle_runs says which).
int sm90_swizzle(Sm90Tile tile, int64_t T, int64_t N, int64_t K);
// A CUTLASS GEMM's schedule: the planner's, with what set_linear_tuning forces in its place
// (cuda/fp8.cu's GEMMs take it too).
Sm90Schedule tuned_schedule(Sm90Schedule planned);

// linear_plan.cu's answer to which kernel takes a product, on what tile and schedule; linear.cu
// launches it (run_linear), and its fused ops read the path to decide what they fuse.
enum class Path { kGeneric, kGemv, kSkinny, kGemmSmall, kGemmLarge, kSm90 };

struct LinearPlan {
  Path path = Path::kGeneric;
  int wk = kWSame;
  int max_t = kGemvMaxT;  // GEMV: rows one launch holds in registers (1 or kGemvMaxT)
  int act = -1;   // GEMV: an Act to apply as act(gate) * up (linear_act_and_mul), or -1
  Sm90Tile sm90_tile = Sm90Tile::k128x128;
  Sm90Schedule sm90_schedule;
};
// The plan for out[T, N] = x[T, K] @ w[N, K]^T (what set_linear_tuning forces, where it does).
LinearPlan plan_linear(const Tensor& out, const Tensor& x, const Tensor& w, int64_t T, int64_t N,
                       int64_t K);

}  // namespace vllmx::cuda::lin
