"""Arrays on the GPU. A DeviceArray is a typed, shaped, C-contiguous view of device bytes from
vllmx's caching allocator; the ops (`vllmx.ops`, `vllmx._C.ops`) take them where they take
numpy arrays, and run their CUDA kernels. Its `shape` is the shape of the matching host array:
uint16 for bf16, uint8 rows of whole blocks for quantized types (GGML dtype ids throughout)."""

from __future__ import annotations

import math

import numpy as np

from vllmx import _C

# dtype ids: the native DType enum's (csrc/core/dtype.h, GGML's numbering), never spelled here.
F32, F16, Q8_0, I32, I64, U8, BF16, U64, F8_E4M3 = (
    int(_C.DType[name]) for name in ("F32", "F16", "Q8_0", "I32", "I64", "U8", "BF16", "U64",
                                     "F8_E4M3"))

_FROM_NUMPY = {
    np.dtype(np.float32): F32,
    np.dtype(np.float16): F16,
    np.dtype(np.int32): I32,
    np.dtype(np.int64): I64,
    np.dtype(np.uint8): U8,
    np.dtype(np.uint64): U64,
}
_HOST_DTYPE = {F32: np.float32, F16: np.float16, BF16: np.uint16, I32: np.int32, I64: np.int64,
               U8: np.uint8, U64: np.uint64, F8_E4M3: np.uint8}


def host_dtype(dtype: int) -> np.dtype:
    """The numpy dtype of a host copy: uint16 for bf16, uint8 for fp8 codes and block types."""
    if dtype in _HOST_DTYPE:
        return np.dtype(_HOST_DTYPE[dtype])
    name, _, _, quantized, _ = _C.type_info(dtype)
    if quantized:
        return np.dtype(np.uint8)
    raise ValueError(f"no host dtype for {name} (id {dtype})")


def dtype_id(np_dtype) -> int:
    """The dtype id of a dense numpy dtype (host_dtype's inverse for float32, int32, ...)."""
    return _FROM_NUMPY[np.dtype(np_dtype)]


# (getattr: a stale _C built before the CUDA bindings still imports; its arrays just can't exist)
class DeviceArray(getattr(_C, "DeviceArrayBase", object)):
    """`buffer` (a _C.DeviceBuffer) bytes from `offset`, storage `shape`, `dtype` id."""

    # What a block-type array's values are read as by an op with no other hint of the model's
    # dtype (an embedding lookup's output): placement.upload_weight sets the activation dtype.
    dequant_dtype: int = BF16
    # An fp8 weight's per-row, per-128-column scales ([K / 128, N] f32), beside its e4m3 codes
    # (ops/fp8.py upload_fp8_block_weight).
    scales: DeviceArray | None = None

    def __init__(self, buffer: _C.DeviceBuffer, dtype: int, shape: tuple[int, ...],
                 offset: int = 0) -> None:
        self.buffer = buffer
        self.dtype = int(dtype)
        self.shape = tuple(int(s) for s in shape)
        self.offset = int(offset)
        if self.offset + self.nbytes > buffer.nbytes:
            raise ValueError(f"DeviceArray: {self.nbytes} bytes at offset {self.offset} exceed "
                             f"a buffer of {buffer.nbytes} bytes")

    # ---- construction ----
    @staticmethod
    def empty(shape: tuple[int, ...] | int, dtype: int) -> DeviceArray:
        """Uninitialised device memory for `shape` (storage shape) of `dtype`."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * host_dtype(dtype).itemsize
        return DeviceArray(_C.DeviceBuffer(nbytes), dtype, shape)

    @staticmethod
    def zeros(shape: tuple[int, ...] | int, dtype: int) -> DeviceArray:
        a = DeviceArray.empty(shape, dtype)
        a.buffer.fill_bytes(0, a.nbytes, a.offset)
        return a

    @staticmethod
    def from_numpy(a: np.ndarray, dtype: int | None = None) -> DeviceArray:
        """A device copy of a host array; dtype overrides numpy's (BF16 for uint16 arrays,
        a block type for uint8 rows of blocks)."""
        a = np.ascontiguousarray(a)
        if dtype is None:
            try:
                dtype = dtype_id(a.dtype)
            except KeyError:
                raise ValueError(f"DeviceArray.from_numpy: unsupported numpy dtype {a.dtype} "
                                 f"(pass dtype= for bf16 or block types)") from None
        elif host_dtype(dtype).itemsize != a.itemsize:
            raise ValueError(f"DeviceArray.from_numpy: {_C.type_info(dtype)[0]} needs host "
                             f"items of {host_dtype(dtype).itemsize} bytes, got {a.dtype}")
        out = DeviceArray.empty(a.shape, dtype)
        out.buffer.copy_from_host(a, out.offset)
        return out

    # ---- access ----
    @property
    def itemsize(self) -> int:
        return host_dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def ptr(self) -> int:
        return self.buffer.ptr + self.offset

    def numpy(self) -> np.ndarray:
        """A host copy (waits for queued work on vllmx's stream)."""
        out = np.empty(self.shape, host_dtype(self.dtype))
        self.buffer.copy_to_host(out, self.offset)
        return out

    def copy_from(self, a: np.ndarray | DeviceArray) -> None:
        """Overwrites this array's bytes with a host array or another device array's."""
        if isinstance(a, DeviceArray):
            if a.nbytes != self.nbytes:
                raise ValueError(f"copy_from: {a.nbytes} bytes into {self.nbytes}")
            self.buffer.copy_from_device(a.buffer, self.nbytes, self.offset, a.offset)
            return
        a = np.ascontiguousarray(a)
        if a.nbytes != self.nbytes:
            raise ValueError(f"copy_from: {a.nbytes} bytes into {self.nbytes}")
        self.buffer.copy_from_host(a, self.offset)

    # ---- views (same buffer) ----
    def reshape(self, *shape: int) -> DeviceArray:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(math.prod(self.shape) // known if s == -1 else s for s in shape)
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        return DeviceArray(self.buffer, self.dtype, shape, self.offset)

    def __getitem__(self, rows: slice | int) -> DeviceArray:
        """Rows a[i] or a[i:j] (step 1): a view of the same buffer."""
        n = self.shape[0]
        row_bytes = self.nbytes // n if n else 0
        if isinstance(rows, int):
            i = rows + n if rows < 0 else rows
            if not 0 <= i < n:
                raise IndexError(f"row {rows} out of range for {n} rows")
            return DeviceArray(self.buffer, self.dtype, self.shape[1:] or (1,),
                               self.offset + i * row_bytes)
        if not isinstance(rows, slice):
            raise TypeError("DeviceArray supports row indices and row slices only")
        start, stop, step = rows.indices(n)
        if step != 1:
            raise ValueError("DeviceArray row slices must have step 1")
        stop = max(start, stop)
        return DeviceArray(self.buffer, self.dtype, (stop - start,) + self.shape[1:],
                           self.offset + start * row_bytes)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray({_C.type_info(self.dtype)[0]}, shape={self.shape})"


class StagedArray:
    """A long-lived device copy of an i32 host array that the host rewrites before each step
    (LoRA rows' slots, a hybrid's state rows): a queued copy from one of two pinned host arrays
    used in turn, as the model runner stages its inputs. A copy that waited (pageable memory)
    would wait for the step in flight and undo asynchronous scheduling; the device array stays
    put, so a CUDA graph reads each step's values where it was captured."""

    def __init__(self, host: np.ndarray):
        self.host = host  # (the caller's, int32: what upload() sends)
        self.device = DeviceArray.from_numpy(host)
        n = host.nbytes
        self._pinned = [_C.PinnedHostBuffer(n) for _ in range(2)]
        self._staging = [p.array(np.int32, len(host)) for p in self._pinned]
        self._copied = [_C.CudaEvent() for _ in range(2)]
        self._turn = 0

    def upload(self) -> None:
        """Queues the host array's current values to the device (after the steps before)."""
        i, self._turn = self._turn, self._turn ^ 1
        self._copied[i].synchronize()  # the copy two steps ago has left this staging array
        self._staging[i][:] = self.host
        self._pinned[i].copy_to_device(self.device.buffer, self.device.nbytes, self.device.offset)
        self._copied[i].record()

    def view(self, n: int) -> DeviceArray:
        """The device array's first n entries."""
        return DeviceArray(self.device.buffer, self.device.dtype, (n,), self.device.offset)


class Uploads:
    """Host int32 arrays to the device in one queued copy from pinned memory (two staging arrays
    used in turn, as StagedArray's): a pageable upload waits for the work queued before it,
    which with asynchronous scheduling is the next step's forward. The device copies live in
    one buffer that the next call's copy overwrites once what is queued before it has run
    (a drafter's metadata: read by the kernels queued right after)."""

    def __init__(self, capacity: int):
        self._pinned = [_C.PinnedHostBuffer(4 * capacity) for _ in range(2)]
        self._staging = [p.array(np.int32, capacity) for p in self._pinned]
        self._copied = [_C.CudaEvent() for _ in range(2)]
        self._device = DeviceArray.empty((capacity,), I32)
        self._turn = 0

    def __call__(self, *arrays: np.ndarray) -> list[DeviceArray]:
        """Each array's device copy (its shape), queued after the work before."""
        i, self._turn = self._turn, self._turn ^ 1
        self._copied[i].synchronize()  # the copy two calls ago has left this staging array
        staging, off, spans = self._staging[i], 0, []
        for a in arrays:
            n = a.size
            if off + n > len(staging):
                raise ValueError(f"Uploads: {off + n} entries past its {len(staging)}")
            staging[off:off + n] = a.reshape(-1)
            spans.append((off, n, a.shape))
            off += n
        self._pinned[i].copy_to_device(self._device.buffer, 4 * off, self._device.offset)
        self._copied[i].record()
        return [self._device[o:o + n].reshape(shape) for o, n, shape in spans]


def memory_stats() -> dict[str, int]:
    """{'allocated', 'reserved'} bytes of vllmx's device allocator."""
    return _C.cuda_memory_stats()
