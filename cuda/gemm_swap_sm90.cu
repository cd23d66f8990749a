// The swapped instantiations of cuda/gemm_sm90.cuh (weight rows on wgmma's M, tokens on a
// 64- or 128-wide N tile): sm90_gemm's path for 32 < T <= 128. sm_90a only.
#include "gemm_sm90.cuh"

namespace vllmx::cuda {

void sm90_gemm_swapped(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s) {
  using namespace cute;
  using T128x64 = Shape<_128, _64, _64>;
  using T128x128 = Shape<_128, _128, _64>;
  using C1x1 = Shape<_1, _1, _1>;
  if (tile == Sm90Tile::kSwap128x64)
    sm90::run_in_dtype<T128x64, C1x1, true>(a, s);
  else
    sm90::run_in_dtype<T128x128, C1x1, true>(a, s);
}

}  // namespace vllmx::cuda
