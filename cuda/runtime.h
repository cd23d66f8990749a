// CUDA runtime glue: device selection, a caching device allocator, the current stream.
// cudart is linked statically and talks to the driver only on first use, so importing vllmx
// on a machine without a GPU or driver never touches CUDA (available() just returns false).
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace vllmx::cuda {

bool available();        // a driver and at least one device are present
bool built_with_cuda();  // false where csrc/cuda_shim.cpp stands in (every op throws)
int device_count();
void set_device(int device);
// The current device's name and compute capability (major * 10 + minor).
std::string device_name();
int device_capability();
// Whether the sm_90a kernels (CUTLASS GEMM, wgmma prefill attention) were built and run on this
// device (compute capability 9.0; VLLMX_CUDA_SM90=0 keeps the sm_80 ones: cuda/mma.cuh).
bool sm90_kernels_in_use();
// Benchmarks only (bench/gpu_kernels_vs_torch.py --plans): force one linear kernel, and the
// split-K of the skinny and CUTLASS GEMMs, on every product it can take, so one build times
// each kernel against the others and cuBLAS at the same shapes; a product the forced kernel
// cannot take raises; swizzle and raster set the CUTLASS GEMMs' tile order (bf16 and fp8).
// path -1 and zeros / -1 elsewhere restore the planner (cuda/linear_plan.cu).
void set_linear_tuning(int path, int skinny_waves, int decomposition, int splits, int swizzle,
                       int raster);
// Benchmarks and tests only: the kernel every tensor-core decode (head size 64 / 128) runs on,
// 0 the split-KV one, 1 the balanced one (cuda/attention_decode.cu), -1 the planner's choice.
void set_attention_tuning(int decode_kernel);
// Caching allocator: freed blocks are kept per size class and reused; no cudaMalloc/cudaFree
// inside a step once warm (so steps can be captured in CUDA graphs).
void* device_malloc(size_t bytes);
void device_free(void* ptr);
// Device scratch that a kernel keeps between launches (split partials, counters, a GEMM
// workspace): grows to the largest size asked for and never frees a replaced buffer, since a
// captured CUDA graph may still point into it (warm up with the largest shapes before capture).
// zeroed: every new buffer starts zero-filled (queued on the stream).
class GrowOnlyBuffer {
 public:
  explicit GrowOnlyBuffer(bool zeroed = false) : zeroed_(zeroed) {}
  void* get(size_t bytes);

 private:
  std::mutex mu_;
  void* buf_ = nullptr;
  size_t cap_ = 0;
  bool zeroed_;
};
size_t allocated_bytes();  // live bytes handed out
size_t reserved_bytes();   // held from the driver (live + cached)
void empty_cache();
void memcpy_h2d(void* dst, const void* src, size_t bytes);
void memcpy_d2h(void* dst, const void* src, size_t bytes);
void memcpy_d2d(void* dst, const void* src, size_t bytes);
void memset_d(void* dst, int value, size_t bytes);
// height rows of width bytes from src (rows spitch apart) to dst (rows dpitch apart), queued on
// the stream: a column slice of a row-major array in one copy.
void memcpy_2d_d2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                   size_t height);
void synchronize();
// Page-locked host memory: a copy from / to it is queued on the stream and the host goes on
// (pageable memory makes every copy wait for the GPU). The caller keeps the bytes unchanged /
// unread until the stream has passed the copy (an event, or a synchronize).
void* host_alloc_pinned(size_t bytes);
void host_free_pinned(void* ptr);
void memcpy_h2d_async(void* dst, const void* src, size_t bytes);
void memcpy_d2h_async(void* dst, const void* src, size_t bytes);
// Events on the stream: record marks the point the stream has reached; synchronize waits for it.
void* event_create();
void event_record(void* event);
void event_synchronize(void* event);
void event_destroy(void* event);
// The stream every op launches on (one per process for now).
void* current_stream();  // cudaStream_t
// CUDA graphs of the op stream. Between begin and end every op is recorded, not run (relaxed
// mode: the caching allocator may still cudaMalloc); end returns the instantiated executable
// (a cudaGraphExec_t), which graph_launch replays on the stream over the same memory.
void graph_capture_begin();
void* graph_capture_end();
void graph_launch(void* exec);
void graph_destroy(void* exec);
// Free and total device memory in bytes.
void mem_get_info(size_t* free_bytes, size_t* total_bytes);

}  // namespace vllmx::cuda
