// CUDA runtime glue: device selection, a caching device allocator, the current stream.
// cudart is linked statically and talks to the driver only on first use, so importing vllmx
// on a machine without a GPU or driver never touches CUDA (available() just returns false).
#pragma once
#include <cstddef>
#include <cstdint>

namespace vllmx::cuda {

bool available();        // a driver and at least one device are present
bool built_with_cuda();  // false where csrc/cuda_shim.cpp stands in (every op throws)
int device_count();
void set_device(int device);
// Caching allocator: freed blocks are kept per size class and reused; no cudaMalloc/cudaFree
// inside a step once warm (so steps can be captured in CUDA graphs).
void* device_malloc(size_t bytes);
void device_free(void* ptr);
size_t allocated_bytes();  // live bytes handed out
size_t reserved_bytes();   // held from the driver (live + cached)
void empty_cache();
void memcpy_h2d(void* dst, const void* src, size_t bytes);
void memcpy_d2h(void* dst, const void* src, size_t bytes);
void memcpy_d2d(void* dst, const void* src, size_t bytes);
void memset_d(void* dst, int value, size_t bytes);
void synchronize();
// The stream every op launches on (one per process for now).
void* current_stream();  // cudaStream_t
// Free and total device memory in bytes.
void mem_get_info(size_t* free_bytes, size_t* total_bytes);

}  // namespace vllmx::cuda
