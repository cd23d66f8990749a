// The prefill-sized tiles (linear_plan.cu's plan_sm90 picks them by T), instantiations of
// cuda/gemm_sm90.cuh in a file of their own for a parallel build: kPingpong128x128 (128 tokens
// x 128 weight rows a warpgroup, x tiles multicast to a 1x2 cluster) and k256x128 (the
// cooperative kernel on 256 tokens x 128 weight rows, 1x2 cluster), and both on 2x1 clusters
// (weight tiles multicast to two token tiles, which the benchmark forces so far). sm_90a only.
#include "gemm_sm90.cuh"

namespace vllmx::cuda {

void sm90_gemm_prefill(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s) {
  using namespace cute;
  using T128x128 = Shape<_128, _128, _64>;
  using T256x128 = Shape<_256, _128, _64>;
  using C1x2 = Shape<_1, _2, _1>;
  using C2x1 = Shape<_2, _1, _1>;
  switch (tile) {
    case Sm90Tile::kPingpong128x128: sm90::run_in_dtype<T128x128, C1x2, false, true>(a, s); return;
    case Sm90Tile::kPingpong128x128c21:
      sm90::run_in_dtype<T128x128, C2x1, false, true>(a, s);
      return;
    case Sm90Tile::k256x128c21: sm90::run_in_dtype<T256x128, C2x1, false>(a, s); return;
    default: sm90::run_in_dtype<T256x128, C1x2, false>(a, s); return;
  }
}

}  // namespace vllmx::cuda
