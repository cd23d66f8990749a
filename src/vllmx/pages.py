"""Page-level control of how much memory counts as resident: the pages of a weight in a
read-only file mapping (a GGUF or safetensors file) dropped once its bytes live elsewhere, and
zeroed buffers committed page by page as they are written (the CPU KV cache).

Mapped file pages count in the process's RSS for as long as they stay mapped, so without
release_file_pages a repacked model is resident twice. The file stays the source of truth:
madvise(MADV_DONTNEED) on a read-only shared mapping only unmaps the pages, and a page read
again later (an embedding row of a table tied to a repacked lm_head) is mapped back from the
page cache. It changes how much of the file counts as resident, never what a read returns."""

from __future__ import annotations

import math
import mmap

import numpy as np


def _read_only_mapping(a: np.ndarray) -> mmap.mmap | None:
    """The mmap.mmap at the root of a's base chain (np.frombuffer or np.memmap), if read-only."""
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's base
        base = base.obj
    if not isinstance(base, mmap.mmap) or base.closed:
        return None
    with memoryview(base) as view:  # a private (ACCESS_COPY) mapping is writable: its pages
        return base if view.readonly else None  # may hold data the file does not


def release_file_pages(a: np.ndarray) -> int:
    """Unmaps the whole pages of a's bytes from this process if `a` is a contiguous view of a
    read-only file mapping; returns the bytes released (0 for anything else). The partial pages
    at either end are kept, as a neighbouring tensor may still be read through them."""
    mapping = _read_only_mapping(a)
    if mapping is None or not a.flags.c_contiguous or a.nbytes == 0:
        return 0
    offset = a.ctypes.data - np.frombuffer(mapping, np.uint8, 1).ctypes.data
    page = mmap.PAGESIZE
    lo = -(-offset // page) * page
    hi = (offset + a.nbytes) // page * page
    if hi <= lo:
        return 0
    mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return hi - lo


def file_mappings(arrays) -> list[mmap.mmap]:
    """The distinct read-only file mappings the arrays are views of."""
    found: dict[int, mmap.mmap] = {}
    for a in arrays:
        m = _read_only_mapping(a) if isinstance(a, np.ndarray) else None
        if m is not None:
            found[id(m)] = m
    return list(found.values())


def release_mapping(mapping: mmap.mmap) -> None:
    """Unmaps every page of a read-only file mapping from this process, once a model is built:
    repacking released each weight's pages, but reads of their neighbours mapped many back
    (the kernel maps a fault's surroundings: 22 MB of SmolLM2's 94 MB file). A tensor still
    read through the mapping (a table no copy replaced) is mapped back as it is read."""
    if not mapping.closed:
        mapping.madvise(mmap.MADV_DONTNEED)


def off_the_file(a: np.ndarray) -> np.ndarray:
    """a copied into the process's own memory if it is a view of a read-only file mapping,
    else a itself: for small arrays a forward reads (norm weights, biases) whose file pages,
    each read in again, bring in their neighbours' too (the kernel maps a fault's surroundings:
    SmolLM2's 61 norm vectors had 20 MB of already-repacked weights' pages back in the RSS)."""
    return np.array(a) if _read_only_mapping(a) is not None else a


def lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros in a private anonymous mapping of their own, committed a base page at a time as
    they are first written. np.zeros is lazy too, but numpy asks for transparent huge pages on
    arrays of 4 MB and more, and then one written KV block commits 2 MB of its layer's cache."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mapping.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mapping, dtype).reshape(shape)


def _libc(name: str):
    import ctypes
    import ctypes.util

    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune or trim
        return None


_malloc_trim = _libc("malloc_trim")
_mallopt = _libc("mallopt")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# A CPU forward's activations (a prefill chunk's [tokens, intermediate] f32 buffers: 50 MB for
# MiniLM's 64 x 128-token batches) up to this size come from the heap, not mmap: glibc maps
# larger blocks afresh each time and unmaps them on free, so the kernel zeroed every page of
# every such buffer again (clear_page, ~10% of MiniLM's embedding batches; the 8-12% vLLM's CPU
# backend gets from tcmalloc). Freed, they stay in the heap for the next step; release_free_heap
# (malloc_trim) still hands free pages back.
_HEAP_BLOCK_BYTES = 256 << 20


def keep_activations_in_heap() -> None:
    """Raises glibc's mmap threshold (and the heap's trim threshold with it) for the process;
    a no-op elsewhere."""
    if _mallopt is not None:
        _mallopt(_M_MMAP_THRESHOLD, _HEAP_BLOCK_BYTES)
        _mallopt(_M_TRIM_THRESHOLD, 2 * _HEAP_BLOCK_BYTES)


def release_free_heap() -> None:
    """Hands the C heap's free memory back to the OS (glibc's malloc_trim). A megabytes-long
    prompt makes the tokenizer allocate hundreds of MB of scratch in a worker thread's arena;
    freed, it stays resident, so one large request would raise the RSS for good."""
    if _malloc_trim is not None:
        _malloc_trim(0)
