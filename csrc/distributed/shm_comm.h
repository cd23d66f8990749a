// The shared-memory segment the processes of one host run their collectives over (vLLM's CPU
// backend does the same; the segment is made and mapped by vllmx/distributed/shm_comm.py):
//
//   header   64 bytes: magic, world size, bytes per slot, abort flag (u64 each)
//   lines    a 64-byte line per rank: the sequence number of the last collective it posted
//   slots    two per rank (collectives alternate between them), slot_bytes each
//
// Every rank calls the same collectives in the same order. A collective posts its data in the
// rank's slot of this call's parity, publishes its sequence number, and waits until every rank
// has published it; the slot it wrote is next written two calls later, which no rank reaches
// before every rank has finished reading it (each posts call s + 1 only after finishing call s),
// so one wait per call is enough.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace vllmx {

constexpr uint64_t kShmMagic = 0x4d485358484c4c56ull;  // "VLLXHSHM"
constexpr int64_t kShmHeaderBytes = 64;
constexpr int64_t kShmLineBytes = 64;

struct ShmGroup {
  uint64_t* header;  // [magic, world, slot_bytes, abort]
  char* base;
  int64_t world, rank, slot_bytes;

  // The segment as a u8 tensor, checked (op names the caller in errors).
  ShmGroup(const Tensor& shm, int64_t rank, const char* op);

  uint64_t* line(int64_t r) const {
    return reinterpret_cast<uint64_t*>(base + kShmHeaderBytes + r * kShmLineBytes);
  }
  char* slot(int64_t r, uint64_t seq) const {
    const int64_t lines = kShmHeaderBytes + world * kShmLineBytes;
    return base + lines + (r * 2 + static_cast<int64_t>(seq & 1)) * slot_bytes;
  }
  // This rank's next sequence number (only this rank writes its line).
  uint64_t next_seq() const { return *line(rank) + 1; }
  // Publishes seq for this rank, then waits until every rank has published it; throws
  // std::runtime_error when the abort flag is set (a peer failed or exited) while waiting.
  void post_and_wait(uint64_t seq, const char* op) const;
};

}  // namespace vllmx
