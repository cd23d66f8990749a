"""ops.repack_weight repacks a file-mapped weight chunk by chunk: the same bytes as one whole
repack (chunk ends off panel and page boundaries, tail rows included), and none of the source's
pages left resident afterwards, though the source still reads the same."""

import mmap
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from vllmx import _C, ops, weights

PAGE = mmap.PAGESIZE


def mapping_rss_kib(path: str) -> int:
    path, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) == 6 and head[5].strip() == path
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_chunked_repack_of_a_mapped_weight(qtype, tmp_path, monkeypatch):
    if _C.packed_dtype(int(qtype)) < 0:
        pytest.skip(f"no packed {qtype.name} kernel on this CPU")
    n, k, skip = 203, 576, 1000  # 12 panels + 11 tail rows, starting mid-page
    rng = np.random.default_rng(int(qtype))
    blocks = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    path = str(tmp_path / "w.bin")
    with open(path, "wb") as f:
        f.write(b"\0" * skip + blocks.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    src = np.frombuffer(mm, np.uint8, blocks.nbytes, skip).reshape(blocks.shape)
    whole = np.empty_like(blocks)
    _C.ops.repack_weight((whole, _C.packed_dtype(int(qtype), False)), (blocks, int(qtype)))

    monkeypatch.setattr(weights, "_REPACK_CHUNK_BYTES", 3 * 16 * blocks.shape[1] + 1)  # 48 rows
    packed = ops.repack_weight(ops.Weight(src, int(qtype), (n, k)))
    assert np.array_equal(packed.data, whole)
    assert mapping_rss_kib(path) * 1024 <= 2 * PAGE  # at most the partial first and last page
    assert np.array_equal(src, blocks)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_align_weight_of_a_mapped_dense_weight(dtype, tmp_path, monkeypatch):
    """A dense weight mapped from a file at an offset off the cache line comes back on a 64-byte
    boundary, copied chunk by chunk with the same bytes, the source's pages dropped; the linear
    op gives the same bits over either."""
    n, k, skip = 150, 96, 1000 + 4
    rng = np.random.default_rng(7)
    w = rng.standard_normal((n, k)).astype(dtype)
    path = str(tmp_path / "w.bin")
    with open(path, "wb") as f:
        f.write(b"\0" * skip + w.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    src = np.frombuffer(mm, dtype=dtype, count=n * k, offset=skip).reshape(n, k)
    assert src.ctypes.data % 64 != 0
    weight = ops.Weight.from_numpy(src)
    monkeypatch.setattr(weights, "_REPACK_CHUNK_BYTES", 7 * k * src.itemsize)  # chunks of 7 rows
    aligned = ops.align_weight(weight)
    assert aligned is not weight and aligned.data.ctypes.data % 64 == 0
    assert aligned.dtype == weight.dtype and aligned.shape == weight.shape
    np.testing.assert_array_equal(aligned.data, w)
    assert mapping_rss_kib(path) <= 2 * PAGE // 1024  # (the partial pages at either end)
    np.testing.assert_array_equal(src, w)  # the source still reads the same
    x = rng.standard_normal((5, k)).astype(np.float32)
    assert np.array_equal(ops.linear(x, aligned), ops.linear(x, weight))
    assert ops.align_weight(aligned) is aligned
