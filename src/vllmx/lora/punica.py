"""The step's token -> adapter mapping and the batched LoRA product (vLLM's PunicaWrapper, the
sgmv shape): the rows of one adapter are gathered, run through its A then its B with the linear
op, and added into the base output; rows of the base model (adapter 0) are left alone."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.ops import Weight


class PunicaWrapper:
    def __init__(self):
        # (lora_int_id, the step's row indices that run it), one entry per adapter in the step
        self.groups: list[tuple[int, np.ndarray]] = []

    def update_metadata(self, token_lora_ids: np.ndarray) -> None:
        """Groups the step's rows by adapter; called once a step, before the forward."""
        ids = np.asarray(token_lora_ids)
        self.groups = [(int(i), np.flatnonzero(ids == i)) for i in np.unique(ids) if i > 0]

    def add_lora_linear(self, y: np.ndarray, x: np.ndarray,
                        weights: dict[int, tuple[Weight, Weight]]) -> None:
        """y[rows] += (x[rows] A^T) B^T for each adapter's rows (B holds the scaling)."""
        for lora_id, rows in self.groups:
            ab = weights.get(lora_id)
            if ab is None:  # the adapter does not target this module
                continue
            shrunk = ops.linear(np.ascontiguousarray(x[rows]), ab[0])
            y[rows] += ops.linear(shrunk, ab[1])
