// paged_attention, AVX2 path: the portable tiled path (attention_tiled.inc) compiled with AVX2,
// FMA and F16C, which the compiler vectorizes (QK^T over 8 dims, P.V over the head dims); the
// arithmetic per row is the portable path's, with FMAs where the compiler contracts.
#include "core/cpu_features.h"

#if VLLMX_X86
#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/attention.h"
#include "core/half.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace vllmx::attn {

namespace {
#include "attention/attention_tiled.inc"
}  // namespace

void attend_item_avx2(const Args& a, const WorkItem& w, Scratch& s) { attend_item_tiled(a, w, s); }

}  // namespace vllmx::attn

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // VLLMX_X86
