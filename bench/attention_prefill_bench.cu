// Prefill attention alone: Hopper's two prefill kernels (cuda/attention_prefill_sm90.cu, "main",
// and the long prompts' attention_prefill_ws_sm90.cu, "ws") on a paged bf16 cache,
// checked against a float64 reference on the host (every row of small cases, a sample of rows
// of large ones; the output poisoned with NaN first) and timed with events. No Python, no torch:
// built here with nvcc and run on the GPU machine as it is, also under ncu.
//
//   CUTE=$(python -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))")/source/include
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Icsrc -Icuda -I$CUTE \
//       -o /tmp/attn_prefill_bench bench/attention_prefill_bench.cu \
//       cuda/attention_prefill_sm90.cu cuda/attention_prefill_ws_sm90.cu cuda/tma_sm90.cu \
//       cuda/runtime.cu
//   /tmp/attn_prefill_bench                        # the default cases
//   /tmp/attn_prefill_bench 1:8192:0:32:8:128:16   # B:QLEN:PREFIX:NQ:NKV:D:BLOCK
//
// A case is B sequences of QLEN queries after PREFIX cached keys each (causal), NQ / NKV heads of
// size D, a cache of BLOCK-token blocks (shuffled tables). Prints ms a launch and TFLOP/s
// (4 D flops per visible (query head, key) pair).
//
// A candidate kernel times beside it in the same run: -DVLLMX_PREFILL_VARIANT_ROWS=N links
// launch_prefill_sm90_variant (rows per CTA N; its arguments those of launch_prefill_sm90 and
// the cache's token slots, for tensor maps), from a file added to the command above.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "bf16_host.h"
#include "runtime.h"

#ifdef VLLMX_PREFILL_VARIANT_ROWS
namespace vllmx::cuda::attn {
void launch_prefill_sm90_variant(const AttnArgs& a, int grid_x, int D, bool bf16_cache,
                                 int64_t cache_slots, cudaStream_t s);
}
#endif

namespace apb {

using namespace vllmx::cuda;
using namespace vllmx::cuda::attn;

struct Case {
  int B, q_len, prefix, nq, nkv, D, bs;
};

using bench::from_bf16;
using bench::to_bf16;

// schedule_kernel's tile list (cuda/attention.cu), on the host: (sequence, first row) for each
// bm rows of every sequence with >= 2 queries.
std::vector<int2> tile_list(const Case& c, int bm) {
  std::vector<int2> t;
  const int rows = c.q_len * (c.nq / c.nkv);
  for (int b = 0; b < c.B; ++b)
    for (int r = 0; r < rows; r += bm) t.push_back(make_int2(b, r));
  return t;
}

template <typename F>
float time_ms(F&& launch_once, int reps) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  launch_once();  // warm-up
  float best = 1e30f;
  for (int t = 0; t < 5; ++t) {
    cudaEventRecord(e0, stream());
    for (int r = 0; r < reps; ++r) launch_once();
    cudaEventRecord(e1, stream());
    check_cuda(cudaEventSynchronize(e1), "timed launches");
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms / reps);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

void run_case(const Case& c) {
  const int G = c.nq / c.nkv, ctx = c.prefix + c.q_len, nblk = (ctx + c.bs - 1) / c.bs;
  const int T = c.B * c.q_len;
  const size_t row = size_t(c.nkv) * c.D;
  const int blocks = c.B * nblk + 3;
  const size_t cache_elems = size_t(blocks) * c.bs * row;
  std::mt19937 rng(99 + c.B * 7 + c.q_len + c.D);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> hk(cache_elems), hv(cache_elems), hq(size_t(T) * c.nq * c.D);
  for (auto& x : hk) x = to_bf16(nd(rng));
  for (auto& x : hv) x = to_bf16(nd(rng));
  for (auto& x : hq) x = to_bf16(2.f * nd(rng));  // peaked softmax rows too
  std::vector<int32_t> ids(blocks);
  for (int i = 0; i < blocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> hbt(size_t(c.B) * nblk), hqsl(c.B + 1), hlen(c.B, ctx);
  for (size_t i = 0; i < hbt.size(); ++i) hbt[i] = ids[i];
  for (int b = 0; b <= c.B; ++b) hqsl[b] = b * c.q_len;

  auto* kc = static_cast<uint16_t*>(device_malloc(cache_elems * 2));
  auto* vc = static_cast<uint16_t*>(device_malloc(cache_elems * 2));
  auto* q = static_cast<uint16_t*>(device_malloc(hq.size() * 2));
  auto* out = static_cast<uint16_t*>(device_malloc(hq.size() * 2));
  auto* bt = static_cast<int32_t*>(device_malloc(hbt.size() * 4));
  auto* qsl = static_cast<int32_t*>(device_malloc(hqsl.size() * 4));
  auto* lens = static_cast<int32_t*>(device_malloc(hlen.size() * 4));
  memcpy_h2d(kc, hk.data(), cache_elems * 2);
  memcpy_h2d(vc, hv.data(), cache_elems * 2);
  memcpy_h2d(q, hq.data(), hq.size() * 2);
  memcpy_h2d(bt, hbt.data(), hbt.size() * 4);
  memcpy_h2d(qsl, hqsl.data(), hqsl.size() * 4);
  memcpy_h2d(lens, hlen.data(), hlen.size() * 4);

  // Rows checked: all of a small case, else 96 random (token, head) rows and the last token's.
  std::vector<std::pair<int, int>> rows;
  const double ref_cost = double(T) * c.nq * ctx * c.D;
  if (ref_cost < 3e9) {
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < c.nq; ++h) rows.push_back({t, h});
  } else {
    std::uniform_int_distribution<int> ut(0, T - 1), uh(0, c.nq - 1);
    for (int i = 0; i < 96; ++i) rows.push_back({ut(rng), uh(rng)});
    for (int h = 0; h < c.nq; h += 7) rows.push_back({T - 1, h});
  }
  const double scale = 1.0 / std::sqrt(double(c.D));
  std::vector<double> ref(rows.size() * c.D);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int t = rows[i].first, h = rows[i].second, b = t / c.q_len, kvh = h / G;
    const int pos = c.prefix + t % c.q_len;  // visible keys 0 .. pos
    std::vector<double> s(pos + 1);
    double mx = -1e300;
    for (int k = 0; k <= pos; ++k) {
      const size_t slot = size_t(hbt[size_t(b) * nblk + k / c.bs]) * c.bs + k % c.bs;
      double acc = 0;
      for (int d = 0; d < c.D; ++d)
        acc += from_bf16(hq[(size_t(t) * c.nq + h) * c.D + d]) *
               from_bf16(hk[slot * row + kvh * c.D + d]);
      s[k] = acc * scale;
      mx = std::max(mx, s[k]);
    }
    double sum = 0;
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int d = 0; d < c.D; ++d) {
      double o = 0;
      for (int k = 0; k <= pos; ++k) {
        const size_t slot = size_t(hbt[size_t(b) * nblk + k / c.bs]) * c.bs + k % c.bs;
        o += s[k] * from_bf16(hv[slot * row + kvh * c.D + d]);
      }
      ref[i * c.D + d] = o / sum;
    }
  }

  double pairs = 0;  // visible (query, key) pairs of one query head
  for (int i = 0; i < c.q_len; ++i) pairs += c.prefix + i + 1;
  const double flops = 4.0 * c.D * c.nq * c.B * pairs;

  AttnArgs a{};
  a.q = q, a.out = out, a.kc = kc, a.vc = vc, a.bt = bt, a.qsl = qsl, a.seq_lens = lens;
  a.q_stride = size_t(c.nq) * c.D, a.out_stride = a.q_stride, a.bt_stride = nblk;
  a.B = c.B, a.T = T, a.nq = c.nq, a.nkv = c.nkv, a.G = G, a.D = c.D, a.block_size = c.bs;
  a.scale = static_cast<float>(scale), a.cap = 0.f, a.window = 0, a.q_bf16 = a.out_bf16 = true;
  printf("B=%d q_len=%d prefix=%d heads=%d/%d D=%d block=%d: %.1f GFLOP, %zu rows checked\n",
         c.B, c.q_len, c.prefix, c.nq, c.nkv, c.D, c.bs, flops / 1e9, rows.size());

  auto run = [&](const char* name, int bm, auto launch_kernel) {
    const auto tl = tile_list(c, bm);
    auto* tiles = static_cast<int2*>(device_malloc((tl.size() + 1) * sizeof(int2)));
    memcpy_h2d(tiles, tl.data(), tl.size() * sizeof(int2));
    const int n = static_cast<int>(tl.size());
    memcpy_h2d(reinterpret_cast<int*>(tiles + tl.size()), &n, 4);
    AttnArgs ak = a;
    ak.tiles = tiles, ak.num_tiles = reinterpret_cast<int*>(tiles + tl.size());
    check_cuda(cudaMemset(out, 0xff, hq.size() * 2), "poison");  // bf16 NaN
    launch_kernel(ak, n);
    check_cuda(cudaGetLastError(), "launch");
    synchronize();
    std::vector<uint16_t> hout(hq.size());
    memcpy_d2h(hout.data(), out, hout.size() * 2);
    double err2 = 0, ref2 = 0, worst = 0;
    bool nan = false;
    for (size_t i = 0; i < rows.size(); ++i)
      for (int d = 0; d < c.D; ++d) {
        const double got = from_bf16(hout[(size_t(rows[i].first) * c.nq + rows[i].second) *
                                           c.D + d]);
        const double want = ref[i * c.D + d];
        nan |= !std::isfinite(got);
        err2 += (got - want) * (got - want), ref2 += want * want;
        worst = std::max(worst, std::abs(got - want));
      }
    const double rel = std::sqrt(err2 / std::max(ref2, 1e-300));
    const float ms = time_ms([&] { launch_kernel(ak, n); }, flops > 2e11 ? 10 : 40);
    printf("  %-7s %5d CTAs x %d: %8.3f ms  %6.1f TFLOP/s  rel err %.2e  max|err| %.2e%s\n",
           name, n, c.nkv, ms, flops / ms / 1e9, rel, worst,
           nan || rel > 1e-2 ? "  WRONG" : "");
    device_free(tiles);
  };
  run("main", kSm90PrefillRows, [&](const AttnArgs& ak, int n) {
    launch_prefill_sm90(ak, n, c.D, true, stream());
  });
  if (c.D == 128)
    run("ws", kWsPrefillRows, [&](const AttnArgs& ak, int n) {
      launch_prefill_ws_sm90(ak, n, true, int64_t(blocks) * c.bs, stream());
    });
#ifdef VLLMX_PREFILL_VARIANT_ROWS
  run("variant", VLLMX_PREFILL_VARIANT_ROWS, [&](const AttnArgs& ak, int n) {
    launch_prefill_sm90_variant(ak, n, c.D, true, int64_t(blocks) * c.bs, stream());
  });
#endif
  for (void* p : {static_cast<void*>(kc), static_cast<void*>(vc), static_cast<void*>(q),
                  static_cast<void*>(out), static_cast<void*>(bt), static_cast<void*>(qsl),
                  static_cast<void*>(lens)})
    device_free(p);
}

}  // namespace apb

int main(int argc, char** argv) {
  using namespace apb;
  std::vector<Case> cases;
  for (int i = 1; i < argc; ++i) {
    Case c{};
    if (sscanf(argv[i], "%d:%d:%d:%d:%d:%d:%d", &c.B, &c.q_len, &c.prefix, &c.nq, &c.nkv, &c.D,
               &c.bs) != 7 || c.nq % c.nkv != 0 || (c.D != 64 && c.D != 128) || c.q_len < 2) {
      fprintf(stderr, "a case is B:QLEN:PREFIX:NQ:NKV:D:BLOCK (D 64 or 128, QLEN >= 2), got %s\n",
              argv[i]);
      return 2;
    }
    cases.push_back(c);
  }
  // Llama-3-8B's heads (32/8), Qwen3-30B-A3B's (32/4), D 64, odd blocks; 8192 keys in blocks
  // of 128 too (a TMA-fed kernel's boxes are a block's rows: 16 of them per 128-key K/V tile at
  // the engine's 16, 2 at 128).
  if (cases.empty())
    cases = {{1, 4096, 0, 32, 8, 128, 16},  {8, 1024, 0, 32, 8, 128, 16},
             {1, 8192, 0, 32, 8, 128, 16},  {1, 8192, 0, 32, 8, 128, 128},
             {2, 2048, 6000, 32, 8, 128, 16},
             {4, 1024, 0, 32, 4, 128, 16},  {4, 1024, 0, 16, 8, 64, 16},
             {3, 300, 77, 32, 8, 128, 7},   {2, 700, 100, 12, 4, 128, 528},
             {5, 37, 3, 32, 8, 128, 16},    {2, 129, 0, 16, 16, 64, 256}};
  printf("%s, %d SMs\n", device_name().c_str(), num_sms());
  for (const auto& c : cases) run_case(c);
  return 0;
}
