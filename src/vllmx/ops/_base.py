"""Helpers the op modules share: a tensor argument as the op table takes it, outputs allocated
on their input's device."""

from __future__ import annotations

import math

import numpy as np

from vllmx.device import DeviceArray, dtype_id
from vllmx.weights import Weight, aligned_empty


def _arg(t):
    """A tensor argument of an op: a Weight as (bytes, dtype id), arrays as they are."""
    return (t.data, t.dtype) if isinstance(t, Weight) else t


_ALIGN_FROM_BYTES = 1 << 16


def _host_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.empty, large arrays on a 64-byte boundary (malloc's large blocks start 16 bytes past a
    page; 4% of MiniLM's f32 linear on two cores)."""
    if math.prod(shape) * np.dtype(dtype).itemsize < _ALIGN_FROM_BYTES:
        return np.empty(shape, dtype=dtype)
    return aligned_empty(shape, dtype)


def _empty(like, shape: tuple[int, ...], dtype=None):
    """Uninitialised output on like's device: like's dtype, or the numpy dtype given (its id on
    the GPU)."""
    if isinstance(like, DeviceArray):
        return DeviceArray.empty(shape, like.dtype if dtype is None else dtype_id(dtype))
    return _host_empty(shape, like.dtype if dtype is None else dtype)


def _on_device(a):
    """A host array's device copy (the upload waits: the host array may go right after);
    a DeviceArray as it is."""
    return a if isinstance(a, DeviceArray) else DeviceArray.from_numpy(np.ascontiguousarray(a))
