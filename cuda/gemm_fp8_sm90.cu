// fp8 e4m3 GEMM with block scales for Hopper (sm_90a) through CUTLASS 3 (interface:
// cuda/gemm_sm90.h, sm90_fp8_gemm): fp8 wgmma (twice bf16's rate), f32 accumulation, and each
// 128-wide group of K scaled as it is promoted into the accumulators (CUTLASS's blockwise-scaling
// mainloop), so one kernel serves every fp8 checkpoint layout: a weight's per-tensor,
// per-channel or 128 x 128 block scales written out per row and K group, and the activations'
// per-token, per-128-group dynamic scales (vLLM's per_token_group_quant_fp8, DeepSeek's
// scheme). The same operand roles as the bf16 GEMM (cuda/gemm_sm90.cuh): straight (A = x,
// B = w, out row-major, bias per column) or, for few tokens, swapped (A = w, B = x, out read
// column-major, bias per row), where the weight rows fill wgmma's 128-row M tile. Scales are
// MN-major, [K / 128][rows] (consecutive rows' scales adjacent), as the quantization kernel
// writes them; the epilogue adds the bias in f32 and rounds once to bf16 / f16.
#include "gemm_fp8_sm90.cuh"
#include "gemm_sm90.cuh"

namespace vllmx::cuda {

namespace sm90 {

// Scheduler: the stream-K one where the tiles are fewer than the SMs (K loops spread over
// them); the persistent one, with 2-CTA clusters sharing x's tiles, for straight tiles that
// fill the GPU more than once (prefill chunks), as vLLM's blockwise fp8 GEMM runs them.
template <typename Element, class TileShape, bool kSwap,
          class ClusterShape = Shape<_1, _1, _1>, class Scheduler = cutlass::gemm::StreamKScheduler>
struct Fp8Gemm {
  using E = Sm90Epilogue<Element, TileShape, ClusterShape, kSwap>;
  using ScaleConfig = Fp8ScaleConfig;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E8,
      cute::tuple<typename E::LayoutA, LayoutSFA>, kAlignFp8, E8,
      cute::tuple<typename E::LayoutB, LayoutSFB>, kAlignFp8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename E::Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                      typename E::Epilogue, Scheduler>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

inline std::string fp8_shapes(const Sm90Fp8GemmArgs& a) {
  return "fp8 x [" + std::to_string(a.T) + ", " + std::to_string(a.K) + "], w [" +
         std::to_string(a.N) + ", " + std::to_string(a.K) + "]";
}

template <typename Element, class TileShape, bool kSwap, class... Config>
void run_fp8(const Sm90Fp8GemmArgs& a, cudaStream_t s) {
  using G = Fp8Gemm<Element, TileShape, kSwap, Config...>;
  using Adapter = typename G::Adapter;
  using K = typename Adapter::GemmKernel;
  const int M = kSwap ? a.N : a.T, N = kSwap ? a.T : a.N;
  const void* A = kSwap ? a.w : a.x;
  const void* B = kSwap ? a.x : a.w;
  const float* SA = kSwap ? a.w_scale : a.x_scale;
  const float* SB = kSwap ? a.x_scale : a.w_scale;
  const auto [sa, sb, sd] = operand_strides<K, kSwap>(kSwap ? a.w_stride : a.x_stride,
                                                     kSwap ? a.x_stride : a.w_stride,
                                                     a.out_stride, M, N);
  const typename K::StrideC sc = sd;  // no C is read
  const auto shape = make_shape(M, N, a.K, 1);

  typename Adapter::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, a.K, 1},
      {static_cast<const E8*>(A), sa, static_cast<const E8*>(B), sb, SA,
       G::ScaleConfig::tile_atom_to_shape_SFA(shape), SB,
       G::ScaleConfig::tile_atom_to_shape_SFB(shape)},
      {{}, nullptr, sc, static_cast<Element*>(a.out), sd}};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.thread.bias_ptr = static_cast<const Element*>(a.bias);  // null: adds zeros
  set_schedule(args.scheduler, a.schedule);
  launch_adapter<Adapter>(args, a.num_sms, s,
                          [&](const char* what, cutlass::Status st) {
                            fail_status("scaled_mm", what, st, fp8_shapes(a));
                          });
}

template <typename Element>
void dispatch_fp8(const Sm90Fp8GemmArgs& a, Sm90Tile tile, cudaStream_t s) {
  // K tiles of 128: one scale group a k-block (the mainloop promotes every 128).
  switch (tile) {
    case Sm90Tile::kSwap128x16:
      return run_fp8<Element, Shape<_128, _16, _128>, true>(a, s);
    case Sm90Tile::kSwap128x64:
      return run_fp8<Element, Shape<_128, _64, _128>, true>(a, s);
    case Sm90Tile::k128x128: {
      // Past a wave of tiles the persistent scheduler on clusters; within one, stream-K spreads
      // the K loops over the SMs the tiles leave idle (T = 128, N = 4096: 32 tiles).
      const int64_t tiles = (a.T + 127) / 128 * ((a.N + 127) / 128);
      if (tiles > a.num_sms)
        return run_fp8<Element, Shape<_128, _128, _128>, false, Shape<_1, _2, _1>,
                       cutlass::gemm::PersistentScheduler>(a, s);
      return run_fp8<Element, Shape<_128, _128, _128>, false>(a, s);
    }
    default:
      throw std::runtime_error("scaled_mm: no fp8 GEMM tile " +
                               std::to_string(static_cast<int>(tile)) + " for " + fp8_shapes(a));
  }
}

}  // namespace sm90

void sm90_fp8_gemm(const Sm90Fp8GemmArgs& a, Sm90Tile tile, cudaStream_t s) {
  a.bf16 ? sm90::dispatch_fp8<cutlass::bfloat16_t>(a, tile, s)
         : sm90::dispatch_fp8<cutlass::half_t>(a, tile, s);
}

}  // namespace vllmx::cuda
