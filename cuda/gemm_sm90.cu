// sm90_gemm (cuda/gemm_sm90.h): the straight (T-major) instantiations of cuda/gemm_sm90.cuh
// and the dispatcher; the swapped ones are in gemm_swap_sm90.cu. Built for sm_90a only
// (CMakeLists.txt): wgmma and the warp-specialized pipeline exist there alone.
#include "gemm_sm90.cuh"

namespace vllmx::cuda {

void sm90_gemm(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s) {
  using namespace cute;
  using T128x128 = Shape<_128, _128, _64>;
  using T128x256 = Shape<_128, _256, _64>;
  using C1x2 = Shape<_1, _2, _1>;
  using C2x1 = Shape<_2, _1, _1>;
  switch (tile) {
    case Sm90Tile::kSwap128x16:
    case Sm90Tile::kSwap128x32: sm90_gemm_swapped_narrow(a, tile, s); return;
    case Sm90Tile::kSwap128x64:
    case Sm90Tile::kSwap128x128: sm90_gemm_swapped(a, tile, s); return;
    case Sm90Tile::kPingpong128x128:
    case Sm90Tile::k256x128:
    case Sm90Tile::kPingpong128x128c21:
    case Sm90Tile::k256x128c21: sm90_gemm_prefill(a, tile, s); return;
    case Sm90Tile::k128x32:
    case Sm90Tile::k128x64:
    case Sm90Tile::k128x32c21:
    case Sm90Tile::k128x64c21:
    case Sm90Tile::k128x128c21: sm90_gemm_decode(a, tile, s); return;
    case Sm90Tile::k128x256:
      sm90::run_in_dtype<T128x256, C2x1, false>(a, s);
      return;
    case Sm90Tile::k128x128:
      sm90::run_in_dtype<T128x128, C1x2, false>(a, s);
      return;
  }
}

}  // namespace vllmx::cuda
