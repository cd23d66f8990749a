"""MergedLinear: one matmul for projections of one dtype, separate ones (outputs concatenated)
when the dtypes differ, as in Q4_K_M files; either way equal to the projections alone."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from vllmx import ops
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
    pieces = ops.split_columns(merged(x), merged.output_sizes)
    for piece, w, b in zip(pieces, ws, bs):
        assert piece.flags.c_contiguous
        np.testing.assert_allclose(piece, Linear(w, b)(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("types", [(Q.Q8_0, Q.Q8_0), (Q.Q4_0, Q.Q8_0)])
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
def test_act_and_mul_equals_gate_then_up(types, act):
    """act(gate(x)) * up(x), merged into one matmul or not."""
    rng = np.random.default_rng(7)
    gate, up = (qweight(rng, qt, 96, 64) for qt in types)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    got = MergedLinear([gate, up], [None, None]).act_and_mul(x, act)
    g = Linear(gate)(x)
    if act == "silu":
        a = g / (1 + np.exp(-g))
    else:
        import torch

        a = torch.nn.functional.gelu(torch.from_numpy(g), approximate=(
            "tanh" if act == "gelu_tanh" else "none")).numpy()
    np.testing.assert_allclose(got, a * Linear(up)(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="act must be"):
        ops.linear_act_and_mul(x, gate, "relu")
