// The narrow swapped instantiations of cuda/gemm_sm90.cuh: 128 weight rows on wgmma's M and 16
// or 32 tokens on its N, for decode batches of 9..32 tokens. There the product is a weight
// stream: the TMA pipeline keeps several 16 KB weight tiles in flight per SM and stream-K
// spreads the K loops of the few output tiles (N / 128 of them) over every SM, where the
// mma.sync skinny kernel (gemm_skinny.cu) issues its loads from registers. A file of its own so
// that the build compiles it beside the other instantiations. sm_90a only.
#include "gemm_sm90.cuh"

namespace vllmx::cuda {

void sm90_gemm_swapped_narrow(const Sm90GemmArgs& a, Sm90Tile tile, cudaStream_t s) {
  using namespace cute;
  using T128x16 = Shape<_128, _16, _64>;
  using T128x32 = Shape<_128, _32, _64>;
  using C1x1 = Shape<_1, _1, _1>;
  if (tile == Sm90Tile::kSwap128x16)
    sm90::run_in_dtype<T128x16, C1x1, true>(a, s);
  else
    sm90::run_in_dtype<T128x32, C1x1, true>(a, s);
}

}  // namespace vllmx::cuda
