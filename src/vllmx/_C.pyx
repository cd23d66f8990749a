# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""Thin bindings over the native core. Every op is reached generically through the op table
(`vllmx._C.ops.<name>(...)`, op_table.pxi). Tensor arguments are numpy arrays (host) or
DeviceArrays (GPU); bf16 host tensors travel as uint16 arrays and quantized ones as uint8 arrays
of whole blocks, given as (array, dtype id) with GGML's numbering. The GIL is released around
every native call."""
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t

import numpy as np

cnp.import_array()

_NP_DTYPES = {
    np.dtype(np.float32): DType.F32,
    np.dtype(np.float16): DType.F16,
    np.dtype(np.int32): DType.I32,
    np.dtype(np.int64): DType.I64,
    np.dtype(np.uint8): DType.U8,
    np.dtype(np.uint64): DType.U64,
}


cdef Tensor as_tensor(object a, int dtype=-1) except *:
    """A view of a C-contiguous numpy array; `dtype` overrides the numpy dtype (bf16, blocks).
    A quantized tensor is a uint8 array [rows, row_bytes]; its shape is reported in elements."""
    cdef Tensor t
    cdef cnp.ndarray arr
    cdef int i
    cdef int64_t bs, ts
    if a is None:
        t.data = NULL
        t.ndim = 0
        return t
    if isinstance(a, DeviceArrayBase):
        return as_device_tensor(a, dtype)
    arr = <cnp.ndarray?>a
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"expected a C-contiguous array, got strides {a.strides}")
    if arr.ndim > 4:
        raise ValueError(f"at most 4 dims, got shape {a.shape}")
    if dtype < 0:
        try:
            t.dtype = _NP_DTYPES[arr.dtype]
        except KeyError:
            raise ValueError(f"unsupported numpy dtype {arr.dtype}") from None
    else:
        t.dtype = <DType>dtype
    t.data = cnp.PyArray_DATA(arr)
    t.ndim = arr.ndim
    for i in range(arr.ndim):
        t.shape[i] = arr.shape[i]
    bs = type_traits(t.dtype).block_size
    ts = type_traits(t.dtype).type_size
    if type_traits(t.dtype).quantized:
        if arr.dtype != np.uint8:
            raise ValueError(f"{type_traits(t.dtype).name.decode()} data must be uint8 blocks")
        if arr.shape[arr.ndim - 1] % ts != 0:
            raise ValueError(
                f"{type_traits(t.dtype).name.decode()}: row of {arr.shape[arr.ndim - 1]} bytes "
                f"is not a whole number of {ts}-byte blocks")
        t.shape[arr.ndim - 1] = arr.shape[arr.ndim - 1] // ts * bs
    elif dtype >= 0 and arr.itemsize != ts:
        raise ValueError(f"{type_traits(t.dtype).name.decode()} needs {ts}-byte items, "
                         f"got {arr.dtype}")
    # Row-major strides in elements (bytes per row for block types, in stride[0..ndim-2]).
    if arr.ndim > 0:
        t.stride[arr.ndim - 1] = 1
        for i in range(arr.ndim - 2, -1, -1):
            t.stride[i] = arr.strides[i] if type_traits(t.dtype).quantized else arr.strides[i] // arr.itemsize
    return t


include "step_tape.pxi"


def type_info(int dtype):
    """(name, block_size, type_size, quantized, supported) of a dtype id."""
    cdef TypeTraits tt = type_traits(<DType>dtype)
    return tt.name.decode(), tt.block_size, tt.type_size, tt.quantized, tt.supported


def cpu_info():
    cdef CpuFeatures f = cpu_features()
    return {"avx2": f.avx2, "avx512": f.avx512, "avx512_vnni": f.avx512_vnni,
            "avx512_bf16": f.avx512_bf16, "avx_vnni": f.avx_vnni}


def set_num_threads(int n):
    """Threads for the native ops (n <= 0: all cores)."""
    c_set_num_threads(n)


def get_num_threads():
    return c_get_num_threads()


include "block_pool.pxi"
include "repack.pxi"
include "cuda.pxi"
include "op_table.pxi"
