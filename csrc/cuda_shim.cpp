// Stand-ins for cuda/runtime.h and cuda/cuda_ops.h where vllmx is built without CUDA (every op
// throws; available() is false), or where a CUDA build lacks one kernel family's .cu file
// (CMakeLists.txt defines VLLMX_SHIM_<FAMILY> for each family it could not find).
#include <stdexcept>
#include <string>

#include "cuda_ops.h"
#include "runtime.h"

#ifndef VLLMX_WITH_CUDA
#define VLLMX_SHIM_RUNTIME 1
#define VLLMX_SHIM_ELEMENTWISE 1
#define VLLMX_SHIM_LINEAR 1
#define VLLMX_SHIM_ATTENTION 1
#define VLLMX_SHIM_SAMPLER 1
#endif

namespace vllmx::cuda {

namespace {
[[noreturn]] [[maybe_unused]] void missing(const char* fn, const char* file) {
#ifdef VLLMX_WITH_CUDA
  throw std::runtime_error(std::string("vllmx.cuda.") + fn + " is not in this build (" + file +
                           " was missing when it was compiled)");
#else
  (void)file;
  throw std::runtime_error(std::string("vllmx.cuda.") + fn +
                           ": vllmx was built without CUDA (rebuild with VLLMX_CUDA=1 and nvcc "
                           "on the PATH)");
#endif
}
}  // namespace

#ifdef VLLMX_SHIM_RUNTIME
bool built_with_cuda() { return false; }
bool available() { return false; }
int device_count() { return 0; }
void set_device(int) { missing("set_device", "cuda/runtime.cu"); }
std::string device_name() { missing("device_name", "cuda/runtime.cu"); }
int device_capability() { missing("device_capability", "cuda/runtime.cu"); }
void* device_malloc(size_t) { missing("device_malloc", "cuda/runtime.cu"); }
void device_free(void* ptr) {
  if (ptr) missing("device_free", "cuda/runtime.cu");
}
size_t allocated_bytes() { return 0; }
size_t reserved_bytes() { return 0; }
void empty_cache() {}
void memcpy_h2d(void*, const void*, size_t) { missing("memcpy_h2d", "cuda/runtime.cu"); }
void memcpy_d2h(void*, const void*, size_t) { missing("memcpy_d2h", "cuda/runtime.cu"); }
void memcpy_d2d(void*, const void*, size_t) { missing("memcpy_d2d", "cuda/runtime.cu"); }
void memset_d(void*, int, size_t) { missing("memset_d", "cuda/runtime.cu"); }
void memcpy_2d_d2d(void*, size_t, const void*, size_t, size_t, size_t) {
  missing("memcpy_2d_d2d", "cuda/runtime.cu");
}
void graph_capture_begin() { missing("graph_capture_begin", "cuda/runtime.cu"); }
void* graph_capture_end() { missing("graph_capture_end", "cuda/runtime.cu"); }
void graph_launch(void*) { missing("graph_launch", "cuda/runtime.cu"); }
void graph_destroy(void*) {}
void synchronize() { missing("synchronize", "cuda/runtime.cu"); }
void* host_alloc_pinned(size_t) { missing("host_alloc_pinned", "cuda/runtime.cu"); }
void host_free_pinned(void*) {}
void memcpy_h2d_async(void*, const void*, size_t) { missing("memcpy_h2d_async", "cuda/runtime.cu"); }
void memcpy_d2h_async(void*, const void*, size_t) { missing("memcpy_d2h_async", "cuda/runtime.cu"); }
void* event_create() { missing("event_create", "cuda/runtime.cu"); }
void event_record(void*) { missing("event_record", "cuda/runtime.cu"); }
void event_synchronize(void*) { missing("event_synchronize", "cuda/runtime.cu"); }
void event_destroy(void*) {}
void* current_stream() { missing("current_stream", "cuda/runtime.cu"); }
void mem_get_info(size_t*, size_t*) { missing("mem_get_info", "cuda/runtime.cu"); }
#endif

#ifdef VLLMX_SHIM_ELEMENTWISE
void embedding(const Tensor&, const Tensor&, const Tensor&) {
  missing("embedding", "cuda/elementwise.cu");
}
void rms_norm(const Tensor&, const Tensor&, const Tensor&, float) {
  missing("rms_norm", "cuda/elementwise.cu");
}
void add_rms_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                  float) {
  missing("add_rms_norm", "cuda/elementwise.cu");
}
void fused_add_rms_norm(const Tensor&, const Tensor&, const Tensor&, float) {
  missing("fused_add_rms_norm", "cuda/elementwise.cu");
}
void rotary(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, bool) {
  missing("rotary", "cuda/elementwise.cu");
}
void silu_and_mul(const Tensor&, const Tensor&) { missing("silu_and_mul", "cuda/elementwise.cu"); }
void gelu_and_mul(const Tensor&, const Tensor&, bool) {
  missing("gelu_and_mul", "cuda/elementwise.cu");
}
void write_kv_cache(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing("write_kv_cache", "cuda/elementwise.cu");
}
void qk_norm_rope_cache(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, float, const Tensor&, const Tensor&, const Tensor&, int64_t,
                        int64_t, bool) {
  missing("qk_norm_rope_cache", "cuda/elementwise.cu");
}
#endif

#ifdef VLLMX_SHIM_LINEAR
void linear(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing("linear", "cuda/linear.cu");
}
void linear_act_and_mul(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int) {
  missing("linear_act_and_mul", "cuda/linear.cu");
}
void rms_norm_linear(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                     float, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int) {
  missing("rms_norm_linear", "cuda/linear.cu");
}
#endif

#ifdef VLLMX_SHIM_ATTENTION
void paged_attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                     const Tensor&, const Tensor&, float, int64_t, float, int64_t) {
  missing("paged_attention", "cuda/attention.cu");
}
#endif

#ifdef VLLMX_SHIM_SAMPLER
void sample(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
            const Tensor&, const Tensor&, const Tensor&) {
  missing("sample", "cuda/sampler.cu");
}
#endif

}  // namespace vllmx::cuda
