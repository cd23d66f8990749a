"""A weight as stored (`Weight`: raw bytes, GGUF dtype id, logical shape), the dtype ids, and
the host-side preparation of weights for the CPU kernels: quantizing (llama.cpp's reference
quantizers), repacking block and dense weights into the kernels' 16-row panels, aligning dense
ones. ops (the op facade) re-exports these names, which model code reads from there."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllmx import _C
from vllmx.device import BF16, F16, F32, Q8_0
from vllmx.pages import release_file_pages

# dtype ids: the native DType enum's (GGML's numbering, shared by dense and block types).
Q4_0, Q4_1, Q5_0, Q5_1, Q8_1 = (int(_C.DType[name])
                                for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_1"))
# Weight types `quantize_weight` writes (GGML ids): the k-quants and the 32-block types.
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (int(_C.DType[name])
                                for name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
QUANTIZE_TYPES = {"F32": F32, "F16": F16, "BF16": BF16, "Q4_0": Q4_0, "Q4_1": Q4_1,
                  "Q5_0": Q5_0, "Q5_1": Q5_1, "Q8_0": Q8_0, "Q2_K": Q2_K, "Q3_K": Q3_K,
                  "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K}
# The i-quants with a 16-value non-linear table (read, never written by quantize_weight).
IQ4_NL, IQ4_XS = int(_C.DType.IQ4_NL), int(_C.DType.IQ4_XS)


def dtype_name(dtype: int) -> str:
    return _C.type_info(dtype)[0]


def is_supported(dtype: int) -> bool:
    return bool(_C.type_info(dtype)[4])


@dataclass(frozen=True)
class Weight:
    """A weight as stored: `data` is the raw array (float32/float16, uint16 for bf16, uint8
    rows of blocks for quantized types), `dtype` its id, `shape` the logical shape."""

    data: np.ndarray
    dtype: int
    shape: tuple[int, ...]

    @staticmethod
    def from_numpy(a: np.ndarray) -> Weight:
        a = np.ascontiguousarray(a)
        dtype = {np.dtype(np.float32): F32, np.dtype(np.float16): F16}[a.dtype]
        return Weight(a, dtype, tuple(a.shape))

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def to_float32(self) -> np.ndarray:
        """Dequantized/upcast copy (for small tensors such as norms and biases)."""
        if self.dtype == F32:
            return np.ascontiguousarray(self.data, dtype=np.float32).reshape(self.shape)
        rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        out = np.empty((rows, self.shape[-1]), dtype=np.float32)
        _C.ops.dequantize(out, (self.data.reshape(rows, -1), self.dtype))
        return out.reshape(self.shape)


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.empty on a 64-byte boundary: the CPU kernels read rows in 64-byte loads, which
    straddle cache lines otherwise."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    buf = np.empty(nbytes + 64, np.uint8)
    start = -buf.ctypes.data % 64
    return buf[start:start + nbytes].view(dt).reshape(shape)


def packed_dtype(dtype: int, shape: tuple[int, ...]) -> int:
    """The dtype repack_weight gives a weight of this dtype and shape: its packed layout, or
    dtype itself where this CPU has no packed kernel for it or it has fewer than 16 rows."""
    packed = _C.packed_dtype(dtype)
    return dtype if packed < 0 or len(shape) != 2 or shape[0] < 16 else packed


_REPACK_CHUNK_BYTES = 4 << 20


def repack_weight(w: Weight) -> Weight:
    """A copy of a block or f32 weight in the packed layout of the CPU linear kernels
    (csrc/repack/repack.h): same shape and bytes, its own dtype id. Only `linear` reads packed
    weights (embedding and dequantize need the original, which stays readable). Returns w
    itself where this CPU has no packed kernel for its dtype, or where it has fewer than 16
    rows."""
    packed = packed_dtype(w.dtype, w.shape)
    if packed == w.dtype:
        return w
    src = np.ascontiguousarray(w.data).reshape(w.shape[0], -1)
    # 64-byte aligned, so that the kernels' 64-byte loads of a panel never straddle lines.
    out = aligned_empty(src.shape, src.dtype)
    # Panels cover the bytes of their 16 rows, so whole panels repack independently: chunk by
    # chunk, dropping the file pages of each source chunk (if mapped) once it is copied, so that
    # the original and the copy are never both resident.
    step = max(16, (_REPACK_CHUNK_BYTES // src.strides[0]) // 16 * 16)
    for r in range(0, src.shape[0], step):
        _C.ops.repack_weight((out[r:r + step], packed), (src[r:r + step], w.dtype))
        release_file_pages(src[r:r + step])
    release_file_pages(src)  # the pages that straddle chunk boundaries
    return Weight(out, packed, w.shape)


def align_weight(w: Weight) -> Weight:
    """A dense (f32 / f16 / bf16) matrix whose bytes do not start on a 64-byte boundary, copied
    onto one, file pages dropped as for repack_weight (same bytes, same dtype): the CPU linear
    kernel's 64-byte row loads would otherwise straddle cache lines (MiniLM's f32 shapes on two
    cores: 109-119 -> 150-157 GFLOP/s). Any other weight is returned as it is."""
    if w.dtype not in (F32, F16, BF16) or len(w.shape) != 2 or w.data.ctypes.data % 64 == 0:
        return w
    src = np.ascontiguousarray(w.data).reshape(w.shape[0], -1)
    out = aligned_empty(src.shape, src.dtype)
    step = max(1, _REPACK_CHUNK_BYTES // max(src.strides[0], 1))
    for r in range(0, src.shape[0], step):
        out[r:r + step] = src[r:r + step]
        release_file_pages(src[r:r + step])
    release_file_pages(src)
    return Weight(out, w.dtype, w.shape)


def repack_experts(w: Weight) -> Weight:
    """repack_weight for stacked experts [E, N, K]: each expert's [N, K] block repacked on its
    own (panels never straddle two experts). Returns w where repack_weight would."""
    packed = _C.packed_dtype(w.dtype)
    # (dense experts stay rows: the MoE kernels read them as they are)
    if packed < 0 or w.dtype in (F32, F16, BF16) or len(w.shape) != 3 or w.shape[1] < 16:
        return w
    src = np.ascontiguousarray(w.data).reshape(w.shape[0], w.shape[1], -1)
    out = aligned_empty(src.shape, np.uint8)
    for e in range(src.shape[0]):
        _C.ops.repack_weight((out[e], packed), (src[e], w.dtype))
        release_file_pages(src[e])
    return Weight(out, packed, w.shape)


def quantize_weight(x: np.ndarray, dtype: int) -> np.ndarray:
    """f32 weights [rows, n] in a GGUF type with llama.cpp's reference quantizers (bit-identical
    to llama-quantize without an importance matrix): uint8 [rows, row_bytes] for block types,
    float32 / float16 / uint16 (bf16) [rows, n] for dense ones. n must be a multiple of the
    type's block size (32, or 256 for the k-quants)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"quantize_weight: expected a 2-D array, got shape {x.shape}")
    name, block_size, type_size, quantized, _ = _C.type_info(dtype)
    if quantized:
        if x.shape[1] % block_size:
            raise ValueError(f"quantize_weight: rows of {x.shape[1]} values are not a multiple "
                             f"of the {name} block size {block_size}")
        out = np.empty((x.shape[0], x.shape[1] // block_size * type_size), np.uint8)
    else:
        np_dtype = {F32: np.float32, F16: np.float16, BF16: np.uint16}.get(dtype)
        if np_dtype is None:
            raise ValueError(f"quantize_weight: no quantizer for {name} (id {dtype})")
        out = np.empty(x.shape, np_dtype)
    _C.ops.quantize_weight((out, dtype), x)
    return out
