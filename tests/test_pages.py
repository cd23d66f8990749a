"""release_file_pages: the pages of a read-only file mapping leave this process's RSS (smaps'
Rss of the mapping) and come back, with the same bytes, when read again; private mappings,
anonymous arrays and partial pages are left alone. After loading a GGUF model, the parts of the
file that were repacked are no longer resident. lazy_zeros commits base pages as written."""

import mmap
import os

import numpy as np
import pytest

from vllmx.pages import lazy_zeros, release_file_pages

PAGE = mmap.PAGESIZE


def mappings_rss_kib(path: str) -> dict[str, int]:
    """Resident KiB of each of this process's mappings of `path` (by address range)."""
    path, out, current = os.path.realpath(path), {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                current = head[0] if len(head) == 6 and head[5].strip() == path else None
            elif current is not None and head[0] == "Rss:":
                out[current] = out.get(current, 0) + int(head[1])
    return out


def mapping_rss_kib(path: str, exclude=()) -> int:
    """Resident KiB of this process's mappings of `path`, but those in `exclude` (ranges that
    other tests' models in the same process still hold)."""
    return sum(v for k, v in mappings_rss_kib(path).items() if k not in exclude)


def resident_kib(a: np.ndarray) -> int:
    """Resident KiB of the pages holding a's bytes, by mincore(2): exact to the range, where
    smaps reports whole mappings (the kernel merges a new anonymous mapping into a neighbour
    with the same flags, e.g. another test's cache, and smaps would count that one too)."""
    import ctypes

    start = a.ctypes.data // PAGE * PAGE
    n = -(-(a.ctypes.data + a.nbytes - start) // PAGE)
    vec = (ctypes.c_ubyte * n)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(n * PAGE), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) * PAGE // 1024


def range_kib(a: np.ndarray, field: str = "Rss") -> int:
    """A smaps field (KiB), summed over the mappings that overlap a's bytes."""
    start, end, total, inside = a.ctypes.data, a.ctypes.data + a.nbytes, 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside = lo < end and start < hi
            elif inside and head[0] == field + ":":
                total += int(head[1])
    return total


def test_lazy_zeros_commits_only_written_base_pages():
    a = lazy_zeros((64, 1 << 20), np.uint16)  # 128 MiB, like one layer's K cache
    assert a.shape == (64, 1 << 20) and a.dtype == np.uint16 and a.flags.writeable
    assert resident_kib(a) <= 4
    for row in (0, 17, 63):  # three written blocks, far apart
        a[row, 1000:3000] = row + 1
    # np.zeros would ask for transparent huge pages: 2 MiB per written block where available.
    assert resident_kib(a) <= 3 * 2 * PAGE // 1024
    assert range_kib(a, "AnonHugePages") == 0
    assert int(a[17].sum()) == 18 * 2000 and not a[1:17].any()


@pytest.fixture
def mapped_file(tmp_path):
    path = str(tmp_path / "weights.bin")
    data = np.random.default_rng(0).integers(0, 256, 64 * PAGE, dtype=np.uint8)
    data.tofile(path)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return path, data, np.frombuffer(mm, np.uint8)


def test_released_pages_leave_rss_and_read_back_the_same(mapped_file):
    path, data, arr = mapped_file
    assert int(arr.sum(dtype=np.int64)) == int(data.sum(dtype=np.int64))  # fault every page in
    full = mapping_rss_kib(path)
    assert full >= 64 * PAGE // 1024
    # A tensor from mid-page 3 to mid-page 43: pages 4..42 are wholly its own.
    tensor = arr[3 * PAGE + 100:43 * PAGE + 100].reshape(40, PAGE)
    assert release_file_pages(tensor) == 39 * PAGE
    assert mapping_rss_kib(path) == full - 39 * PAGE // 1024
    assert np.array_equal(tensor.reshape(-1), data[3 * PAGE + 100:43 * PAGE + 100])
    assert mapping_rss_kib(path) == full


def test_partial_pages_and_other_memory_are_kept(mapped_file, tmp_path):
    path, _, arr = mapped_file
    arr.sum()
    full = mapping_rss_kib(path)
    assert release_file_pages(arr[10:PAGE - 10]) == 0  # inside one page
    assert release_file_pages(np.ones(16 * PAGE, np.uint8)) == 0  # anonymous
    assert release_file_pages(arr[::2]) == 0  # not contiguous
    assert mapping_rss_kib(path) == full
    # A private writable mapping may hold bytes the file does not: never dropped.
    with open(path, "rb") as f:
        private = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), np.uint8)
    private[:] = 7
    assert release_file_pages(private) == 0
    assert (private == 7).all()


def test_loaded_gguf_keeps_only_unpacked_tensors_resident(smollm2_gguf):
    """SmolLM2's Q4_1 / Q8_0 matrices are repacked (where this CPU has the packed kernels) and
    its q/k/v and gate/up are fused into copies: of the 98 MB file, only norms stay mapped."""
    from vllmx import _C
    from vllmx.config import ModelConfig
    from vllmx.loader import load_model

    if _C.packed_dtype(3) < 0:
        pytest.skip("no packed Q4_1 kernel on this CPU: the file itself is the weight")
    earlier = set(mappings_rss_kib(smollm2_gguf))  # other tests' engines in this process
    model, _ = load_model(ModelConfig(smollm2_gguf, skip_tokenizer_init=True))
    size_kib = os.path.getsize(smollm2_gguf) // 1024
    assert mapping_rss_kib(smollm2_gguf, exclude=earlier) < 0.05 * size_kib
    assert model.vocab_size == 49152
