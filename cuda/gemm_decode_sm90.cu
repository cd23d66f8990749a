// The decode-sized straight tiles (linear_plan.cu's plan_sm90), instantiations of
// cuda/gemm_sm90.cuh in a file of their own for a parallel build: 128 tokens x 32 or 64 weight
// rows, cooperative, x tiles multicast to a 1x2 cluster, for decode batches of 65-256 tokens.
// There a 128-row weight tile (swapped or straight) leaves a 4096-row product 32 tiles a token
// tile (a quarter of the SMs, or split-K's fix-ups); 32 rows make it 128, each a whole K loop.
// And the 2x1-cluster twins of these and of k128x128 (gemm_sm90.h), which share weight tiles
// between two token tiles instead of x tiles between two weight tiles. sm_90a only.
#include "gemm_sm90.cuh"

namespace vllmx::cuda {

void sm90_gemm_decode(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s) {
  using namespace cute;
  using T128x32 = Shape<_128, _32, _64>;
  using T128x64 = Shape<_128, _64, _64>;
  using T128x128 = Shape<_128, _128, _64>;
  using C1x2 = Shape<_1, _2, _1>;
  using C2x1 = Shape<_2, _1, _1>;
  switch (tile) {
    case Sm90Tile::k128x32: sm90::run_in_dtype<T128x32, C1x2, false>(a, s); return;
    case Sm90Tile::k128x32c21: sm90::run_in_dtype<T128x32, C2x1, false>(a, s); return;
    case Sm90Tile::k128x64c21: sm90::run_in_dtype<T128x64, C2x1, false>(a, s); return;
    case Sm90Tile::k128x128c21: sm90::run_in_dtype<T128x128, C2x1, false>(a, s); return;
    default: sm90::run_in_dtype<T128x64, C1x2, false>(a, s); return;
  }
}

}  // namespace vllmx::cuda
