"""The device allocator, DeviceArray views and the ops that only move data (column copies and
their per-head form, scatter_tokens, argmax, zero_rows_at_position), exact against numpy or the
CPU op; the helpers are test_cuda_ops.py's."""
import numpy as np
import pytest

from vllmx import _C, ops
from vllmx.device import BF16, F16, F32, I32, U64, DeviceArray

from .test_cuda_ops import ACT, as_f32, assert_close, dev, host, rounded

pytestmark = pytest.mark.gpu


# ---- allocator and arrays ----
def test_pinned_host_buffer_queued_copies():
    """Pinned staging: queued copies both ways, an event that waits for the upload."""
    up, down = _C.PinnedHostBuffer(4096), _C.PinnedHostBuffer(4096)
    a = up.array(np.int32, 1024)
    a[:] = np.arange(1024, dtype=np.int32) * 7
    d = _C.DeviceBuffer(4096)
    up.copy_to_device(d, 4096)
    ev = _C.CudaEvent()
    ev.record()
    ev.synchronize()
    a[:] = -1  # the GPU has its copy: rewriting the staging array changes nothing there
    down.copy_from_device(d, 4096)
    _C.cuda_synchronize()
    np.testing.assert_array_equal(down.array(np.int32, 1024), np.arange(1024) * 7)
    with pytest.raises(ValueError, match="exceed"):
        up.array(np.int64, 513)
    with pytest.raises(ValueError, match="outside"):
        up.copy_to_device(d, 4097)


def test_allocator_reuses_freed_blocks():
    _C.cuda_synchronize()
    base = _C.cuda_memory_stats()
    a = DeviceArray.empty((1000, 1000), F32)  # 4 MB: a size class of its own
    s1 = _C.cuda_memory_stats()
    assert s1["allocated"] - base["allocated"] >= 4_000_000
    assert s1["reserved"] >= s1["allocated"]
    ptr = a.ptr
    del a
    s2 = _C.cuda_memory_stats()
    assert s2["allocated"] == base["allocated"]
    assert s2["reserved"] == s1["reserved"]  # cached, not returned
    b = DeviceArray.empty((1000, 1000), F32)
    assert b.ptr == ptr  # the cached block is handed out again
    assert _C.cuda_memory_stats()["reserved"] == s1["reserved"]
    del b
    _C.cuda_empty_cache()
    assert _C.cuda_memory_stats()["reserved"] < s1["reserved"]
    free, total = _C.cuda_mem_get_info()
    assert 0 < free <= total


@pytest.mark.parametrize("dtype,np_dtype", [(F32, np.float32), (F16, np.float16),
                                            (BF16, np.uint16), (I32, np.int32),
                                            (U64, np.uint64)])
def test_device_array_roundtrip_and_views(rng, dtype, np_dtype):
    a = rng.integers(0, 1000, (6, 10)).astype(np_dtype)
    d = DeviceArray.from_numpy(a, dtype)
    np.testing.assert_array_equal(d.numpy(), a)
    np.testing.assert_array_equal(d.reshape(3, 20).numpy(), a.reshape(3, 20))
    np.testing.assert_array_equal(d[2:5].numpy(), a[2:5])
    np.testing.assert_array_equal(d[4].numpy(), a[4])
    v = d[1:3]
    v.copy_from(np.zeros((2, 10), np_dtype))
    a[1:3] = 0
    np.testing.assert_array_equal(d.numpy(), a)


def test_row_slice_view_feeds_an_op(rng):
    x = rng.standard_normal((8, 128)).astype(np.float32)
    w = np.ones(128, np.float32)
    d = DeviceArray.from_numpy(x)
    out = DeviceArray.empty((3, 128), F32)
    _C.ops.rms_norm(out, d[4:7], DeviceArray.from_numpy(w), 1e-6)
    ref = np.empty((3, 128), np.float32)
    _C.ops.rms_norm(ref, np.ascontiguousarray(x[4:7]), w, 1e-6)
    assert_close(out.numpy(), ref, F32)


def test_bad_arguments_raise_value_errors():
    x = DeviceArray.empty((4, 64), F32)
    with pytest.raises(ValueError, match="rms_norm"):
        _C.ops.rms_norm(DeviceArray.empty((4, 32), F32), x,
                        DeviceArray.from_numpy(np.ones(64, np.float32)), 1e-6)
    # One device per call: the op table names the two that disagree.
    with pytest.raises(ValueError, match="rms_norm: x is on the GPU but out on the CPU"):
        _C.ops.rms_norm(np.empty((4, 64), np.float32), x, x, 1e-6)
    with pytest.raises(ValueError, match="rms_norm: w is on the CPU but out on the GPU"):
        _C.ops.rms_norm(DeviceArray.empty((4, 64), F32), x, np.ones(64, np.float32), 1e-6)


# ---- column split / concat (the fused q/k/v output into contiguous pieces) ----
@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("rows,sizes", [(1, [2048, 1024, 1024]), (37, [64, 32, 32]),
                                        (5, [3, 5, 7])])  # odd widths: the byte-wise path
def test_split_and_concat_columns_exact(dtype, rows, sizes):
    from vllmx import ops

    rng = np.random.default_rng()
    x = host(rng.standard_normal((rows, sum(sizes))).astype(np.float32), dtype)
    d = DeviceArray.from_numpy(x, dtype)
    pieces = ops.split_columns(d, sizes)
    start = 0
    for piece, n in zip(pieces, sizes):
        assert piece.shape == (rows, n)
        np.testing.assert_array_equal(piece.numpy(), x[:, start:start + n])
        start += n
    np.testing.assert_array_equal(ops.concat_columns(pieces).numpy(), x)


@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("case", [(0, 64, 128, 16, 256, 256), (0, 0, 64, 16, 256, 0),
                                  (64, 0, 128, 16, 256, 128), (1, 3, 5, 3, 9, 7)])
def test_copy_head_columns_exact(dtype, case):
    """MLA's key / query assembly: each head's pieces (and a part every head shares, x stride 0)
    into padded heads, 16-byte units where everything aligns, 2-byte ones otherwise."""
    from vllmx import ops

    out_col, x_col, n, heads, ohs, xhs = case
    rng = np.random.default_rng()
    x = host(rng.standard_normal((37, x_col + (heads - 1) * xhs + n)).astype(np.float32), dtype)
    out = host(rng.standard_normal((37, out_col + (heads - 1) * ohs + n + 3)).astype(np.float32),
               dtype)
    d_out = DeviceArray.from_numpy(out, dtype)
    ops.copy_head_columns(d_out, out_col, DeviceArray.from_numpy(x, dtype), x_col, n, heads, ohs,
                          xhs)
    expect = out.copy()
    for h in range(heads):
        expect[:, out_col + h * ohs:][:, :n] = x[:, x_col + h * xhs:][:, :n]
    np.testing.assert_array_equal(d_out.numpy(), expect)


def test_scatter_tokens_matches_the_cpu(rng):
    from vllmx import ops

    n_out, n_tok, n = 300, 257, 120
    out = rng.integers(0, 1 << 30, n_out).astype(np.int32)
    tokens = rng.integers(0, 1 << 30, n_tok).astype(np.int32)
    dst = rng.permutation(n_out)[:n].astype(np.int32)
    src = rng.integers(0, n_tok, n).astype(np.int32)
    dst[5], src[9] = n_out, n_tok  # out of range: skipped
    d_out = DeviceArray.from_numpy(out)
    ops.scatter_tokens(d_out, DeviceArray.from_numpy(dst), DeviceArray.from_numpy(tokens),
                       DeviceArray.from_numpy(src))
    ops.scatter_tokens(out, dst, tokens, src)
    np.testing.assert_array_equal(d_out.numpy(), out)


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
def test_argmax_and_zero_rows_at_position(dtype):
    """The drafters' ops on the device: argmax equal to numpy's on the values the GPU holds
    (ties to the lowest index), rows at position 0 zeroed."""
    rng = np.random.default_rng(11)
    x = rounded(rng.standard_normal((37, 50000)).astype(np.float32), dtype)
    x[3, [7, 40000]] = x[3].max() + 1.0
    got = ops.argmax(dev(x, dtype)).numpy()
    assert np.array_equal(got, np.argmax(x, axis=1).astype(np.int32))
    e = rounded(rng.standard_normal((9, 130)).astype(np.float32), dtype)
    positions = rng.integers(0, 3, 9).astype(np.int32)
    d = dev(e, dtype)
    ops.zero_rows_at_position_(d, DeviceArray.from_numpy(positions), 0)
    assert np.array_equal(as_f32(d.numpy(), dtype), np.where((positions == 0)[:, None], 0.0, e))
