// What fused_experts' two CUTLASS grouped GEMMs on Hopper share (gemm_grouped_sm90.cu: 16-bit
// experts; gemm_grouped_fp8_sm90.cu: fp8 experts with block scales): the device arrays a
// pointer-array GEMM reads each group's problem from, the strides, and the launch. Internal to
// those two files, which are separate translation units for a parallel build.
#pragma once
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cuda_util.cuh"
#include "gemm_sm90.h"
#include "runtime.h"

namespace vllmx::cuda::grouped {

using namespace cute;

// Operands in CUTLASS's terms, one group per expert e (both operands K-major):
// - straight: A = the chunk's rows of expert e [m, K], B = w[e] ([N, K], so column-major B),
//   D = out's rows of expert e, row-major;
// - swapped (kSwap, few rows an expert: decode): A = w[e] [N, K], B = the rows, D = out's rows
//   read column-major, so the weight rows fill wgmma's 128-row M side and an expert's few rows
//   a narrow N tile, as the dense GEMM swaps for decode batches (gemm_sm90.cuh).
// No C and no bias (fused_experts adds its biases in the activation and the combine). No
// cluster: an expert's rows are a few tiles, and a cluster's second CTA would often find no
// tile of its expert.
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;
using ClusterShape = Shape<_1, _1, _1>;

// The operand layouts and the epilogue both grouped GEMMs use: D (Element, bf16 / f16) = acc,
// rounded once, row-major straight, column-major swapped.
template <typename Element, class TileShape, bool kSwap>
struct GroupedEpilogue {
  using LayoutA = cutlass::layout::RowMajor;     // K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // K-major
  using LayoutD =
      std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD,
      Element, LayoutD*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<Element, float>>::CollectiveOp;
};

// n of each of Ts, one block of grow-only scratch (runtime.h: a stream's work may still point
// at it) per instantiation, each array 16-byte aligned.
template <class... Ts>
std::tuple<Ts*...> device_arrays(int n) {
  static GrowOnlyBuffer buf;
  constexpr size_t kCount = sizeof...(Ts);
  const size_t sizes[kCount] = {(sizeof(Ts) * static_cast<size_t>(n) + 15) / 16 * 16 ...};
  size_t total = 0;
  for (size_t s : sizes) total += s;
  char* p = static_cast<char*>(buf.get(total));
  size_t off[kCount];
  for (size_t i = 0, o = 0; i < kCount; o += sizes[i], ++i) off[i] = o;
  size_t i = 0;
  return std::tuple<Ts*...>{reinterpret_cast<Ts*>(p + off[i++])...};
}

// A K-major operand's stride, or a row-major D's: ld elements between rows (mode 0); one batch.
template <class Stride>
__device__ Stride rows_apart(int64_t ld) {
  Stride st{};
  get<0>(st) = ld;
  return st;
}
// A column-major D's: ld elements between columns (mode 1).
template <class Stride>
__device__ Stride cols_apart(int64_t ld) {
  Stride st{};
  get<1>(st) = ld;
  return st;
}

// Group e's M, N, K and its operands' strides: straight (x rows on M) or swapped (w rows on M).
template <bool kSwap, class StrideA, class StrideB, class StrideD>
__device__ void group_problem(const Sm90GroupedArgs& g, int e, Shape3* shape, StrideA* sa,
                              StrideB* sb, StrideD* sd) {
  if constexpr (kSwap) {
    shape[e] = Shape3{g.N, g.expert_rows[e], g.K};
    sa[e] = rows_apart<StrideA>(g.w_stride);
    sb[e] = rows_apart<StrideB>(g.x_stride);
    sd[e] = cols_apart<StrideD>(g.out_stride);
  } else {
    shape[e] = Shape3{g.expert_rows[e], g.N, g.K};
    sa[e] = rows_apart<StrideA>(g.x_stride);
    sb[e] = rows_apart<StrideB>(g.w_stride);
    sd[e] = rows_apart<StrideD>(g.out_stride);
  }
}

inline void check(cutlass::Status st, const char* what, const Sm90GroupedArgs& g,
                  const char* kind) {
  if (st != cutlass::Status::kSuccess)
    throw std::runtime_error(std::string("fused_experts: CUTLASS sm90 ") + kind +
                             " grouped GEMM " + what + " failed (" +
                             cutlassGetStatusString(st) + ") for " + std::to_string(g.experts) +
                             " experts of [" + std::to_string(g.N) + ", " +
                             std::to_string(g.K) + "]; " +
                             cudaGetErrorString(cudaGetLastError()));
}

// can_implement, the workspace, initialize and the launch on stream s.
template <class Adapter>
void launch_grouped(typename Adapter::Arguments& args, const Sm90GroupedArgs& g,
                    const char* kind, cudaStream_t s) {
  int device = 0;
  cudaGetDevice(&device);
  args.hw_info.device_id = device;
  args.hw_info.sm_count = g.num_sms;
  static GrowOnlyBuffer ws_buf;
  Adapter gemm;
  check(gemm.can_implement(args), "can_implement", g, kind);
  const size_t ws_bytes = Adapter::get_workspace_size(args);
  void* ws = ws_bytes == 0 ? nullptr : ws_buf.get(ws_bytes);
  check(gemm.initialize(args, ws, s), "initialize", g, kind);
  check(gemm.run(s), "launch", g, kind);
}

}  // namespace vllmx::cuda::grouped
