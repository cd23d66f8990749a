// The CUTLASS 3 Hopper GEMM behind cuda/gemm_sm90.h. Built for sm_90a only (CMakeLists.txt):
// wgmma and the warp-specialized pipeline exist there alone, and each instantiation costs
// minutes of compile time, so the other architectures never see this file.
//
// Operands in CUTLASS's terms: A = x [M = T, K] row-major (K-major), B = w seen as [K, N]
// column-major (also K-major: w's rows are B's columns), D = out [T, N] row-major. No C source
// (ElementC = void); the epilogue computes acc + bias[n] in f32 and rounds once to bf16/f16.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "gemm_sm90.h"
#include "runtime.h"

#if !defined(CUTLASS_ARCH_MMA_SM90_SUPPORTED)
#error "cuda/gemm_sm90.cu needs nvcc >= 12.0 (CUTLASS's SM90 GEMM)"
#endif

namespace vllmx::cuda {

namespace {

using namespace cute;

template <typename Element, class TileShape, class ClusterShape>
struct Sm90Gemm {
  using Layout = cutlass::layout::RowMajor;  // x and out; w is ColumnMajor as B
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA

  using FusionOp = cutlass::epilogue::fusion::LinCombPerColBias<
      Element, float, /*ElementBias=*/Element, /*ElementSource=*/Element, /*ElementScalar=*/float>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Layout, kAlign,
      Element, Layout, kAlign, cutlass::epilogue::TmaWarpSpecializedCooperative,
      FusionOp>::CollectiveOp;

  // Stages: as many as the shared memory left beside the epilogue's holds.
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, Layout, kAlign, Element,
      cutlass::layout::ColumnMajor, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// (rows, 1, batch) strides of a K-major or N-major operand: ld elements between rows.
template <class Stride>
Stride row_stride(int64_t ld, int64_t rows) {
  static_assert(is_static_v<decltype(get<1>(Stride{}))>, "the contiguous mode must be static 1");
  Stride st{};
  get<0>(st) = ld;
  get<2>(st) = ld * rows;  // one batch (L = 1); TMA wants it a multiple of 16 bytes like ld
  return st;
}

// The GEMM's workspace (runtime.h: GrowOnlyBuffer). The persistent scheduler with this
// epilogue asks for none; this is for safety.
void* workspace(size_t bytes) {
  static GrowOnlyBuffer buf;
  return bytes == 0 ? nullptr : buf.get(bytes);
}

std::string shapes(const Sm90GemmArgs& a) {
  return "x [" + std::to_string(a.T) + ", " + std::to_string(a.K) + "], w [" +
         std::to_string(a.N) + ", " + std::to_string(a.K) + "]";
}

void check(cutlass::Status st, const char* what, const Sm90GemmArgs& a) {
  if (st != cutlass::Status::kSuccess)
    throw std::runtime_error(std::string("linear: CUTLASS sm90 GEMM ") + what + " failed (" +
                             cutlassGetStatusString(st) + ") for " + shapes(a) + "; " +
                             cudaGetErrorString(cudaGetLastError()));
}

template <typename Element, class TileShape, class ClusterShape>
void run(const Sm90GemmArgs& a, cudaStream_t s) {
  using G = Sm90Gemm<Element, TileShape, ClusterShape>;
  using Gemm = typename G::Gemm;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  const int M = a.T, N = a.N, K = a.K;

  // Rows of x and out may be views into wider rows: their own strides, not K or N.
  const StrideA sa = row_stride<StrideA>(a.x_stride, M);
  const StrideB sb = row_stride<StrideB>(a.w_stride, N);
  const StrideC sc = row_stride<StrideC>(a.out_stride, M);  // no C is read
  const StrideD sd = row_stride<StrideD>(a.out_stride, M);

  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {static_cast<const Element*>(a.x), sa, static_cast<const Element*>(a.w), sb},
      {{}, nullptr, sc, static_cast<Element*>(a.out), sd}};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.thread.bias_ptr = static_cast<const Element*>(a.bias);  // null: adds zeros
  int device = 0;
  cudaGetDevice(&device);
  args.hw_info.device_id = device;
  args.hw_info.sm_count = a.num_sms;

  Gemm gemm;
  check(gemm.can_implement(args), "can_implement", a);
  void* ws = workspace(Gemm::get_workspace_size(args));
  check(gemm.initialize(args, ws, s), "initialize", a);
  check(gemm.run(s), "launch", a);
}

}  // namespace

void sm90_gemm(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s) {
  using T128x128 = Shape<_128, _128, _64>;
  using T128x256 = Shape<_128, _256, _64>;
  using C1x2 = Shape<_1, _2, _1>;
  using C2x1 = Shape<_2, _1, _1>;
  if (a.bf16) {
    if (tile == Sm90Tile::k128x256)
      run<cutlass::bfloat16_t, T128x256, C2x1>(a, s);
    else
      run<cutlass::bfloat16_t, T128x128, C1x2>(a, s);
  } else {
    if (tile == Sm90Tile::k128x256)
      run<cutlass::half_t, T128x256, C2x1>(a, s);
    else
      run<cutlass::half_t, T128x128, C1x2>(a, s);
  }
}

}  // namespace vllmx::cuda
