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
