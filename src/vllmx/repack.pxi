# Weight repacking for the CPU linear kernels (csrc/repack/repack.h), included at the end of _C.pyx.

cdef extern from "repack/repack.h" namespace "vllmx":
    DType c_packed_dtype "vllmx::packed_dtype"(DType)
    bint c_packed_is_fast "vllmx::packed_is_fast"(DType)


def packed_dtype(int dtype, bint only_if_fast=True):
    """The packed dtype id of a weight type (e.g. Q4_0 -> Q4_0_X16, F32 -> F32_X16), or -1 where
    there is none (or, with only_if_fast, where this CPU has no fast kernel for it)."""
    cdef DType p = c_packed_dtype(<DType>dtype)
    if p == DType.U8 or (only_if_fast and not c_packed_is_fast(<DType>dtype)):
        return -1
    return <int>p
