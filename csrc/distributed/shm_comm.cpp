// all_reduce / all_gather / broadcast over a host's shared-memory segment (shm_comm.h): tensor
// parallelism on the CPU, one process a rank.
#include "distributed/shm_comm.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/op_table.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define VLLMX_SPIN_PAUSE() _mm_pause()
#else
#define VLLMX_SPIN_PAUSE() ((void)0)
#endif

namespace vllmx {

ShmGroup::ShmGroup(const Tensor& shm, int64_t rank_, const char* op) {
  check_dtype(shm, DType::U8, op, "shm");
  check_ndim(shm, 1, op, "shm");
  VLLMX_CHECK(shm.shape[0] >= kShmHeaderBytes && reinterpret_cast<uintptr_t>(shm.data) % 64 == 0,
              op, "shm " + shm.str() + " is not a mapped segment (64-byte aligned header)");
  base = static_cast<char*>(shm.data);
  header = reinterpret_cast<uint64_t*>(base);
  VLLMX_CHECK(header[0] == kShmMagic, op, "shm is not a vllmx collective segment");
  world = static_cast<int64_t>(header[1]);
  slot_bytes = static_cast<int64_t>(header[2]);
  rank = rank_;
  VLLMX_CHECK(rank >= 0 && rank < world, op,
              "rank " + std::to_string(rank) + " out of range for world size " +
                  std::to_string(world));
  VLLMX_CHECK(shm.shape[0] >= kShmHeaderBytes + world * (kShmLineBytes + 2 * slot_bytes), op,
              "shm " + shm.str() + " is smaller than its header says");
}

void ShmGroup::post_and_wait(uint64_t seq, const char* op) const {
  std::atomic_ref<uint64_t>(*line(rank)).store(seq, std::memory_order_release);
  std::atomic_ref<uint64_t> abort_flag(header[3]);
  for (int64_t r = 0; r < world; ++r) {
    std::atomic_ref<uint64_t> peer(*line(r));
    // Spin first (a collective's peers usually arrive within microseconds), then yield the
    // core, then sleep: a rank waiting long (its peer still computing on an oversubscribed
    // host) must not take the cores its peers need.
    for (int64_t spins = 0; peer.load(std::memory_order_acquire) < seq; ++spins) {
      if (abort_flag.load(std::memory_order_relaxed) != 0)
        throw std::runtime_error(std::string(op) +
                                 ": the tensor-parallel group was aborted (a peer process "
                                 "failed or exited)");
      if (spins < 2048) {
        VLLMX_SPIN_PAUSE();
      } else if (spins < 16384) {
        sched_yield();
      } else {
        timespec ts{0, 20000};
        nanosleep(&ts, nullptr);
      }
    }
  }
}

void all_reduce(const Tensor& x, const Tensor& shm, int64_t rank) {
  const char* op = "all_reduce";
  ShmGroup g(shm, rank, op);
  check_dtype(x, DType::F32, op, "x");
  VLLMX_CHECK(x.is_contiguous(), op, "x " + x.str() + " must be contiguous");
  float* xp = x.ptr<float>();
  const int64_t n = x.numel(), chunk = g.slot_bytes / 4;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    const uint64_t seq = g.next_seq();
    std::memcpy(g.slot(rank, seq), xp + start, static_cast<size_t>(len) * 4);
    g.post_and_wait(seq, op);
    // Every rank sums the slots in rank order: the same bits on every rank, so their residual
    // streams never drift apart.
#pragma omp parallel for if (len * g.world > 65536) schedule(static)
    for (int64_t i = 0; i < len; ++i) {
      float s = reinterpret_cast<const float*>(g.slot(0, seq))[i];
      for (int64_t r = 1; r < g.world; ++r) s += reinterpret_cast<const float*>(g.slot(r, seq))[i];
      xp[start + i] = s;
    }
  }
}

void all_gather(const Tensor& out, const Tensor& x, const Tensor& shm, int64_t rank,
                int64_t part) {
  const char* op = "all_gather";
  ShmGroup g(shm, rank, op);
  check_dtype(x, DType::F32, op, "x");
  check_dtype(out, DType::F32, op, "out");
  check_ndim(x, 2, op, "x");
  check_ndim(out, 2, op, "out");
  const int64_t rows = x.shape[0], cols = out.shape[1];
  auto width = [&](int64_t r) { return std::clamp<int64_t>(cols - r * part, 0, part); };
  VLLMX_CHECK(part > 0 && part * g.world >= cols && out.shape[0] == rows &&
                  x.shape[1] == width(rank) && x.stride[1] == 1 && out.stride[1] == 1,
              op, "out " + out.str() + " must be [" + std::to_string(rows) + ", N] and x " +
                      x.str() + " rank " + std::to_string(rank) + "'s columns of it, " +
                      std::to_string(part) + " a rank (the last rank's fewer)");
  VLLMX_CHECK(part * 4 <= g.slot_bytes, op, "a row of " + std::to_string(part) +
                                                " floats does not fit a slot");
  const int64_t chunk_rows = g.slot_bytes / (part * 4);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t nr = std::min(chunk_rows, rows - r0);
    const uint64_t seq = g.next_seq();
    float* mine = reinterpret_cast<float*>(g.slot(rank, seq));
    for (int64_t i = 0; i < nr; ++i)
      std::memcpy(mine + i * part, x.ptr<float>() + (r0 + i) * x.stride[0],
                  static_cast<size_t>(width(rank)) * 4);
    g.post_and_wait(seq, op);
#pragma omp parallel for if (nr * cols > 65536) schedule(static)
    for (int64_t i = 0; i < nr; ++i)
      for (int64_t r = 0; r < g.world; ++r)
        std::memcpy(out.ptr<float>() + (r0 + i) * out.stride[0] + r * part,
                    reinterpret_cast<const float*>(g.slot(r, seq)) + i * part,
                    static_cast<size_t>(width(r)) * 4);
  }
}

void broadcast(const Tensor& x, const Tensor& shm, int64_t rank, int64_t src) {
  const char* op = "broadcast";
  ShmGroup g(shm, rank, op);
  VLLMX_CHECK(src >= 0 && src < g.world, op, "src " + std::to_string(src) + " out of range");
  VLLMX_CHECK(x.is_contiguous(), op, "x " + x.str() + " must be contiguous");
  char* xp = static_cast<char*>(x.data);
  const int64_t n = x.numel() * type_traits(x.dtype).type_size / type_traits(x.dtype).block_size;
  for (int64_t start = 0; start < n; start += g.slot_bytes) {
    const int64_t len = std::min(g.slot_bytes, n - start);
    const uint64_t seq = g.next_seq();
    if (rank == src) std::memcpy(g.slot(src, seq), xp + start, static_cast<size_t>(len));
    g.post_and_wait(seq, op);
    if (rank != src) std::memcpy(xp + start, g.slot(src, seq), static_cast<size_t>(len));
  }
}

VLLMX_KERNEL(all_reduce, kCPU, all_reduce);
VLLMX_KERNEL(all_gather, kCPU, all_gather);
VLLMX_KERNEL(broadcast, kCPU, broadcast);

}  // namespace vllmx
