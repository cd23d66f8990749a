"""copy_columns, scatter_tokens and scale (csrc/layers/copy.cpp) against numpy: all are exact."""

from __future__ import annotations

import numpy as np
import pytest

from vllmx import _C, ops

rng = np.random.default_rng()


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_copy_columns(dtype):
    x = rng.standard_normal((5, 40)).astype(dtype)
    out = np.zeros((5, 30), dtype=dtype)
    _C.ops.copy_columns(out, 7, x, 11, 20)
    expect = np.zeros_like(out)
    expect[:, 7:27] = x[:, 11:31]
    assert np.array_equal(out, expect)


def head_copy_expected(out, out_col, x, x_col, n, heads, ohs, xhs):
    expect = out.copy()
    for h in range(heads):
        expect[:, out_col + h * ohs:out_col + h * ohs + n] = x[:, x_col + h * xhs:x_col + h * xhs + n]
    return expect


# (out_col, x_col, n, heads, out_head_stride, x_head_stride): pieces of each head; the rope part
# every head shares (x_head_stride 0, as MLA's keys take it); odd sizes.
HEAD_COPIES = [(0, 0, 4, 3, 8, 6), (4, 2, 4, 3, 8, 6), (1, 5, 3, 4, 7, 0), (0, 0, 24, 1, 0, 0)]


@pytest.mark.parametrize("case", HEAD_COPIES)
def test_copy_head_columns(case):
    x = rng.standard_normal((5, 30)).astype(np.float32)
    out = rng.standard_normal((5, 32)).astype(np.float32)  # columns no head writes keep theirs
    expect = head_copy_expected(out, *case[:1], x, *case[1:])
    ops.copy_head_columns(out, case[0], x, *case[1:])
    assert np.array_equal(out, expect)


def test_copy_head_columns_range_checked():
    out, x = np.zeros((2, 30), np.float32), np.zeros((2, 40), np.float32)
    with pytest.raises(ValueError, match="out of range"):
        ops.copy_head_columns(out, 0, x, 0, 8, 4, 8, 8)  # the 4th head ends at column 32
    with pytest.raises(ValueError, match="overlap"):
        ops.copy_head_columns(out, 0, x, 0, 8, 2, 4, 8)
    with pytest.raises(ValueError, match="heads"):
        ops.copy_head_columns(out, 0, x, 0, 8, 0, 8, 8)


def test_split_and_concat_columns_round_trip():
    x = rng.standard_normal((3, 64 + 16 + 16)).astype(np.float32)
    q, k, v = ops.split_columns(x, [64, 16, 16])
    assert np.array_equal(q, x[:, :64]) and np.array_equal(v, x[:, 80:])
    assert q.flags.c_contiguous
    assert np.array_equal(ops.concat_columns([q, k, v]), x)


@pytest.mark.parametrize("bad", [(0, 35, 10), (25, 0, 10), (-1, 0, 3), (0, 0, -1)])
def test_copy_columns_range_checked(bad):
    out_col, x_col, n = bad
    with pytest.raises(ValueError, match="copy_columns"):
        _C.ops.copy_columns(np.zeros((2, 30), np.float32), out_col, np.zeros((2, 40), np.float32),
                            x_col, n)


def test_copy_columns_rejects_mismatch():
    with pytest.raises(ValueError, match="same rows"):
        _C.ops.copy_columns(np.zeros((2, 4), np.float32), 0, np.zeros((3, 4), np.float32), 0, 4)
    with pytest.raises(ValueError, match="one dense dtype"):
        _C.ops.copy_columns(np.zeros((2, 4), np.float32), 0, np.zeros((2, 4), np.int32), 0, 4)


def test_scale_matches_numpy_bit_for_bit():
    x = rng.standard_normal((7, 33)).astype(np.float32)
    s = np.float32(np.sqrt(640.0))
    expect = x * s
    out = np.empty_like(x)
    _C.ops.scale(out, x, s)
    assert np.array_equal(out, expect)
    ops.scale_(x, s)  # in place
    assert np.array_equal(x, expect)


def test_scatter_tokens_against_numpy():
    """out[dst[i]] = tokens[src[i]]; entries whose index is out of range are skipped."""
    for _ in range(20):
        n_out, n_tok = int(rng.integers(1, 300)), int(rng.integers(1, 300))
        out = rng.integers(0, 1 << 30, n_out).astype(np.int32)
        tokens = rng.integers(0, 1 << 30, n_tok).astype(np.int32)
        n = int(rng.integers(0, min(n_out, n_tok) + 1))
        dst = rng.permutation(n_out)[:n].astype(np.int32)
        src = rng.integers(0, n_tok, n).astype(np.int32)
        if n:
            dst[rng.integers(0, n)] = n_out + 3  # skipped
            src[rng.integers(0, n)] = -1  # skipped
        expect = out.copy()
        for d, s in zip(dst, src):
            if 0 <= d < n_out and 0 <= s < n_tok:
                expect[d] = tokens[s]
        ops.scatter_tokens(out, dst, tokens, src)
        assert np.array_equal(out, expect)


def test_scatter_tokens_checks_its_arguments():
    i32 = np.zeros(4, np.int32)
    with pytest.raises(ValueError, match="scatter_tokens"):
        ops.scatter_tokens(i32, i32[:3], i32, i32)  # dst and src lengths differ
    with pytest.raises(ValueError, match="scatter_tokens"):
        ops.scatter_tokens(np.zeros(4, np.float32), i32, i32, i32)
