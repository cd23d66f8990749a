// A decode step recorded as the native op calls it made, replayed without Python: the CPU's
// counterpart of a CUDA graph. While a thread records (set_recording_tape), the op table's
// dispatcher (core/op_table.h) appends every CPU op call to the tape and still runs it; replay()
// re-issues the same calls on the same views. An entry is generic (the op's table entry and its
// arguments), so a new op needs nothing here. Views are raw pointers: the memory they name must
// stay allocated and in place for the tape's lifetime (the Python side holds it); relocate()
// repoints the views of one buffer into another, which is how a capture packs a step's
// activations into one arena by liveness.
#pragma once
#include <cstdint>
#include <vector>

#include "core/op_table.h"

namespace vllmx {

class StepTape {
 public:
  void record(const OpDef& op, const OpArg* args, int64_t num_args, bool reference);
  // Runs the recorded ops in order (on the calling thread; each op uses the thread pool). The
  // arguments were checked when recorded, so replay goes straight to the kernels.
  void replay() const;
  // Every view whose data lies in [begin, begin + nbytes) moves to the same offset from `to`.
  void relocate(const void* begin, int64_t nbytes, void* to);
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }

 private:
  struct Entry {
    KernelFn kernel;
    bool reference;
    std::vector<OpArg> args;
  };
  std::vector<Entry> entries_;
};

}  // namespace vllmx
