"""argmax and zero_rows_at_position (the drafters' ops) against numpy on fresh random inputs,
ties included, and their contracts' errors."""

import numpy as np
import pytest

from vllmx import _C, ops


def test_argmax_is_numpys_with_ties_to_the_lowest_index():
    rng = np.random.default_rng()
    x = rng.standard_normal((33, 5000)).astype(np.float32)
    x[3, [7, 4000]] = x[3].max() + 1.0  # a tie: the lower index wins
    x[5] = 0.0  # all equal
    assert np.array_equal(ops.argmax(x), np.argmax(x, axis=1).astype(np.int32))
    assert ops.argmax(x)[3] == 7 and ops.argmax(x)[5] == 0


def test_zero_rows_at_position():
    rng = np.random.default_rng()
    x = rng.standard_normal((9, 12)).astype(np.float32)
    positions = rng.integers(0, 3, 9).astype(np.int32)
    ref = np.where((positions == 0)[:, None], 0.0, x)
    assert np.array_equal(ops.zero_rows_at_position_(x.copy(), positions, 0), ref)


def test_contracts_name_the_problem():
    with pytest.raises(ValueError, match=r"argmax: out_ids .* must be i32 \[B\]"):
        _C.ops.argmax(np.empty(3, np.int32), np.ones((4, 5), np.float32))
    with pytest.raises(ValueError, match="zero_rows_at_position: positions .* must be i32"):
        _C.ops.zero_rows_at_position(np.ones((4, 5), np.float32), np.zeros(3, np.int32), 0)
