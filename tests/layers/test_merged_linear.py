"""MergedLinear: one matmul for projections of one dtype, separate ones (outputs concatenated)
when the dtypes differ, as in Q4_K_M files; either way equal to the projections alone."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from vllmx.layers.linear import Linear, MergedLinear
from vllmx.ops import Weight

Q = gguf.GGMLQuantizationType


def qweight(rng, qt, n, k) -> Weight:
    data = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qt)
    return Weight(data, int(qt), (n, k))


@pytest.mark.parametrize("types", [(Q.Q4_0, Q.Q4_0, Q.Q4_0), (Q.Q4_0, Q.Q4_0, Q.Q8_0)])
def test_merged_equals_separate(types):
    rng = np.random.default_rng()
    sizes = (64, 32, 32)
    ws = [qweight(rng, qt, n, 128) for qt, n in zip(types, sizes)]
    bs = [Weight.from_numpy(rng.standard_normal(n).astype(np.float32)) for n in sizes]
    x = rng.standard_normal((5, 128)).astype(np.float32)
    merged = MergedLinear(ws, bs)
    assert len(merged.parts) == (1 if len(set(types)) == 1 else len(types))
    pieces = merged.split(merged(x))
    for piece, w, b in zip(pieces, ws, bs):
        assert piece.flags.c_contiguous
        np.testing.assert_allclose(piece, Linear(w, b)(x), rtol=1e-5, atol=1e-5)
