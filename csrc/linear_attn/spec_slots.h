// The hybrid mixers' optional spec_state_indices (contract in csrc/ops.def): a row's extra slot
// for the state after it, or -1.
#pragma once

#include <string>

#include "core/op_table.h"

namespace vllmx {

// The rows' slots (null when the argument is absent), each checked to be -1 or a slot of the
// state tensor named `what`.
inline const int32_t* spec_slots(const Tensor& spec_state_indices, int64_t slots, const char* op,
                                 const char* what) {
  if (!spec_state_indices.defined()) return nullptr;
  const int32_t* s = spec_state_indices.ptr<int32_t>();
  for (int64_t i = 0; i < spec_state_indices.shape[0]; ++i)
    VLLMX_CHECK(s[i] >= -1 && s[i] < slots, op,
                "spec_state_indices[" + std::to_string(i) + "] = " + std::to_string(s[i]) +
                    " is neither -1 nor a slot of " + what);
  return s;
}

}  // namespace vllmx
