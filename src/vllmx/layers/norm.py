from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.device import F32
from vllmx.layers import placement
from vllmx.ops import Weight


class RMSNorm:
    def __init__(self, weight: Weight, eps: float):
        # f32 on every device: the CUDA kernel takes an f32 weight beside bf16 / f16 x.
        self.weight = placement.upload_vector(
            np.ascontiguousarray(weight.to_float32(), dtype=np.float32), F32)
        self.eps = eps

    def __call__(self, x: np.ndarray, residual: np.ndarray | None = None):
        """rms_norm(x); with a residual, vLLM's fused form: returns (normed, new residual)."""
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x, residual


def pre_norm(norm, h, residual):
    """(normed h, residual) ahead of a layer's mixer: the first layer's residual stream is the
    embeddings themselves (residual None); later layers add h to it and norm the sum in one op
    (vLLM's fused_add_rms_norm)."""
    if residual is None:
        return norm(h), h
    return norm(h, residual)


class LayerNorm:
    """torch.nn.LayerNorm over the last dim, bias optional (Cohere's has none). weight [H]; or
    [G, D] to norm each of a row's G heads of D values with its own weight (StableLM's and
    Cohere's q/k norms)."""

    def __init__(self, weight: Weight, bias: Weight | None, eps: float):
        w = np.ascontiguousarray(weight.to_float32(), dtype=np.float32)
        self.weight = placement.upload_vector(w, F32)  # f32 on every device, as RMSNorm's
        self.bias = None if bias is None else placement.upload_vector(
            np.ascontiguousarray(bias.to_float32().reshape(w.shape), dtype=np.float32), F32)
        self.eps = eps

    def __call__(self, x: np.ndarray, residual: np.ndarray | None = None):
        """layer_norm(x); with a residual, the fused form: returns (normed, new residual)."""
        if residual is None:
            return ops.layer_norm(x, self.weight, self.bias, self.eps)
        ops.fused_add_layer_norm(x, residual, self.weight, self.bias, self.eps)
        return x, residual


class ResidualAdd:
    """residual += x in place, x overwritten (a second branch joining the residual stream: OLMo's
    post-norms, the parallel attention + MLP of GPT-NeoX, StableLM, Cohere). The op table has no
    plain add: this is fused_add_rms_norm with a unit weight (the sum is exact; the norm it also
    writes into x is not used)."""

    def __init__(self, hidden_size: int):
        self._unit = RMSNorm(Weight.from_numpy(np.ones(hidden_size, np.float32)), 1e-6)

    def __call__(self, x, residual) -> None:
        self._unit(x, residual)
