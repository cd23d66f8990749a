// CUDA runtime glue: device probe, the caching allocator, copies and the op stream.
//
// cudart is linked statically; it loads libcuda on the first CUDA call, so nothing here runs
// at import. available() turns "no driver" / "no device" into false instead of an error.
//
// Allocator: requests are rounded up to a size class (512 B minimum, then four classes per
// power of two, so at most 25% waste; from 64 MiB on, 2 MiB steps) and a freed block goes back
// to its class's free list, to be handed out again without cudaMalloc. All ops run on one
// stream, so a block freed on the host can be reused at once: later work on the stream is
// ordered after earlier uses.
// When cudaMalloc runs out of memory, the cached blocks are released and it is tried again.
//
// CUDA graphs: a captured graph replays over the addresses its ops were given at capture, so
// a block the capture used is the graph's for good, even once the host has freed it. Blocks
// handed out while a capture is running are marked as graph blocks: freed, they go to a pool
// of their own that only later captures draw from (graphs run one at a time on the one
// stream, so their temporaries may share), never to an allocation outside a capture (whose
// data a replay would overwrite, e.g. a second engine's weights) and never back to the driver.
#include <algorithm>
#include <bit>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cuda_util.cuh"
#include "mma.cuh"

namespace vllmx::cuda {

namespace {

struct Allocator {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // size class -> cached blocks
  std::unordered_map<void*, size_t> live;                      // handed out -> size class
  std::unordered_map<size_t, std::vector<void*>> graph_free;   // freed graph blocks
  std::unordered_set<void*> graph_blocks;                      // blocks a capture used
  bool capturing = false;
  size_t allocated = 0, reserved = 0;

  // Releases every cached block to the driver (mu held).
  void release_cached() {
    for (auto& [size, blocks] : free_blocks) {
      for (void* p : blocks) {
        cudaFree(p);
        reserved -= size;
      }
    }
    free_blocks.clear();
  }
};

// Leaked on purpose: at process exit the CUDA runtime may be gone before static destructors run.
Allocator& allocator() {
  static Allocator* a = new Allocator;
  return *a;
}

size_t size_class(size_t n) {
  if (n <= 512) return 512;
  // Large blocks (KV caches, weights) in 2 MiB steps: four classes per power of two would
  // waste up to a quarter of a 2.5 GiB cache, and such blocks are rarely freed and reused.
  constexpr size_t kLarge = size_t{64} << 20, kLargeStep = size_t{2} << 20;
  if (n >= kLarge) return (n + kLargeStep - 1) / kLargeStep * kLargeStep;
  const size_t step = std::max<size_t>(std::bit_floor(n) / 4, 512);
  return (n + step - 1) / step * step;
}

struct Probe {
  int count = 0;
  cudaError_t error = cudaSuccess;
};
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    r.error = cudaGetDeviceCount(&r.count);
    if (r.error != cudaSuccess) {
      r.count = 0;
      cudaGetLastError();  // clear the sticky error of a failed probe
    }
    return r;
  }();
  return p;
}

void require_device(const char* what) {
  const Probe& p = probe();
  if (p.count > 0) return;
  throw std::runtime_error(std::string(what) + ": no CUDA device is available (" +
                           (p.error != cudaSuccess ? cudaGetErrorString(p.error)
                                                   : "cudaGetDeviceCount found 0 devices") +
                           ")");
}

}  // namespace

bool built_with_cuda() { return true; }
bool available() { return probe().count > 0; }
bool sm90_kernels_in_use() {
#ifdef VLLMX_WITH_SM90_GEMM
  return available() && detail::sm90_kernels();
#else
  return false;
#endif
}
int device_count() { return probe().count; }

void set_device(int device) {
  require_device("set_device");
  if (device < 0 || device >= probe().count)
    throw std::invalid_argument("set_device: device " + std::to_string(device) +
                                " out of range [0, " + std::to_string(probe().count) + ")");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

namespace {
int current_device() {
  require_device("current device");
  int d = 0;
  check_cuda(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}
}  // namespace

bool pdl_supported() {
  static const bool ok = device_capability() >= 90;
  return ok;
}

std::string device_name() {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, current_device()), "cudaGetDeviceProperties");
  return prop.name;
}

int device_capability() {
  const int d = current_device();
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d),
             "cudaDeviceGetAttribute");
  return major * 10 + minor;
}

void* device_malloc(size_t bytes) {
  require_device("device_malloc");
  const size_t size = size_class(bytes);
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  void* p = nullptr;
  const auto take = [&](std::unordered_map<size_t, std::vector<void*>>& lists) {
    auto it = lists.find(size);
    if (it == lists.end() || it->second.empty()) return false;
    p = it->second.back();
    it->second.pop_back();
    return true;
  };
  if (!(a.capturing && take(a.graph_free)) && !take(a.free_blocks)) {
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      a.release_cached();
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      check_cuda(e, ("cudaMalloc(" + std::to_string(size) + " bytes; " +
                     std::to_string(a.allocated) + " allocated, " + std::to_string(a.reserved) +
                     " reserved)")
                        .c_str());
    }
    a.reserved += size;
  }
  a.live.emplace(p, size);
  a.allocated += size;
  if (a.capturing) a.graph_blocks.insert(p);
  return p;
}

void device_free(void* ptr) {
  if (ptr == nullptr) return;
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  auto it = a.live.find(ptr);
  if (it == a.live.end())
    throw std::invalid_argument("device_free: pointer was not allocated by device_malloc");
  const size_t size = it->second;
  a.live.erase(it);
  a.allocated -= size;
  (a.graph_blocks.count(ptr) ? a.graph_free : a.free_blocks)[size].push_back(ptr);
}

size_t allocated_bytes() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  return a.allocated;
}

size_t reserved_bytes() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  return a.reserved;
}

void empty_cache() {
  if (!available()) return;
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  // Blocks in the free lists may still be read by queued work of earlier owners.
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  a.release_cached();
}

void* current_stream() {
  static cudaStream_t s = [] {
    require_device("current_stream");
    cudaStream_t r = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&r, cudaStreamNonBlocking), "cudaStreamCreate");
    return r;
  }();
  return s;
}

// Host <-> device copies wait for completion: host arrays may be freed right after.
void memcpy_h2d(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()),
             "cudaMemcpyAsync(host to device)");
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize(after host to device)");
}

void memcpy_d2h(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()),
             "cudaMemcpyAsync(device to host)");
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize(after device to host)");
}

void memcpy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()),
             "cudaMemcpyAsync(device to device)");
}

void memset_d(void* dst, int value, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemsetAsync(dst, value, bytes, stream()), "cudaMemsetAsync");
}

void* GrowOnlyBuffer::get(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > cap_) {
    cap_ = std::max(bytes, cap_ * 2);
    buf_ = device_malloc(cap_);
    if (zeroed_) memset_d(buf_, 0, cap_);
  }
  return buf_;
}

namespace {
// One CTA per row; 16-byte moves when both sides allow them. A kernel, not cudaMemcpy2DAsync:
// inside a CUDA graph a memcpy node goes through a copy engine and costs several microseconds
// of latency, which the q/k/v split of every layer would pay three times per decode step.
__global__ void copy_2d_kernel(char* dst, int64_t dpitch, const char* src, int64_t spitch,
                               int64_t width) {
  pdl_begin();
  const char* s = src + blockIdx.x * spitch;
  char* d = dst + blockIdx.x * dpitch;
  if (((reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d) | width) & 15) == 0) {
    for (int64_t i = threadIdx.x * 16; i < width; i += blockDim.x * 16)
      *reinterpret_cast<uint4*>(d + i) = *reinterpret_cast<const uint4*>(s + i);
  } else {
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
  }
}
}  // namespace

void memcpy_2d_d2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                   size_t height) {
  if (width == 0 || height == 0) return;
  if (height > 0x7fffffffu)
    throw std::invalid_argument("memcpy_2d_d2d: too many rows (" + std::to_string(height) + ")");
  launch(copy_2d_kernel, static_cast<unsigned>(height), 128, 0, stream(),
      static_cast<char*>(dst), static_cast<int64_t>(dpitch), static_cast<const char*>(src),
      static_cast<int64_t>(spitch), static_cast<int64_t>(width));
  check_cuda(cudaGetLastError(), "copy_2d kernel");
}

void graph_capture_begin() {
  check_cuda(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed),
             "cudaStreamBeginCapture");
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  a.capturing = true;
}

void* graph_capture_end() {
  {
    Allocator& a = allocator();
    std::lock_guard<std::mutex> lock(a.mu);
    a.capturing = false;
  }
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamEndCapture(stream(), &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check_cuda(e, "cudaGraphInstantiate");
  return exec;
}

void graph_launch(void* exec) {
  check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), stream()), "cudaGraphLaunch");
}

void graph_destroy(void* exec) {
  if (exec != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

void synchronize() { check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }

void* host_alloc_pinned(size_t bytes) {
  require_device("host_alloc_pinned");
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault), "cudaHostAlloc");
  return p;
}

void host_free_pinned(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

void memcpy_h2d_async(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()),
             "cudaMemcpyAsync(pinned host to device)");
}

void memcpy_d2h_async(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()),
             "cudaMemcpyAsync(device to pinned host)");
}

void* event_create() {
  require_device("event_create");
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}

void event_record(void* event) {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event), stream()), "cudaEventRecord");
}

void event_synchronize(void* event) {
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
}

void event_destroy(void* event) {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void mem_get_info(size_t* free_bytes, size_t* total_bytes) {
  require_device("mem_get_info");
  check_cuda(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

}  // namespace vllmx::cuda
