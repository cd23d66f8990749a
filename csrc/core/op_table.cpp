#include "core/op_table.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>

#include "engine/step_tape.h"

namespace vllmx {

namespace {

std::map<std::string, std::unique_ptr<OpDef>>& table() {
  static std::map<std::string, std::unique_ptr<OpDef>> t;
  return t;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n");
  const size_t e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

[[noreturn]] void bad_declaration(const char* op, const std::string& what) {
  // A malformed ops.def entry is a bug in this build, found by the first lookup.
  throw std::logic_error(std::string("ops.def: ") + op + ": " + what);
}

OpParam parse_param(const char* op, std::string tok, OpArg::Kind kind) {
  OpParam p;
  p.kind = kind;
  const size_t eq = tok.find('=');
  if (eq != std::string::npos) {
    const std::string value = trim(tok.substr(eq + 1));
    tok = trim(tok.substr(0, eq));
    if (kind == OpArg::kTensor) bad_declaration(op, tok + ": a tensor has no default");
    p.has_default = true;
    p.default_value.kind = kind;
    if (kind == OpArg::kFloat) p.default_value.f = std::strtod(value.c_str(), nullptr);
    else p.default_value.i = std::strtoll(value.c_str(), nullptr, 10);
  }
  while (!tok.empty() && (tok.back() == '!' || tok.back() == '&' || tok.back() == '?')) {
    const char c = tok.back();
    tok.pop_back();
    if (kind != OpArg::kTensor) bad_declaration(op, tok + ": only tensors take ! & ?");
    if (c == '?') p.optional = true;
    if (c == '!') p.read = false, p.written = true;
    if (c == '&') p.read = true, p.written = true;
  }
  if (tok.empty()) bad_declaration(op, "empty parameter name");
  p.name = tok;
  return p;
}

// Every op of ops.def, so that the table lists them all, including those no kernel in this
// build implements (a CPU-only build has no kernel for the GPU-only fused ops).
void declare_all() {
#define VLLMX_OP(NAME, ...) op_def<op::NAME>();
#include "ops.def"
#undef VLLMX_OP
}

const char* device_name(int d) { return d == kCUDA ? "the GPU" : "the CPU"; }

thread_local StepTape* t_recording = nullptr;

}  // namespace

OpDef& declare_op(const char* name, const char* params, std::vector<OpArg::Kind> kinds) {
  auto& slot = table()[name];
  if (slot) return *slot;
  auto def = std::make_unique<OpDef>();
  def->name = name;
  std::string rest = params;
  size_t k = 0;
  while (!trim(rest).empty()) {
    const size_t comma = rest.find(',');
    const std::string tok = trim(rest.substr(0, comma));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    if (k >= kinds.size()) bad_declaration(name, "more parameter names than argument types");
    def->params.push_back(parse_param(name, tok, kinds[k++]));
  }
  if (k != kinds.size()) bad_declaration(name, "fewer parameter names than argument types");
  if (k > static_cast<size_t>(kMaxOpArgs)) bad_declaration(name, "more than kMaxOpArgs parameters");
  slot = std::move(def);
  return *slot;
}

const OpDef* find_op(const std::string& name) {
  static const bool declared = (declare_all(), true);
  (void)declared;
  auto it = table().find(name);
  return it == table().end() ? nullptr : it->second.get();
}

std::vector<const OpDef*> all_ops() {
  find_op("");
  std::vector<const OpDef*> out;
  for (auto& [name, def] : table()) out.push_back(def.get());
  return out;
}

void set_recording_tape(StepTape* tape) { t_recording = tape; }
StepTape* recording_tape() { return t_recording; }

void call_op(const OpDef& op, const OpArg* args, int64_t num_args, bool reference) {
  const char* name = op.name.c_str();
  const int64_t n = static_cast<int64_t>(op.params.size());
  if (num_args != n)
    fail(name, "takes " + std::to_string(n) + " arguments, got " + std::to_string(num_args));
  int device = -1;
  int64_t first = -1;
  for (int64_t j = 0; j < n; ++j) {
    const OpParam& p = op.params[j];
    if (args[j].kind != p.kind) fail(name, p.name + ": wrong kind of argument");
    if (p.kind != OpArg::kTensor) continue;
    const Tensor& t = args[j].t;
    if (!t.defined()) {
      // An empty tensor (a step of zero rows) may have no data; a required one needs a shape.
      VLLMX_CHECK(p.optional || t.ndim > 0, name, p.name + " is required");
      continue;
    }
    if (device < 0) {
      device = t.device;
      first = j;
    } else if (t.device != device) {
      fail(name, p.name + " is on " + device_name(t.device) + " but " + op.params[first].name +
                     " on " + device_name(device));
    }
  }
  if (device < 0) device = kCPU;
  const Kernel& kernel = op.kernels[device];
  if (kernel.fn == nullptr) {
#ifdef VLLMX_WITH_CUDA
    fail(name, std::string("has no kernel for ") + device_name(device));
#else
    fail(name, std::string("has no kernel for ") + device_name(device) +
                   (device == kCUDA ? " (vllmx was built without CUDA)" : ""));
#endif
  }
  VLLMX_CHECK(!reference || kernel.has_reference, name,
              std::string("has no reference twin on ") + device_name(device));
  if (op.check) op.check(args);
  if (t_recording != nullptr) {
    VLLMX_CHECK(device == kCPU, name, "a step tape records CPU ops only");
    t_recording->record(op, args, n, reference);
  }
  kernel.fn(args, reference);
}

}  // namespace vllmx
