// The op table: every native op is declared once (csrc/ops.def: name, parameters, the C++ types
// of its arguments), and each device registers its kernel for it next to the kernel's code
// (VLLMX_KERNEL below). A call goes through one dispatcher, call_op(), which checks what is
// common to every device once (arity, required tensors, one device for all tensors, the op's
// contract if it registered one), records the call into the step tape the calling thread is
// recording (CPU), and runs the kernel of the tensors' device. Python reaches every op through
// one generic binding (vllmx._C.ops.<name>), so adding an op touches its declaration, its
// kernels and its test, and nothing else.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace vllmx {

// One argument of an op call: a tensor view, an integer, a float or a flag.
struct OpArg {
  enum Kind : uint8_t { kTensor, kInt, kFloat, kBool };
  Kind kind = kTensor;
  Tensor t;
  int64_t i = 0;  // kInt, kBool
  double f = 0.0;
};

// The most parameters an op may declare (the bindings pass arguments in an array this long).
constexpr int kMaxOpArgs = 24;

// A parameter as ops.def declares it: "name" is read, "name!" written (not read), "name&" read
// and written in place; a trailing "?" makes a tensor optional (undefined = absent);
// "name=value" gives a scalar a default.
struct OpParam {
  std::string name;
  OpArg::Kind kind = OpArg::kTensor;
  bool read = true;
  bool written = false;
  bool optional = false;
  bool has_default = false;
  OpArg default_value;
};

// A kernel as the table stores it: the arguments in declaration order and the reference flag
// (the scalar twin, CPU kernels only).
using KernelFn = void (*)(const OpArg* args, bool reference);
struct Kernel {
  KernelFn fn = nullptr;
  bool has_reference = false;
};
using CheckFn = void (*)(const OpArg* args);

struct OpDef {
  std::string name;
  std::vector<OpParam> params;
  CheckFn check = nullptr;  // the device-independent contract, run before any kernel
  Kernel kernels[2];        // by Device (kCPU, kCUDA)
};

// The table of every declared op, by name.
const OpDef* find_op(const std::string& name);
std::vector<const OpDef*> all_ops();

class StepTape;
// Runs op over args (checked as above). reference = the CPU kernel's scalar twin.
void call_op(const OpDef& op, const OpArg* args, int64_t num_args, bool reference = false);
// The tape the calling thread records into (nullptr: none). While one is set, call_op appends
// each CPU call to it, and still runs it.
void set_recording_tape(StepTape* tape);
StepTape* recording_tape();

// ---- declaration and registration machinery ----

template <typename... T>
struct TypeList {};

template <typename T>
constexpr OpArg::Kind arg_kind() {
  if constexpr (std::is_same_v<T, Tensor>) return OpArg::kTensor;
  else if constexpr (std::is_same_v<T, bool>) return OpArg::kBool;
  else if constexpr (std::is_integral_v<T>) return OpArg::kInt;
  else {
    static_assert(std::is_floating_point_v<T>, "op arguments are Tensor, integers, float, bool");
    return OpArg::kFloat;
  }
}

template <typename T>
decltype(auto) arg_value(const OpArg& a) {
  if constexpr (std::is_same_v<T, Tensor>) return static_cast<const Tensor&>(a.t);
  else if constexpr (std::is_same_v<T, bool>) return a.i != 0;
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(a.i);
  else return static_cast<T>(a.f);
}

// Declares (once, on first use) the op of tag Op: ops.def's entry.
OpDef& declare_op(const char* name, const char* params, std::vector<OpArg::Kind> kinds);
template <typename Op, typename... A>
OpDef& op_def_of(TypeList<A...>) {
  static OpDef& def = declare_op(Op::kName, Op::kParams, {arg_kind<A>()...});
  return def;
}
template <typename Op>
OpDef& op_def() {
  return op_def_of<Op>(typename Op::Args{});
}

// Adapts a typed kernel to KernelFn. A CPU kernel may take one more bool after the declared
// arguments: `reference`, its scalar twin.
template <auto Fn, typename... A>
constexpr bool takes_reference(TypeList<A...>) {
  return std::is_invocable_v<decltype(Fn), decltype(arg_value<A>(std::declval<OpArg>()))..., bool>;
}
template <auto Fn, typename... A>
constexpr bool takes_declared_args(TypeList<A...>) {
  return std::is_invocable_v<decltype(Fn), decltype(arg_value<A>(std::declval<OpArg>()))...>;
}
template <auto Fn, typename... A, size_t... I>
void invoke_kernel(const OpArg* a, bool reference, TypeList<A...>, std::index_sequence<I...>) {
  if constexpr (takes_reference<Fn>(TypeList<A...>{}))
    Fn(arg_value<A>(a[I])..., reference);
  else
    Fn(arg_value<A>(a[I])...);
}
template <typename Op, auto Fn, typename... A>
void adapt_kernel(const OpArg* a, bool reference) {
  invoke_kernel<Fn>(a, reference, typename Op::Args{}, std::index_sequence_for<A...>{});
}
template <typename Op, auto Fn, typename... A>
KernelFn kernel_fn_of(TypeList<A...>) {
  return &adapt_kernel<Op, Fn, A...>;
}

template <typename Op, Device D, auto Fn>
bool register_kernel() {
  constexpr typename Op::Args args{};
  static_assert(takes_reference<Fn>(args) || takes_declared_args<Fn>(args),
                "the kernel's parameters do not match the op's declaration in ops.def");
  op_def<Op>().kernels[D] = Kernel{kernel_fn_of<Op, Fn>(args), takes_reference<Fn>(args)};
  return true;
}

template <auto Fn, typename... A, size_t... I>
void invoke_check(const OpArg* a, TypeList<A...>, std::index_sequence<I...>) {
  Fn(arg_value<A>(a[I])...);
}
template <typename Op, auto Fn, typename... A>
void adapt_check(const OpArg* a) {
  invoke_check<Fn>(a, typename Op::Args{}, std::index_sequence_for<A...>{});
}
template <typename Op, auto Fn, typename... A>
CheckFn check_fn_of(TypeList<A...>) {
  return &adapt_check<Op, Fn, A...>;
}
template <typename Op, auto Fn>
bool register_check() {
  op_def<Op>().check = check_fn_of<Op, Fn>(typename Op::Args{});
  return true;
}

// One tag type per op of ops.def (vllmx::op::rms_norm ...), naming it in registrations.
namespace op {
#define VLLMX_OP(NAME, PARAMS, ...)                    \
  struct NAME {                                        \
    static constexpr const char* kName = #NAME;        \
    static constexpr const char* kParams = PARAMS;     \
    using Args = ::vllmx::TypeList<__VA_ARGS__>;       \
  };
#include "ops.def"
#undef VLLMX_OP
}  // namespace op

}  // namespace vllmx

// In a kernel's source file, after the kernel: VLLMX_KERNEL(rms_norm, kCPU, rms_norm_cpu).
#define VLLMX_KERNEL(NAME, DEVICE, FN)                                                    \
  [[maybe_unused]] static const bool vllmx_kernel_##NAME##_##DEVICE =                      \
      ::vllmx::register_kernel<::vllmx::op::NAME, ::vllmx::DEVICE, FN>()
// An op's device-independent contract (shapes, dtypes shared by every device), called with the
// declared arguments before the kernel: VLLMX_OP_CHECK(write_kv_cache, check_write_kv_cache).
#define VLLMX_OP_CHECK(NAME, FN)                                    \
  [[maybe_unused]] static const bool vllmx_check_##NAME =           \
      ::vllmx::register_check<::vllmx::op::NAME, FN>()
