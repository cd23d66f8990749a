// Shared by the linear kernels (linear.cu: GEMM, the generic kernel, plan and ops; gemv.cu:
// the GEMV): the argument block and how a weight chunk is read. Internal to the CUDA sources.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_util.cuh"
#include "mma.cuh"

namespace vllmx::cuda::lin {

using namespace detail;

// How w is read, relative to x's 16-bit dtype.
enum WKind : int { kWSame = 0, kWF16 = 1, kWBF16 = 2, kWQ8_0 = 3, kWQ4_0 = 4, kWQ4_1 = 5 };

__host__ __device__ constexpr bool is_quant(int wk) { return wk >= kWQ8_0; }
__host__ __device__ constexpr int block_bytes(int wk) {
  return wk == kWQ8_0 ? 34 : wk == kWQ4_0 ? 18 : 20;
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
// A chunk is w[n, k .. k + 8) with k a multiple of 8. raw holds what the global loads fetched;
// chunk_to_float turns it into f32. For block types x = q * d (+ m), exactly like
// gguf.quants.dequantize in f32.

template <int WK>
__device__ __forceinline__ uint4 load_chunk(const void* w, int64_t w_stride, int n, int k) {
  if constexpr (!is_quant(WK)) {
    const uint16_t* row = static_cast<const uint16_t*>(w) + n * w_stride;
    return __ldg(reinterpret_cast<const uint4*>(row + k));
  } else {
    const uint8_t* blk =
        static_cast<const uint8_t*>(w) + n * w_stride + (k / 32) * block_bytes(WK);
    const int c = (k / 8) % 4;  // which 8 elements of the 32-element block
    uint4 r;
    if constexpr (WK == kWQ8_0) {  // d (f16), qs[32] (i8); 2-byte aligned
      const uint16_t* h = reinterpret_cast<const uint16_t*>(blk);
      r.x = __ldg(h);
      const uint16_t* q = h + 1 + c * 4;
      r.y = __ldg(q) | (static_cast<uint32_t>(__ldg(q + 1)) << 16);
      r.z = __ldg(q + 2) | (static_cast<uint32_t>(__ldg(q + 3)) << 16);
    } else if constexpr (WK == kWQ4_0) {  // d, qs[16]: element j low nibble, j + 16 high
      const uint16_t* h = reinterpret_cast<const uint16_t*>(blk);
      r.x = __ldg(h);
      const uint16_t* q = h + 1 + (c & 1) * 4;
      r.y = __ldg(q) | (static_cast<uint32_t>(__ldg(q + 1)) << 16);
      r.z = __ldg(q + 2) | (static_cast<uint32_t>(__ldg(q + 3)) << 16);
    } else {  // Q4_1: d, m, qs[16]; 4-byte aligned
      const uint32_t* u = reinterpret_cast<const uint32_t*>(blk);
      r.x = __ldg(u);
      r.y = __ldg(u + 1 + (c & 1) * 2);
      r.z = __ldg(u + 2 + (c & 1) * 2);
    }
    r.w = 0;
    return r;
  }
}

template <int WK>
__device__ __forceinline__ void chunk_to_float(const uint4& r, int k, bool same_bf16,
                                               float (&f)[8]) {
  if constexpr (WK == kWSame) {
    unpack8(r, same_bf16, f);
  } else if constexpr (WK == kWF16 || WK == kWBF16) {
    unpack8(r, WK == kWBF16, f);
  } else {
    const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(r.x & 0xffff)));
    if constexpr (WK == kWQ8_0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        f[j] = d * static_cast<float>(static_cast<int8_t>((r.y >> (8 * j)) & 0xff));
        f[4 + j] = d * static_cast<float>(static_cast<int8_t>((r.z >> (8 * j)) & 0xff));
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
          f[j] = static_cast<float>(q0 - 8) * d;
          f[4 + j] = static_cast<float>(q1 - 8) * d;
        } else {
          f[j] = static_cast<float>(q0) * d + m;
          f[4 + j] = static_cast<float>(q1) * d + m;
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

// What set_linear_tuning (runtime.h) forces; the engine never sets it. path: -1 the planner's
// own, else a ForcedPath (linear.cu); skinny_waves: the skinny GEMM's CTAs per SM that its
// split-K aims at (0: two); decomposition / splits: the CUTLASS GEMM's stream-K scheduler
// (cutlass DecompositionMode, -1 its heuristic; splits 0 its own).
struct LinearTuning {
  int path = -1;
  int skinny_waves = 0;
  int decomposition = -1;
  int splits = 0;
};
const LinearTuning& linear_tuning();

}  // namespace vllmx::cuda::lin
