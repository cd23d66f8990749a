// Decode attention alone: cuda/attention_decode.cu's kernel on a paged bf16 cache, checked
// against a float64 reference on the host and timed in CUDA graphs over rotated copies of the
// cache (a model's layers never find their K/V in L2), beside a kernel that only streams the
// same bytes (what one launch reading them can reach). No Python, no torch: built here with nvcc
// and run on the GPU machine as it is, also under ncu.
//
//   nvcc -O3 -std=c++20 -arch=sm_90a -lineinfo -Icsrc -Icuda -o /tmp/attn_decode_bench \
//       bench/attention_decode_bench.cu cuda/runtime.cu
//   /tmp/attn_decode_bench                      # the default cases
//   /tmp/attn_decode_bench 8x1088x32x8 1x8192x32x4 --splits 1,4,17
//   /tmp/attn_decode_bench 1x1088x16x2x256 8x1088x16x2x256    # Qwen3.5's gated attention
//
// A case is BxCTXxNQxNKV[xD] (head size D 64, 128 (the default) or 256 (Hopper only), block
// size 16); --splits forces the partition count (else plan_attention's rule). Prints µs a
// launch and the KV read rate.
#include "../cuda/attention_decode.cu"
#include "bf16_host.h"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace adb {  // (named: nvcc's stubs cannot tell two anonymous namespaces apart here)

using namespace vllmx::cuda;
using namespace vllmx::cuda::attn;

constexpr int kBs = 16;
constexpr size_t kRotateBytes = size_t(512) << 20;  // copies of the cache: >> the 50 MB L2

struct Case {
  int B, ctx, nq, nkv, D;
};

// Every thread xors its 16-byte chunks of [p, p + n): the bytes one launch can stream.
__global__ void stream_kernel(const uint4* p, size_t n, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) *sink = acc;  // keeps the loads
}

using bench::from_bf16;
using bench::to_bf16;

// plan_attention's decode rule (cuda/attention.cu): every CTA resident, kDecCtasPerSm an SM,
// partitions of >= kMinPartition keys.
int planned_splits(const Case& c) {
  const int groups = (c.nq / c.nkv + kDecMaxG - 1) / kDecMaxG;
  const int base = std::max(1, c.B * c.nkv * groups);
  int s = (c.D == 256 ? 1 : kDecCtasPerSm) * num_sms() / base;  // (256: one CTA an SM)
  s = std::min(s, (c.ctx + kMinPartition - 1) / kMinPartition);
  return std::clamp(s, 1, kMaxSplits);
}

template <typename F>
float time_graph(F&& body, int reps) {
  cudaStream_t s = stream();
  cudaGraph_t g;
  cudaGraphExec_t ge;
  check_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "capture");
  for (int r = 0; r < reps; ++r) body(r);
  check_cuda(cudaStreamEndCapture(s, &g), "capture end");
  check_cuda(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e30f;
  for (int t = 0; t < 7; ++t) {  // the best of 7 replays (the first warms up)
    cudaEventRecord(e0, s);
    check_cuda(cudaGraphLaunch(ge, s), "graph launch");
    cudaEventRecord(e1, s);
    check_cuda(cudaEventSynchronize(e1), "graph run");
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (t > 0) best = std::min(best, ms);
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return best * 1e3f / reps;  // µs a launch
}

void run_case(const Case& c, const std::vector<int>& split_list) {
  const int kD = c.D, G = c.nq / c.nkv, nblk = (c.ctx + kBs - 1) / kBs;
  const size_t row = size_t(c.nkv) * kD;  // elements of one token's K (all kv heads)
  const size_t copy_blocks = size_t(c.B) * nblk;
  const size_t copy_bytes = copy_blocks * kBs * row * 2 * 2;  // K and V
  const int copies = static_cast<int>(std::max<size_t>(2, kRotateBytes / copy_bytes + 1));
  const size_t cache_elems = copies * copy_blocks * kBs * row;
  std::mt19937 rng(1234 + c.B * 7 + c.ctx);
  std::normal_distribution<float> nd(0.f, 1.f);

  // Copy 0 random on the host (the reference reads it); the other copies are its bytes again.
  const size_t copy_elems = copy_blocks * kBs * row;
  std::vector<uint16_t> hk(copy_elems), hv(copy_elems), hq(size_t(c.B) * c.nq * kD);
  for (auto& x : hk) x = to_bf16(nd(rng));
  for (auto& x : hv) x = to_bf16(nd(rng));
  for (auto& x : hq) x = to_bf16(nd(rng));
  auto* kc = static_cast<uint16_t*>(device_malloc(cache_elems * 2));
  auto* vc = static_cast<uint16_t*>(device_malloc(cache_elems * 2));
  for (int i = 0; i < copies; ++i) {
    memcpy_h2d(kc + i * copy_elems, hk.data(), copy_elems * 2);
    memcpy_h2d(vc + i * copy_elems, hv.data(), copy_elems * 2);
  }
  // Block tables: copy i's sequence b holds blocks i * copy_blocks + b * nblk + j, j shuffled
  // within the sequence (an engine's blocks are neither in order nor far apart).
  std::vector<int32_t> hbt(size_t(copies) * c.B * nblk);
  for (int i = 0; i < copies; ++i)
    for (int b = 0; b < c.B; ++b) {
      int32_t* r = hbt.data() + (size_t(i) * c.B + b) * nblk;
      for (int j = 0; j < nblk; ++j) r[j] = static_cast<int32_t>(i * copy_blocks + b * nblk + j);
      std::shuffle(r, r + nblk, rng);
    }
  std::vector<int32_t> hqsl(c.B + 1), hlen(c.B, c.ctx);
  for (int b = 0; b <= c.B; ++b) hqsl[b] = b;
  auto* bt = static_cast<int32_t*>(device_malloc(hbt.size() * 4));
  auto* qsl = static_cast<int32_t*>(device_malloc(hqsl.size() * 4));
  auto* lens = static_cast<int32_t*>(device_malloc(hlen.size() * 4));
  auto* q = static_cast<uint16_t*>(device_malloc(hq.size() * 2));
  auto* out = static_cast<uint16_t*>(device_malloc(hq.size() * 2));
  memcpy_h2d(bt, hbt.data(), hbt.size() * 4);
  memcpy_h2d(qsl, hqsl.data(), hqsl.size() * 4);
  memcpy_h2d(lens, hlen.data(), hlen.size() * 4);
  memcpy_h2d(q, hq.data(), hq.size() * 2);

  // Reference for copy 0's tables, float64: out[b, h] = softmax(q K^T * scale) V.
  const float scale = 1.f / std::sqrt(float(kD));
  std::vector<double> ref(hq.size());
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.nq; ++h) {
      const int g = h / G;
      std::vector<double> s(c.ctx);
      double mx = -1e300;
      for (int t = 0; t < c.ctx; ++t) {
        const size_t slot = size_t(hbt[size_t(b) * nblk + t / kBs]) * kBs + t % kBs;
        double acc = 0;
        for (int d = 0; d < kD; ++d)
          acc += double(from_bf16(hq[(size_t(b) * c.nq + h) * kD + d])) *
                 from_bf16(hk[slot * row + g * kD + d]);
        s[t] = acc * scale;
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int d = 0; d < kD; ++d) {
        double o = 0;
        for (int t = 0; t < c.ctx; ++t) {
          const size_t slot = size_t(hbt[size_t(b) * nblk + t / kBs]) * kBs + t % kBs;
          o += s[t] * from_bf16(hv[slot * row + g * kD + d]);
        }
        ref[(size_t(b) * c.nq + h) * kD + d] = o / sum;
      }
    }

  const double kv_bytes = double(c.B) * c.ctx * c.nkv * kD * 2 * 2;
  uint4* sink = static_cast<uint4*>(device_malloc(16));
  const size_t copy_vec = copy_blocks * kBs * row * 2 / 16;  // K's 16-byte chunks in one copy
  const float us_stream = time_graph([&](int r) {
    const int i = r % copies;
    launch(stream_kernel, dim3(num_sms() * 4), dim3(512), 0, stream(),
           reinterpret_cast<const uint4*>(kc) + i * copy_vec, copy_vec, sink);
    launch(stream_kernel, dim3(num_sms() * 4), dim3(512), 0, stream(),
           reinterpret_cast<const uint4*>(vc) + i * copy_vec, copy_vec, sink);
  }, 100) / 2;
  printf("B=%d ctx=%d heads=%d/%d D=%d  KV %.1f MB  stream-only K then V: %.2f us each "
         "(%.0f GB/s)\n", c.B, c.ctx, c.nq, c.nkv, kD, kv_bytes / 1e6, us_stream,
         kv_bytes / 2 / us_stream / 1e3);

  const int groups = (G + kDecMaxG - 1) / kDecMaxG;
  // One kernel's run: args with `part_rows` partial rows of D floats, checked against the
  // reference (out cleared first), then timed over the cache's copies.
  auto run = [&](const char* label, size_t part_rows, int ctas, auto&& launch_one) {
    AttnArgs a{};
    a.q = q, a.out = out, a.kc = kc, a.vc = vc, a.bt = bt, a.qsl = qsl, a.seq_lens = lens;
    a.q_stride = size_t(c.nq) * kD, a.out_stride = a.q_stride, a.bt_stride = nblk;
    a.B = c.B, a.T = c.B, a.nq = c.nq, a.nkv = c.nkv, a.G = G, a.D = kD, a.block_size = kBs;
    a.scale = scale, a.cap = 0.f, a.window = 0, a.q_bf16 = a.out_bf16 = true;
    a.part_o = static_cast<float*>(device_malloc(part_rows * (kD + 1) * 4));
    a.part_lse = a.part_o + part_rows * kD;
    a.done = done_counters(size_t(c.B) * c.nkv * groups);
    memset_d(out, 0, hq.size() * 2);
    launch_one(a);
    synchronize();
    std::vector<uint16_t> hout(hq.size());
    memcpy_d2h(hout.data(), out, hout.size() * 2);
    double err = 0, mag = 0;
    for (size_t i = 0; i < hout.size(); ++i) {
      err = std::max(err, std::abs(double(from_bf16(hout[i])) - ref[i]));
      mag = std::max(mag, std::abs(ref[i]));
    }
    const float us = time_graph([&](int r) {
      AttnArgs ar = a;
      ar.bt = bt + size_t(r % copies) * c.B * nblk;
      launch_one(ar);
    }, 200);
    printf("  %s (%4d CTAs): %7.2f us  %6.0f GB/s  max|err| %.2e (max|ref| %.2f)%s\n", label,
           ctas, us, kv_bytes / us / 1e3, err, mag,
           err > 2e-2 * std::max(1.0, mag) ? "  WRONG" : "");
    device_free(a.part_o);
  };
  std::vector<int> splits = split_list;
  if (splits.empty()) splits.push_back(planned_splits(c));
  for (int ns : splits) {
    ns = std::clamp(ns, 1, kMaxSplits);
    const dim3 grid(c.nkv * groups, c.B, ns);
    char label[32];
    snprintf(label, sizeof label, "splits %3d", ns);
    run(label, size_t(c.B) * c.nq * ns, int(grid.x * grid.y * grid.z), [&](AttnArgs& a) {
      a.max_splits = ns;
      launch_decode(a, grid, kD, true, stream());
    });
  }
  if (kD <= 128) {  // the balanced kernel on every resident CTA slot
    const int C = balanced_grid(kDecCtasPerSm * num_sms(), c.nkv * groups);
    run("balanced  ", size_t(2) * C * kDecMaxG, C,
        [&](AttnArgs& a) { launch_decode_balanced(a, C, kD, true, stream()); });
  }
  for (void* p : {static_cast<void*>(kc), static_cast<void*>(vc), static_cast<void*>(bt),
                  static_cast<void*>(qsl), static_cast<void*>(lens), static_cast<void*>(q),
                  static_cast<void*>(out), static_cast<void*>(sink)})
    device_free(p);
}

std::vector<int> parse_ints(const std::string& s, char sep) {
  std::vector<int> v;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(sep, i);
    if (j == std::string::npos) j = s.size();
    if (j > i) v.push_back(std::stoi(s.substr(i, j - i)));
    i = j + 1;
  }
  return v;
}

}  // namespace adb

int main(int argc, char** argv) {
  using namespace adb;
  std::vector<Case> cases;
  std::vector<int> splits;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--splits" && i + 1 < argc) {
      splits = parse_ints(argv[++i], ',');
    } else {
      const auto v = parse_ints(arg, 'x');
      const int D = v.size() == 5 ? v[4] : 128;
      if (v.size() < 4 || v.size() > 5 || v[2] % v[3] != 0 ||
          (D != 64 && D != 128 && D != 256)) {
        fprintf(stderr, "a case is BxCTXxNQxNKV[xD] (NQ a multiple of NKV, D 64, 128 or 256), "
                "got %s\n", argv[i]);
        return 2;
      }
      cases.push_back({v[0], v[1], v[2], v[3], D});
    }
  }
  if (cases.empty())  // Llama-3-8B (32/8) and Qwen3-30B-A3B (32/4) at the benchmark's contexts
    cases = {{1, 1088, 32, 8, 128}, {1, 1088, 32, 4, 128}, {8, 1088, 32, 8, 128},
             {32, 1088, 32, 8, 128}, {128, 1088, 32, 8, 128}, {4, 8000, 32, 8, 128},
             {16, 8000, 32, 8, 128}, {1, 8192, 32, 8, 128}};
  printf("%s, %d SMs\n", device_name().c_str(), num_sms());
  for (const auto& c : cases) run_case(c, splits);
  return 0;
}
