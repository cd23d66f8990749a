"""The step's row -> adapter slot mapping (vLLM's PunicaWrapper over its max_loras slots) and
the batched LoRA product: one add_lora_linear a projection, which groups the rows by slot (the
sgmv shape). The mapping lives in one long-lived buffer that the op reads, so a step tape
(worker/step_capture.py) records the op once and replays it with the slots the rows have at
each step."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.device import StagedArray


class PunicaWrapper:
    def __init__(self, max_num_tokens: int, on_gpu: bool = False):
        # Each row's slot in the LoRA layers' stacks, -1: the base model (the rows past the
        # step's, a tape's or a graph's padding among them, too).
        self.token_lora_indices = np.full(max_num_tokens, -1, dtype=np.int32)
        # On the GPU the op reads a staged device copy, written before each forward.
        self._device = StagedArray(self.token_lora_indices) if on_gpu else None

    def update_metadata(self, token_lora_slots: np.ndarray) -> None:
        """The step's rows' slots (-1: none); called once a step, before the forward."""
        t = len(token_lora_slots)
        self.token_lora_indices[:t] = token_lora_slots
        self.token_lora_indices[t:] = -1
        if self._device is not None:  # (queued after the steps before it, which read it)
            self._device.upload()

    def add_lora_linear(self, y: np.ndarray, x: np.ndarray, lora_a, lora_b,
                        output_slices: np.ndarray) -> None:
        """y[t] += (x[t] A_s^T) B_s^T for each row's slot s, slice by slice of y's columns (B
        holds the scaling)."""
        t = x.shape[0]
        if t > len(self.token_lora_indices):
            raise ValueError(f"LoRA: a forward of {t} rows, more than the "
                             f"{len(self.token_lora_indices)} (max_num_batched_tokens) mapped")
        indices = (self.token_lora_indices[:t] if self._device is None
                   else self._device.view(t))
        ops.add_lora_linear(y, x, lora_a, lora_b, indices, output_slices)
