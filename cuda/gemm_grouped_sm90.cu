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
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gemm_grouped_sm90.cuh"

namespace vllmx::cuda {

namespace {

using namespace grouped;

// The operands' roles: gemm_grouped_sm90.cuh.
template <typename Element, class TileShape, bool kSwap>
struct Grouped : GroupedEpilogue<Element, TileShape, kSwap> {
  using E = GroupedEpilogue<Element, TileShape, kSwap>;
  using typename E::Epilogue, typename E::LayoutA, typename E::LayoutB;
  static constexpr int kAlign = E::kAlignD;  // A and B in Element too

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element,
      LayoutB*, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

// Group e: rows expert_rows[e] from row expert_first[e] of x and of out, against w's expert e.
template <class G, typename Element, bool kSwap>
__global__ void grouped_args_kernel(Sm90GroupedArgs g, Shape3* shape, const Element** a,
                                    const Element** b, Element** d, typename G::StrideA* sa,
                                    typename G::StrideB* sb, typename G::StrideD* sd) {
  pdl_begin();
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= g.experts) return;
  const int64_t first = g.expert_first[e];
  const Element* rows = static_cast<const Element*>(g.x) + first * g.x_stride;
  const Element* w = static_cast<const Element*>(g.w) + e * g.w_expert_stride;
  d[e] = static_cast<Element*>(g.out) + first * g.out_stride;
  a[e] = kSwap ? w : rows;
  b[e] = kSwap ? rows : w;
  group_problem<kSwap>(g, e, shape, sa, sb, sd);
}

template <typename Element, class TileShape, bool kSwap>
void run(const Sm90GroupedArgs& g, cudaStream_t s) {
  using G = Grouped<Element, TileShape, kSwap>;
  using Adapter = typename G::Adapter;
  auto [shape, a, b, d, sa, sb, sd] =
      device_arrays<Shape3, const Element*, const Element*, Element*, typename G::StrideA,
                    typename G::StrideB, typename G::StrideD>(g.experts);
  launch(grouped_args_kernel<G, Element, kSwap>, (g.experts + 127) / 128, 128, 0, s, g, shape,
         a, b, d, sa, sb, sd);
  check_launch("grouped_args_kernel");

  typename Adapter::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {g.experts, shape, nullptr},  // shapes on the device only
                                   {a, sa, b, sb},
                                   {{}, nullptr, sd, d, sd}};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  launch_grouped<Adapter>(args, g, "bf16/f16", s);
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
