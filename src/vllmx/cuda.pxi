# CUDA bindings (included at the end of _C.pyx): the runtime (device probe, caching allocator,
# copies, graphs), DeviceBuffer (owned device bytes) and DeviceArrayBase (a typed, shaped view
# of one; the Python class vllmx.device.DeviceArray builds on it). The ops take DeviceArrays
# through the op table (op_table.pxi) like host arrays. Where vllmx was built without CUDA, or no
# GPU is present, cuda_available() is False and the runtime calls raise RuntimeError saying so.
from libc.stdint cimport int32_t, uintptr_t
from libcpp.string cimport string

cdef extern from "runtime.h" namespace "vllmx::cuda" nogil:
    bint c_cuda_available "vllmx::cuda::available"() except +
    bint c_cuda_built "vllmx::cuda::built_with_cuda"() except +
    bint c_sm90_kernels "vllmx::cuda::sm90_kernels_in_use"() except +
    void c_set_linear_tuning "vllmx::cuda::set_linear_tuning"(int, int, int, int, int, int) except +
    void c_set_attention_tuning "vllmx::cuda::set_attention_tuning"(int) except +
    int c_cuda_device_count "vllmx::cuda::device_count"() except +
    void c_cuda_set_device "vllmx::cuda::set_device"(int) except +
    string c_device_name "vllmx::cuda::device_name"() except +
    int c_device_capability "vllmx::cuda::device_capability"() except +
    void* c_device_malloc "vllmx::cuda::device_malloc"(size_t) except +
    void c_device_free "vllmx::cuda::device_free"(void*) except +
    size_t c_allocated_bytes "vllmx::cuda::allocated_bytes"() except +
    size_t c_reserved_bytes "vllmx::cuda::reserved_bytes"() except +
    void c_empty_cache "vllmx::cuda::empty_cache"() except +
    void c_memcpy_h2d "vllmx::cuda::memcpy_h2d"(void*, const void*, size_t) except +
    void c_memcpy_d2h "vllmx::cuda::memcpy_d2h"(void*, const void*, size_t) except +
    void c_memcpy_d2d "vllmx::cuda::memcpy_d2d"(void*, const void*, size_t) except +
    void c_memset_d "vllmx::cuda::memset_d"(void*, int, size_t) except +
    void c_cuda_synchronize "vllmx::cuda::synchronize"() except +
    void c_mem_get_info "vllmx::cuda::mem_get_info"(size_t*, size_t*) except +
    void c_memcpy_2d_d2d "vllmx::cuda::memcpy_2d_d2d"(void*, size_t, const void*, size_t,
                                                      size_t, size_t) except +
    void c_graph_capture_begin "vllmx::cuda::graph_capture_begin"() except +
    void* c_graph_capture_end "vllmx::cuda::graph_capture_end"() except +
    void c_graph_launch "vllmx::cuda::graph_launch"(void*) except +
    void c_graph_destroy "vllmx::cuda::graph_destroy"(void*) except +
    void* c_host_alloc_pinned "vllmx::cuda::host_alloc_pinned"(size_t) except +
    void c_host_free_pinned "vllmx::cuda::host_free_pinned"(void*) except +
    void c_memcpy_h2d_async "vllmx::cuda::memcpy_h2d_async"(void*, const void*, size_t) except +
    void c_memcpy_d2h_async "vllmx::cuda::memcpy_d2h_async"(void*, const void*, size_t) except +
    void* c_event_create "vllmx::cuda::event_create"() except +
    void c_event_record "vllmx::cuda::event_record"(void*) except +
    void c_event_synchronize "vllmx::cuda::event_synchronize"(void*) except +
    void c_event_destroy "vllmx::cuda::event_destroy"(void*) except +

cdef int _cuda_state = -1  # -1: not probed; 0: unavailable; 1: available


def cuda_built():
    """True where this vllmx._C was compiled with the CUDA backend."""
    return c_cuda_built()


def cuda_available():
    """True where vllmx was built with CUDA and a driver and at least one GPU are present.
    Never raises: no driver or no device is just False."""
    global _cuda_state
    if _cuda_state < 0:
        _cuda_state = 1 if c_cuda_available() else 0
    return _cuda_state == 1


def cuda_sm90_kernels():
    """True where the Hopper (sm_90a) GEMM and prefill attention kernels run: built for
    sm_90a, a compute capability 9.0 GPU, and VLLMX_CUDA_SM90 not 0 (which keeps the sm_80
    kernels, for tests of both)."""
    return c_sm90_kernels()


# The kernels set_linear_tuning can force (cuda/linear_plan.cu's ForcedPath, in order), the
# CUTLASS stream-K scheduler's decompositions (cutlass DecompositionMode, in order) and the
# tile schedulers' raster orders (cutlass RasterOrderOptions, in order).
LINEAR_TUNING_PATHS = ("skinny", "swap128x16", "swap128x32", "swap128x64", "swap128x128",
                       "128x128", "128x256", "pingpong128x128", "256x128", "128x32", "128x64",
                       "128x32c21", "128x64c21", "128x128c21", "pingpong128x128c21", "256x128c21",
                       "gemm_small", "gemm_large", "gemv")
LINEAR_TUNING_DECOMPOSITIONS = ("heuristic", "data_parallel", "split_k", "stream_k")
LINEAR_TUNING_RASTERS = ("heuristic", "along_m", "along_n")


def cuda_linear_tuning(path=None, skinny_waves=0, decomposition=None, splits=0, swizzle=0,
                       raster=None):
    """Benchmarks only (bench/gpu_kernels_vs_torch.py --plans): every same-dtype or
    block-quantized linear product from now on runs on the kernel `path` (a LINEAR_TUNING_PATHS
    name; None: the planner's choice), the skinny GEMM's split-K aiming at skinny_waves CTAs per
    SM (0: its default) and the CUTLASS GEMM's scheduler on `decomposition` with `splits`
    (None / 0: the planner's); `swizzle` (1, 2, 4, 8) and `raster` (a LINEAR_TUNING_RASTERS
    name) order the CUTLASS GEMMs' tiles, fp8's too (0 / None: the planner's). A product the
    forced kernel cannot take raises ValueError. cuda_linear_tuning() restores the defaults."""
    code = -1 if path is None else LINEAR_TUNING_PATHS.index(path)
    mode = -1 if decomposition is None else LINEAR_TUNING_DECOMPOSITIONS.index(decomposition)
    order = -1 if raster is None else LINEAR_TUNING_RASTERS.index(raster)
    c_set_linear_tuning(code, skinny_waves, mode, splits, swizzle, order)


# The decode kernels set_attention_tuning can force, in order (cuda/attention_decode.cu).
ATTENTION_DECODE_KERNELS = ("split", "balanced")


def cuda_attention_tuning(decode=None):
    """Benchmarks and tests only: every tensor-core decode (head size 64 or 128) from now on
    runs on the kernel `decode` (an ATTENTION_DECODE_KERNELS name: "split", split-KV with a
    CTA per partition of a sequence's head group; "balanced", each head's stream of the
    batch's K/V tiles cut into equal runs, one per resident CTA); None: the planner's choice,
    which cuda_attention_tuning() restores."""
    c_set_attention_tuning(-1 if decode is None else ATTENTION_DECODE_KERNELS.index(decode))


def cuda_device_count():
    return c_cuda_device_count()


cdef inline int _require_cuda() except -1:
    if _cuda_state == 1 or cuda_available():
        return 0
    if not c_cuda_built():
        raise RuntimeError("vllmx.cuda: vllmx was built without CUDA (reinstall with "
                           "VLLMX_CUDA=1 and nvcc on the PATH)")
    raise RuntimeError("vllmx.cuda: no CUDA GPU is available (no NVIDIA driver or no device)")


def cuda_set_device(int device):
    _require_cuda()
    c_cuda_set_device(device)


def cuda_synchronize():
    """Waits for every op queued on vllmx's stream."""
    _require_cuda()
    with nogil:
        c_cuda_synchronize()


def cuda_memory_stats():
    """{'allocated': live bytes handed out, 'reserved': bytes held from the driver}."""
    return {"allocated": c_allocated_bytes(), "reserved": c_reserved_bytes()}


def cuda_empty_cache():
    """Returns the allocator's cached (free) blocks to the driver."""
    with nogil:
        c_empty_cache()


def cuda_device_info():
    """(name, compute capability as major * 10 + minor) of the current device."""
    _require_cuda()
    return c_device_name().decode(), c_device_capability()


def cuda_mem_get_info():
    """(free, total) device memory in bytes."""
    cdef size_t free_b = 0, total_b = 0
    _require_cuda()
    c_mem_get_info(&free_b, &total_b)
    return free_b, total_b


cdef class DeviceBuffer:
    """nbytes of device memory from vllmx's caching allocator, returned to it when collected."""
    cdef void* _ptr
    cdef readonly size_t nbytes

    def __cinit__(self, size_t nbytes):
        self._ptr = NULL
        self.nbytes = nbytes
        _require_cuda()
        with nogil:
            self._ptr = c_device_malloc(nbytes)

    def __dealloc__(self):
        if self._ptr != NULL:
            try:
                c_device_free(self._ptr)
            except Exception:
                pass
            self._ptr = NULL

    @property
    def ptr(self):
        return <uintptr_t>self._ptr

    cdef void* _checked(self, object a, size_t offset, bint writable) except NULL:
        cdef cnp.ndarray arr = <cnp.ndarray?>a
        if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
            raise ValueError("DeviceBuffer: host array must be C-contiguous")
        if writable and not arr.flags.writeable:
            raise ValueError("DeviceBuffer: host array is read-only")
        if offset + <size_t>arr.nbytes > self.nbytes:
            raise ValueError(f"DeviceBuffer: {arr.nbytes} bytes at offset {offset} exceed the "
                             f"buffer of {self.nbytes} bytes")
        return <char*>self._ptr + offset

    def copy_from_host(self, a, size_t offset=0):
        """Copies a C-contiguous numpy array's bytes into the buffer at offset (waits)."""
        cdef void* dst = self._checked(a, offset, False)
        cdef cnp.ndarray arr = a
        cdef const void* src = cnp.PyArray_DATA(arr)
        cdef size_t n = arr.nbytes
        with nogil:
            c_memcpy_h2d(dst, src, n)

    def copy_to_host(self, a, size_t offset=0):
        """Copies the buffer's bytes at offset into a C-contiguous numpy array (waits)."""
        cdef void* src = self._checked(a, offset, True)
        cdef cnp.ndarray arr = a
        cdef void* dst = cnp.PyArray_DATA(arr)
        cdef size_t n = arr.nbytes
        with nogil:
            c_memcpy_d2h(dst, src, n)

    def copy_from_device(self, DeviceBuffer src, size_t nbytes, size_t dst_offset=0,
                         size_t src_offset=0):
        """Queues a device-to-device copy on vllmx's stream."""
        if dst_offset + nbytes > self.nbytes or src_offset + nbytes > src.nbytes:
            raise ValueError("DeviceBuffer.copy_from_device: range outside a buffer")
        with nogil:
            c_memcpy_d2d(<char*>self._ptr + dst_offset, <char*>src._ptr + src_offset, nbytes)

    def copy_2d_from_device(self, DeviceBuffer src, size_t width, size_t height,
                            size_t dst_offset, size_t dst_pitch, size_t src_offset,
                            size_t src_pitch):
        """Queues a copy of height rows of width bytes (pitches apart) on vllmx's stream."""
        if height and (dst_offset + (height - 1) * dst_pitch + width > self.nbytes or
                       src_offset + (height - 1) * src_pitch + width > src.nbytes):
            raise ValueError("DeviceBuffer.copy_2d_from_device: range outside a buffer")
        with nogil:
            c_memcpy_2d_d2d(<char*>self._ptr + dst_offset, dst_pitch,
                            <char*>src._ptr + src_offset, src_pitch, width, height)

    def fill_bytes(self, int value, size_t nbytes, size_t offset=0):
        if offset + nbytes > self.nbytes:
            raise ValueError("DeviceBuffer.fill_bytes: range outside the buffer")
        with nogil:
            c_memset_d(<char*>self._ptr + offset, value, nbytes)


cdef class PinnedHostBuffer:
    """nbytes of page-locked host memory. `array(dtype, n)` views it as numpy; copies between it
    and a DeviceBuffer are queued on vllmx's stream without waiting, so the host must not touch
    the bytes until the stream has passed the copy (CudaEvent / cuda_synchronize)."""
    cdef void* _ptr
    cdef readonly size_t nbytes

    def __cinit__(self, size_t nbytes):
        self._ptr = NULL
        self.nbytes = nbytes
        _require_cuda()
        self._ptr = c_host_alloc_pinned(nbytes)

    def __dealloc__(self):
        if self._ptr != NULL:
            c_host_free_pinned(self._ptr)
            self._ptr = NULL

    def array(self, dtype, Py_ssize_t n, size_t offset=0):
        """A numpy view of n items of dtype at byte offset (it keeps this buffer alive)."""
        dt = np.dtype(dtype)
        if offset + <size_t>(n * dt.itemsize) > self.nbytes:
            raise ValueError(f"PinnedHostBuffer: {n} x {dt} at {offset} exceed {self.nbytes} bytes")
        cdef cnp.npy_intp dims[1]
        dims[0] = n * dt.itemsize
        cdef cnp.ndarray raw = cnp.PyArray_SimpleNewFromData(1, dims, cnp.NPY_UINT8,
                                                             <char*>self._ptr + offset)
        cnp.set_array_base(raw, self)
        return raw.view(dt)

    def copy_to_device(self, DeviceBuffer dst, size_t nbytes, size_t dst_offset=0,
                       size_t src_offset=0):
        """Queues nbytes from here to dst (no wait)."""
        if src_offset + nbytes > self.nbytes or dst_offset + nbytes > dst.nbytes:
            raise ValueError("PinnedHostBuffer.copy_to_device: range outside a buffer")
        with nogil:
            c_memcpy_h2d_async(<char*>dst._ptr + dst_offset, <char*>self._ptr + src_offset, nbytes)

    def copy_from_device(self, DeviceBuffer src, size_t nbytes, size_t dst_offset=0,
                         size_t src_offset=0):
        """Queues nbytes from src to here (no wait: synchronize before reading them)."""
        if dst_offset + nbytes > self.nbytes or src_offset + nbytes > src.nbytes:
            raise ValueError("PinnedHostBuffer.copy_from_device: range outside a buffer")
        with nogil:
            c_memcpy_d2h_async(<char*>self._ptr + dst_offset, <char*>src._ptr + src_offset, nbytes)


cdef class CudaEvent:
    """A point on vllmx's stream: record() marks it, synchronize() waits until the GPU is past
    it (a no-op before the first record)."""
    cdef void* _event
    cdef bint _recorded

    def __cinit__(self):
        _require_cuda()
        self._event = c_event_create()
        self._recorded = False

    def record(self):
        c_event_record(self._event)
        self._recorded = True

    def synchronize(self):
        if self._recorded:
            with nogil:
                c_event_synchronize(self._event)

    def __dealloc__(self):
        if self._event != NULL:
            c_event_destroy(self._event)
            self._event = NULL


cdef class CudaGraph:
    """A captured sequence of ops on vllmx's stream: `capture_begin()`, run the ops (they are
    recorded, not executed), `capture_end()`; then `replay()` runs them again over the same
    device memory. Buffers the ops used must stay alive (and in place) while the graph exists."""
    cdef void* _exec
    cdef bint _capturing

    def __cinit__(self):
        self._exec = NULL
        self._capturing = False

    def capture_begin(self):
        _require_cuda()
        if self._exec != NULL or self._capturing:
            raise RuntimeError("CudaGraph: already captured")
        c_graph_capture_begin()
        self._capturing = True

    def capture_end(self):
        if not self._capturing:
            raise RuntimeError("CudaGraph: capture_end without capture_begin")
        self._capturing = False
        self._exec = c_graph_capture_end()

    def replay(self):
        if self._exec == NULL:
            raise RuntimeError("CudaGraph: nothing captured")
        with nogil:
            c_graph_launch(self._exec)

    def __dealloc__(self):
        if self._exec != NULL:
            c_graph_destroy(self._exec)
            self._exec = NULL


cdef class DeviceArrayBase:
    """A C-contiguous array on the GPU: `buffer` bytes from `offset`, storage `shape` (the shape
    of the matching host array: uint16 for bf16, uint8 rows of blocks for quantized types) and
    `dtype` (GGML id). vllmx.device.DeviceArray adds the numpy-like methods."""
    cdef public DeviceBuffer buffer
    cdef public Py_ssize_t offset
    cdef public int dtype
    cdef public tuple shape


cdef Tensor as_device_tensor(object a, int dtype=-1) except *:
    """The Tensor view (device = kCUDA) of a DeviceArray; None gives an undefined tensor."""
    cdef Tensor t
    cdef DeviceArrayBase d
    cdef int i, nd
    cdef int64_t bs, ts, item, last
    if a is None:
        t.data = NULL
        t.ndim = 0
        return t
    if not isinstance(a, DeviceArrayBase):
        raise TypeError(f"expected a vllmx DeviceArray on the GPU, got {type(a).__name__} "
                        f"(copy host arrays with DeviceArray.from_numpy)")
    d = <DeviceArrayBase>a
    if d.buffer is None or d.shape is None:
        raise ValueError("a DeviceArray has no buffer behind it")
    nd = len(d.shape)
    if nd > 4:
        raise ValueError(f"at most 4 dims, got shape {d.shape}")
    t.dtype = <DType>(dtype if dtype >= 0 else d.dtype)
    t.device = 1  # kCUDA
    t.data = <char*>d.buffer._ptr + d.offset
    t.ndim = nd
    bs = type_traits(t.dtype).block_size
    ts = type_traits(t.dtype).type_size
    item = 1 if type_traits(t.dtype).quantized else ts
    for i in range(nd):
        t.shape[i] = d.shape[i]
    if type_traits(t.dtype).quantized and nd > 0:
        last = d.shape[nd - 1]
        if last % ts != 0:
            raise ValueError(f"{type_traits(t.dtype).name.decode()}: row of {last} bytes is not "
                             f"a whole number of {ts}-byte blocks")
        t.shape[nd - 1] = last // ts * bs
    # Row-major strides: elements for dense types, bytes per row for block types.
    if nd > 0:
        t.stride[nd - 1] = 1
        last = 1
        for i in range(nd - 1, 0, -1):
            last *= d.shape[i]
            t.stride[i - 1] = last
    return t
