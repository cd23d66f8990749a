// sm90_grouped_fp8_gemm (cuda/gemm_sm90.h): fused_experts' products on fp8 experts (vLLM's
// block-fp8 MoE, W8A8): CUTLASS 3's pointer-array GEMM with the blockwise-scaled fp8 mainloop,
// one group an expert as in gemm_grouped_sm90.cu, every 128-wide group of K scaled as it is
// promoted into the f32 accumulators, the expert's weight scale per row and group times its
// rows' scales per row and group (fused_experts quantizes each row per 128 values, as
// per_token_group_quant_fp8 does). Group e's operands, scale blocks and scale layouts come from
// device arrays grouped_fp8_args_kernel fills on the stream, so no host sync here either.
//
// Scales MN-major, as gemm_fp8_sm90.cu's: the weight's [K / 128][N] an expert; the rows'
// [K / 128][m] in a block of their expert's own (the layout CUTLASS derives from the group's
// shape), from x_scale + first * K / 128.
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gemm_fp8_sm90.cuh"
#include "gemm_grouped_sm90.cuh"

namespace vllmx::cuda {

namespace {

using namespace grouped;
using sm90::E8;

template <typename Element, class TileShape, bool kSwap>
struct GroupedFp8 : GroupedEpilogue<Element, TileShape, kSwap> {
  using E = GroupedEpilogue<Element, TileShape, kSwap>;
  using typename E::Epilogue, typename E::LayoutA, typename E::LayoutB;
  using ScaleConfig = sm90::Fp8ScaleConfig;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E8,
      cute::tuple<LayoutA*, LayoutSFA*>, sm90::kAlignFp8, E8, cute::tuple<LayoutB*, LayoutSFB*>,
      sm90::kAlignFp8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

template <class G, typename Element, bool kSwap>
__global__ void grouped_fp8_args_kernel(Sm90GroupedFp8Args f, Shape3* shape, const E8** a,
                                        const E8** b, Element** d, typename G::StrideA* sa,
                                        typename G::StrideB* sb, typename G::StrideD* sd,
                                        const float** sfa, const float** sfb,
                                        typename G::LayoutSFA* lsa,
                                        typename G::LayoutSFB* lsb) {
  pdl_begin();
  const Sm90GroupedArgs& g = f.g;
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= g.experts) return;
  const int64_t first = g.expert_first[e];
  const E8* rows = static_cast<const E8*>(g.x) + first * g.x_stride;
  const E8* w = static_cast<const E8*>(g.w) + e * g.w_expert_stride;
  const float* rows_scale = f.x_scale + first * (g.K / kFp8Group);
  const float* w_scale = f.w_scale + e * f.w_scale_expert_stride;
  d[e] = static_cast<Element*>(g.out) + first * g.out_stride;
  a[e] = kSwap ? w : rows;
  b[e] = kSwap ? rows : w;
  sfa[e] = kSwap ? w_scale : rows_scale;
  sfb[e] = kSwap ? rows_scale : w_scale;
  group_problem<kSwap>(g, e, shape, sa, sb, sd);
  const auto mnk = make_shape(get<0>(shape[e]), get<1>(shape[e]), g.K, 1);
  lsa[e] = G::ScaleConfig::tile_atom_to_shape_SFA(mnk);
  lsb[e] = G::ScaleConfig::tile_atom_to_shape_SFB(mnk);
}

template <typename Element, class TileShape, bool kSwap>
void run(const Sm90GroupedFp8Args& f, cudaStream_t s) {
  using G = GroupedFp8<Element, TileShape, kSwap>;
  using Adapter = typename G::Adapter;
  const Sm90GroupedArgs& g = f.g;
  auto [shape, a, b, d, sa, sb, sd, sfa, sfb, lsa, lsb] =
      device_arrays<Shape3, const E8*, const E8*, Element*, typename G::StrideA,
                    typename G::StrideB, typename G::StrideD, const float*, const float*,
                    typename G::LayoutSFA, typename G::LayoutSFB>(g.experts);
  launch(grouped_fp8_args_kernel<G, Element, kSwap>, (g.experts + 127) / 128, 128, 0, s, f,
         shape, a, b, d, sa, sb, sd, sfa, sfb, lsa, lsb);
  check_launch("grouped_fp8_args_kernel");

  typename Adapter::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {g.experts, shape, nullptr},  // shapes on the device only
                                   {a, sa, b, sb, sfa, lsa, sfb, lsb},
                                   {{}, nullptr, sd, d, sd}};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  launch_grouped<Adapter>(args, g, "fp8", s);
}

template <typename Element>
void dispatch(const Sm90GroupedFp8Args& f, Sm90GroupedTile tile, cudaStream_t s) {
  // K tiles of 128: one scale group a k-block.
  switch (tile) {
    case Sm90GroupedTile::k128x128:
      return run<Element, Shape<_128, _128, _128>, false>(f, s);
    case Sm90GroupedTile::kSwap128x16:
      return run<Element, Shape<_128, _16, _128>, true>(f, s);
    case Sm90GroupedTile::kSwap128x64:
      return run<Element, Shape<_128, _64, _128>, true>(f, s);
  }
}

}  // namespace

void sm90_grouped_fp8_gemm(const Sm90GroupedFp8Args& f, Sm90GroupedTile tile, cudaStream_t s) {
  f.g.bf16 ? dispatch<cutlass::bfloat16_t>(f, tile, s) : dispatch<cutlass::half_t>(f, tile, s);
}

}  // namespace vllmx::cuda
