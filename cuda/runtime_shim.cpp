// Stand-ins for cuda/runtime.h, compiled instead of runtime.cu where vllmx is built without
// CUDA: available() is false and every call that needs a GPU throws. The ops need none: such a
// build registers no CUDA kernel in the op table, which says so when a GPU tensor reaches an op.
#include <stdexcept>
#include <string>

#include "runtime.h"

namespace vllmx::cuda {

namespace {
[[noreturn]] void missing(const char* fn, const char*) {
  throw std::runtime_error(std::string("vllmx.cuda.") + fn +
                           ": vllmx was built without CUDA (rebuild with VLLMX_CUDA=1 and nvcc "
                           "on the PATH)");
}
}  // namespace

bool built_with_cuda() { return false; }
bool available() { return false; }
bool sm90_kernels_in_use() { return false; }
void set_linear_tuning(int, int, int, int, int, int) {
  missing("set_linear_tuning", "cuda/linear_plan.cu");
}
void set_attention_tuning(int) { missing("set_attention_tuning", "cuda/attention.cu"); }
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

}  // namespace vllmx::cuda
