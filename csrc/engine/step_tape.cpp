#include "engine/step_tape.h"

namespace vllmx {

void StepTape::record(const OpDef& op, const OpArg* args, int64_t num_args, bool reference) {
  entries_.push_back(Entry{op.kernels[kCPU].fn, reference,
                           std::vector<OpArg>(args, args + num_args)});
}

void StepTape::replay() const {
  for (const Entry& e : entries_) e.kernel(e.args.data(), e.reference);
}

void StepTape::relocate(const void* begin, int64_t nbytes, void* to) {
  const char* lo = static_cast<const char*>(begin);
  for (Entry& e : entries_)
    for (OpArg& a : e.args) {
      if (a.kind != OpArg::kTensor) continue;
      const char* p = static_cast<const char*>(a.t.data);
      if (p != nullptr && p >= lo && p < lo + nbytes) a.t.data = static_cast<char*>(to) + (p - lo);
    }
}

}  // namespace vllmx
