"""Linear layers over weights kept in their stored format (f32/f16/bf16 or GGUF blocks). Block
weights are repacked once, here, into the layout of the CPU kernels (ops.repack_weight)."""

from __future__ import annotations

import weakref

import numpy as np

from vllmx import ops
from vllmx.ops import Weight

# Packed copies by id of the source array, so that Linears sharing a weight share one copy.
_packed: dict[int, Weight] = {}


def packed(weight: Weight) -> Weight:
    key = id(weight.data)
    hit = _packed.get(key)
    if hit is not None:
        return hit
    p = ops.repack_weight(weight)
    if p is not weight:
        _packed[key] = p
        weakref.finalize(weight.data, _packed.pop, key, None)
    return p


class Linear:
    def __init__(self, weight: Weight, bias: Weight | None = None):
        self.weight = packed(weight)
        self.bias = None if bias is None else np.ascontiguousarray(bias.to_float32())

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ops.linear(x, self.weight, self.bias)


def concat_rows(weights: list[Weight]) -> Weight:
    """One weight from several with the same input size and dtype (e.g. gate and up), so one
    matmul serves them. Rows of blocks are independent, so this is exact for every dtype."""
    dtypes = {w.dtype for w in weights}
    ks = {w.shape[-1] for w in weights}
    if len(dtypes) != 1 or len(ks) != 1:
        raise ValueError(f"cannot fuse weights of dtypes {dtypes} and input sizes {ks}")
    data = np.concatenate([np.asarray(w.data) for w in weights], axis=0)
    return Weight(data, weights[0].dtype, (sum(w.shape[0] for w in weights), ks.pop()))
