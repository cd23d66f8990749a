// sm90_grouped_gemm (cuda/gemm_sm90.h): fused_experts' two products on Hopper, each as one
// CUTLASS 3 grouped (pointer-array) GEMM: TMA loads and warp-specialized wgmma like the dense
// sm90_gemm, one group an expert, every group's shape, operand pointers and strides read from
// device arrays that grouped_args_kernel fills from the routing's row counts on the stream. So
// the host never learns how many rows an expert got (no sync; decode steps stay in CUDA graphs),
// and CUTLASS's group tile scheduler walks only the tiles of experts that have rows.
//
// fused_moe.cu's sm90_tile picks the tiles: straight 128 x 128 ones for prefill chunks (from 96
// rows an expert on average, where the mma.sync grouped GEMM, linear.cu's gemm_kernel, runs at a
// fraction of wgmma's rate), swapped 128 x 16 / 128 x 64 ones for decode batches with enough
// active experts. sm_90a only, like the other CUTLASS instantiations.
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cuda_util.cuh"
#include "gemm_sm90.h"
#include "runtime.h"

namespace vllmx::cuda {

namespace {

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
template <typename Element, class TileShape_, bool kSwap>
struct Grouped {
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD =
      std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA
  using TileShape = TileShape_;
  using ClusterShape = Shape<_1, _1, _1>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlign,
      Element, LayoutD*, kAlign, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<Element, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element,
      LayoutB*, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

// The device arrays CUTLASS reads a group's problem from: one block of scratch, grow-only
// (runtime.h) like every buffer a stream's work may still point at.
template <class G, typename Element>
struct GroupArrays {
  typename G::Shape3* shape;
  const Element** a;
  const Element** b;
  Element** d;
  typename G::StrideA* sa;
  typename G::StrideB* sb;
  typename G::StrideD* sd;

  static size_t align16(size_t n) { return (n + 15) / 16 * 16; }
  explicit GroupArrays(int groups) {
    static GrowOnlyBuffer buf;
    const size_t n = static_cast<size_t>(groups);
    const size_t sizes[] = {n * sizeof(*shape), n * sizeof(*a), n * sizeof(*b),
                            n * sizeof(*d),     n * sizeof(*sa), n * sizeof(*sb),
                            n * sizeof(*sd)};
    size_t total = 0;
    for (size_t s : sizes) total += align16(s);
    char* p = static_cast<char*>(buf.get(total));
    void* parts[7];
    for (int i = 0; i < 7; ++i) {
      parts[i] = p;
      p += align16(sizes[i]);
    }
    shape = static_cast<typename G::Shape3*>(parts[0]);
    a = static_cast<const Element**>(parts[1]);
    b = static_cast<const Element**>(parts[2]);
    d = static_cast<Element**>(parts[3]);
    sa = static_cast<typename G::StrideA*>(parts[4]);
    sb = static_cast<typename G::StrideB*>(parts[5]);
    sd = static_cast<typename G::StrideD*>(parts[6]);
  }
};

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

// Group e: rows expert_rows[e] from row expert_first[e] of x and of out, against w's expert e.
template <class G, typename Element, bool kSwap>
__global__ void grouped_args_kernel(Sm90GroupedArgs g, GroupArrays<G, Element> arr) {
  pdl_begin();
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= g.experts) return;
  const int64_t first = g.expert_first[e];
  const Element* rows = static_cast<const Element*>(g.x) + first * g.x_stride;
  const Element* w = static_cast<const Element*>(g.w) + e * g.w_expert_stride;
  arr.d[e] = static_cast<Element*>(g.out) + first * g.out_stride;
  if constexpr (kSwap) {
    arr.shape[e] = typename G::Shape3{g.N, g.expert_rows[e], g.K};
    arr.a[e] = w;
    arr.b[e] = rows;
    arr.sa[e] = rows_apart<typename G::StrideA>(g.w_stride);
    arr.sb[e] = rows_apart<typename G::StrideB>(g.x_stride);
    arr.sd[e] = cols_apart<typename G::StrideD>(g.out_stride);
  } else {
    arr.shape[e] = typename G::Shape3{g.expert_rows[e], g.N, g.K};
    arr.a[e] = rows;
    arr.b[e] = w;
    arr.sa[e] = rows_apart<typename G::StrideA>(g.x_stride);
    arr.sb[e] = rows_apart<typename G::StrideB>(g.w_stride);
    arr.sd[e] = rows_apart<typename G::StrideD>(g.out_stride);
  }
}

void check(cutlass::Status st, const char* what, const Sm90GroupedArgs& g) {
  if (st != cutlass::Status::kSuccess)
    throw std::runtime_error(std::string("fused_experts: CUTLASS sm90 grouped GEMM ") + what +
                             " failed (" + cutlassGetStatusString(st) + ") for " +
                             std::to_string(g.experts) + " experts of [" + std::to_string(g.N) +
                             ", " + std::to_string(g.K) + "]; " +
                             cudaGetErrorString(cudaGetLastError()));
}

template <typename Element, class TileShape, bool kSwap>
void run(const Sm90GroupedArgs& g, cudaStream_t s) {
  using G = Grouped<Element, TileShape, kSwap>;
  using Adapter = typename G::Adapter;
  GroupArrays<G, Element> arr(g.experts);
  launch(grouped_args_kernel<G, Element, kSwap>, (g.experts + 127) / 128, 128, 0, s, g, arr);
  check_launch("grouped_args_kernel");

  typename Adapter::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {g.experts, arr.shape, nullptr},  // the shapes live on the device only
      {const_cast<const Element**>(arr.a), arr.sa, const_cast<const Element**>(arr.b), arr.sb},
      {{}, nullptr, arr.sd, arr.d, arr.sd}};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  int device = 0;
  cudaGetDevice(&device);
  args.hw_info.device_id = device;
  args.hw_info.sm_count = g.num_sms;

  static GrowOnlyBuffer ws_buf;
  Adapter gemm;
  check(gemm.can_implement(args), "can_implement", g);
  const size_t ws_bytes = Adapter::get_workspace_size(args);
  void* ws = ws_bytes == 0 ? nullptr : ws_buf.get(ws_bytes);
  check(gemm.initialize(args, ws, s), "initialize", g);
  check(gemm.run(s), "launch", g);
}

}  // namespace

void sm90_grouped_gemm(const Sm90GroupedArgs& g, Sm90GroupedTile tile, cudaStream_t s) {
  using T128x128 = Shape<_128, _128, _64>;
  using T128x16 = Shape<_128, _16, _64>;
  using T128x64 = Shape<_128, _64, _64>;
  switch (tile) {
    case Sm90GroupedTile::k128x128:
      g.bf16 ? run<cutlass::bfloat16_t, T128x128, false>(g, s)
             : run<cutlass::half_t, T128x128, false>(g, s);
      return;
    case Sm90GroupedTile::kSwap128x16:
      g.bf16 ? run<cutlass::bfloat16_t, T128x16, true>(g, s)
             : run<cutlass::half_t, T128x16, true>(g, s);
      return;
    case Sm90GroupedTile::kSwap128x64:
      g.bf16 ? run<cutlass::bfloat16_t, T128x64, true>(g, s)
             : run<cutlass::half_t, T128x64, true>(g, s);
      return;
  }
}

}  // namespace vllmx::cuda
