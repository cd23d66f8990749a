// The CUTLASS 3 Hopper GEMM behind cuda/gemm_sm90.h, as a template the sm_90a translation units
// (gemm_sm90.cu: T-major products; gemm_swap_sm90.cu: the swapped ones) instantiate. Internal
// to those two files: each instantiation costs minutes of compile time, so they are split for a
// parallel build.
//
// Operands in CUTLASS's terms (both layouts K-major, so only the pointers and D's layout change):
// - straight: A = x [M = T, K], B = w [N, K] (w's rows are B's columns), D = out [T, N]
//   row-major, bias per column;
// - swapped (kSwap): A = w [M = N, K], B = x [T, K], D = out^T [N, T], i.e. out read
//   column-major, bias per row. For a few tokens the weight rows fill wgmma's 128-row M tile
//   and the tokens its narrow N tile, where straight they would pad a 128-row tile of x.
// No C source (ElementC = void); the epilogue computes acc + bias in f32 and rounds once to
// bf16/f16. The stream-K scheduler splits the K loop across SMs when the tiles alone are too few
// to fill the GPU (a 4096-wide output at T = 128 is 32 tiles for 132 SMs), with its
// deterministic (turnstile) reduction, so a product's bits do not depend on timing.
#pragma once
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

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
#error "cuda/gemm_*sm90.cu need nvcc >= 12.0 (CUTLASS's SM90 GEMM)"
#endif

namespace vllmx::cuda::sm90 {

using namespace cute;

// The epilogue both GEMMs share (this one and gemm_fp8_sm90.cu's): D (out in Element, bf16 /
// f16) = acc + bias in f32, rounded once; D row-major straight, column-major swapped.
template <typename Element, class TileShape, class ClusterShape, bool kSwap,
          class EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative>
struct Sm90Epilogue {
  using LayoutA = cutlass::layout::RowMajor;     // K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // K-major
  using LayoutD =
      std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA

  // The bias is read element by element (alignment 1): it may be a slice of a merged bias.
  using FusionOp = std::conditional_t<
      kSwap,
      cutlass::epilogue::fusion::LinCombPerRowBias<Element, float, Element, Element, float, 1>,
      cutlass::epilogue::fusion::LinCombPerColBias<Element, float, Element, Element, float, 1>>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD,
      Element, LayoutD, kAlignD, EpilogueSchedule, FusionOp>::CollectiveOp;
};

// The kernel's schedule: cooperative (two consumer warpgroups share a tile; the stream-K
// scheduler) or ping-pong (each warpgroup a tile of its own, one's epilogue under the other's
// MMAs; the persistent data-parallel scheduler, the only one CUTLASS gives it).
template <bool kPingpong>
struct Sm90Kernel {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = cutlass::gemm::StreamKScheduler;
};
template <>
struct Sm90Kernel<true> {
  using Mainloop = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
  using Scheduler = cutlass::gemm::PersistentScheduler;
};

template <typename Element, class TileShape, class ClusterShape, bool kSwap,
          bool kPingpong = false>
struct Gemm : Sm90Epilogue<Element, TileShape, ClusterShape, kSwap,
                           typename Sm90Kernel<kPingpong>::Epilogue> {
  using E = Sm90Epilogue<Element, TileShape, ClusterShape, kSwap,
                         typename Sm90Kernel<kPingpong>::Epilogue>;
  using typename E::Epilogue, typename E::LayoutA, typename E::LayoutB;
  static constexpr int kAlign = E::kAlignD;  // A and B in Element too

  // Stages: as many as the shared memory left beside the epilogue's holds.
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element,
      LayoutB, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      typename Sm90Kernel<kPingpong>::Mainloop>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                           typename Sm90Kernel<kPingpong>::Scheduler>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// (rows, 1, batch) strides of a K-major operand or a row-major D: ld elements between rows.
template <class Stride>
Stride row_stride(int64_t ld, int64_t rows) {
  static_assert(is_static_v<decltype(get<1>(Stride{}))>, "the contiguous mode must be static 1");
  Stride st{};
  get<0>(st) = ld;
  get<2>(st) = ld * rows;  // one batch (L = 1); TMA wants it a multiple of 16 bytes like ld
  return st;
}
// (1, cols, batch) strides of a column-major D: ld elements between columns.
template <class Stride>
Stride col_stride(int64_t ld, int64_t cols) {
  static_assert(is_static_v<decltype(get<0>(Stride{}))>, "the contiguous mode must be static 1");
  Stride st{};
  get<1>(st) = ld;
  get<2>(st) = ld * cols;
  return st;
}

// The GEMM's workspace: the stream-K partials and locks (CUTLASS zeroes what it needs on the
// stream in initialize()). Grow-only (runtime.h), so a captured graph's pointer stays valid.
inline void* workspace(size_t bytes) {
  static GrowOnlyBuffer buf;
  return bytes == 0 ? nullptr : buf.get(bytes);
}

inline std::string shapes(const Sm90GemmArgs& a) {
  return "x [" + std::to_string(a.T) + ", " + std::to_string(a.K) + "], w [" +
         std::to_string(a.N) + ", " + std::to_string(a.K) + "]";
}

// Throws naming the op, the CUTLASS step that failed and the problem's shapes.
inline void fail_status(const char* op, const char* what, cutlass::Status st,
                        const std::string& shapes) {
  throw std::runtime_error(std::string(op) + ": CUTLASS sm90 GEMM " + what + " failed (" +
                           cutlassGetStatusString(st) + ") for " + shapes + "; " +
                           cudaGetErrorString(cudaGetLastError()));
}

// A and B's strides (their rows K-major, ld elements apart) and D's (out's rows, ld_out apart:
// row-major straight, column-major swapped), for an M x N problem.
template <class K, bool kSwap>
auto operand_strides(int64_t ld_a, int64_t ld_b, int64_t ld_out, int M, int N) {
  typename K::StrideD sd;
  if constexpr (kSwap)
    sd = col_stride<typename K::StrideD>(ld_out, N);
  else
    sd = row_stride<typename K::StrideD>(ld_out, M);
  return std::make_tuple(row_stride<typename K::StrideA>(ld_a, M),
                         row_stride<typename K::StrideB>(ld_b, N), sd);
}

// The scheduler's arguments from sc: swizzle and raster for any scheduler, the decomposition
// and splits where it is the stream-K one.
template <class SchedulerArgs>
void set_schedule(SchedulerArgs& args, const Sm90Schedule& sc) {
  using cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.max_swizzle_size = sc.swizzle;
  args.raster_order = static_cast<RasterOrderOptions>(sc.raster);
  if constexpr (requires { args.decomposition_mode; }) {
    if (sc.decomposition >= 0)
      args.decomposition_mode =
          static_cast<cutlass::gemm::kernel::detail::DecompositionMode>(sc.decomposition);
    if (sc.splits > 0) args.splits = sc.splits;
  }
}

// can_implement, the workspace, initialize and the launch on stream s; fail(what, status) throws.
template <class Adapter, class Fail>
void launch_adapter(typename Adapter::Arguments& args, int num_sms, cudaStream_t s,
                    const Fail& fail) {
  int device = 0;
  cudaGetDevice(&device);
  args.hw_info.device_id = device;
  args.hw_info.sm_count = num_sms;
  Adapter gemm;
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess) fail("can_implement", st);
  void* ws = workspace(Adapter::get_workspace_size(args));
  if ((st = gemm.initialize(args, ws, s)) != cutlass::Status::kSuccess) fail("initialize", st);
  if ((st = gemm.run(s)) != cutlass::Status::kSuccess) fail("launch", st);
}

template <typename Element, class TileShape, class ClusterShape, bool kSwap,
          bool kPingpong = false>
void run(const Sm90GemmArgs& a, cudaStream_t s) {
  using Adapter = typename Gemm<Element, TileShape, ClusterShape, kSwap, kPingpong>::Adapter;
  using K = typename Adapter::GemmKernel;
  const int M = kSwap ? a.N : a.T, N = kSwap ? a.T : a.N;
  const void* A = kSwap ? a.w : a.x;
  const void* B = kSwap ? a.x : a.w;
  // Rows of x and out may be views into wider rows: their own strides, not K or N.
  const auto [sa, sb, sd] = operand_strides<K, kSwap>(kSwap ? a.w_stride : a.x_stride,
                                                     kSwap ? a.x_stride : a.w_stride,
                                                     a.out_stride, M, N);
  const typename K::StrideC sc = sd;  // no C is read

  typename Adapter::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, a.K, 1},
      {static_cast<const Element*>(A), sa, static_cast<const Element*>(B), sb},
      {{}, nullptr, sc, static_cast<Element*>(a.out), sd}};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.thread.bias_ptr = static_cast<const Element*>(a.bias);  // null: adds zeros
  set_schedule(args.scheduler, a.schedule);
  launch_adapter<Adapter>(args, a.num_sms, s,
                          [&](const char* what, cutlass::Status st) {
                            fail_status("linear", what, st, shapes(a));
                          });
}

// run<> in the product's dtype: bf16 where a.bf16, else f16.
template <class TileShape, class ClusterShape, bool kSwap, bool kPingpong = false>
void run_in_dtype(const Sm90GemmArgs& a, cudaStream_t s) {
  a.bf16 ? run<cutlass::bfloat16_t, TileShape, ClusterShape, kSwap, kPingpong>(a, s)
         : run<cutlass::half_t, TileShape, ClusterShape, kSwap, kPingpong>(a, s);
}

}  // namespace vllmx::cuda::sm90
