"""LoRA around a Linear or a MergedLinear (vLLM's RowParallelLinearWithLoRA /
MergedColumnParallelLinearWithLoRA / MergedQKVParallelLinearWithLoRA): the base output plus
each token's adapter product. A merged projection holds one slice per module (q, k, v or gate,
up); an adapter's A matrices are stacked and its B matrices placed block-diagonally, so each
adapter costs two matmuls per projection whatever slices it targets."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers.linear import Linear, MergedLinear
from vllmx.lora.models import LoRALayerWeights
from vllmx.lora.punica import PunicaWrapper
from vllmx.ops import Weight


class LinearWithLoRA:
    def __init__(self, base: Linear | MergedLinear, slices: list[str], punica: PunicaWrapper):
        self.base_layer = base
        self.punica = punica
        self.slices = slices  # module names, in the order of the base layer's output columns
        if isinstance(base, MergedLinear):
            self.output_sizes = list(base.output_sizes)
            self.input_size = base.parts[0].weight.shape[-1]
        else:
            self.output_sizes = [base.weight.shape[0]]
            self.input_size = base.weight.shape[-1]
        self.lora_weights: dict[int, tuple[Weight, Weight]] = {}

    def check_lora(self, name: str, module: str, w: LoRALayerWeights) -> None:
        out = self.output_sizes[self.slices.index(module)]
        if w.lora_a.shape[1] != self.input_size or w.lora_b.shape[0] != out:
            raise ValueError(f"LoRA adapter {name!r}: {module} lora_A {w.lora_a.shape} / lora_B "
                             f"{w.lora_b.shape} do not fit the base model's {module} "
                             f"({out} x {self.input_size})")

    def set_lora(self, lora_id: int, per_slice: dict[str, LoRALayerWeights]) -> None:
        parts = [(i, per_slice[m]) for i, m in enumerate(self.slices) if m in per_slice]
        if not parts:
            return
        a = np.concatenate([w.lora_a for _, w in parts])
        b = np.zeros((sum(self.output_sizes), a.shape[0]), np.float32)
        offsets = np.cumsum([0] + self.output_sizes)
        col = 0
        for i, w in parts:
            r = w.lora_a.shape[0]
            b[offsets[i]:offsets[i + 1], col:col + r] = w.lora_b
            col += r
        self.lora_weights[lora_id] = (Weight.from_numpy(a), Weight.from_numpy(b))

    def reset_lora(self, lora_id: int) -> None:
        self.lora_weights.pop(lora_id, None)

    def _active(self) -> bool:
        return any(i in self.lora_weights for i, _ in self.punica.groups)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = self.base_layer(x)
        if self._active():
            self.punica.add_lora_linear(y, x, self.lora_weights)
        return y

    def act_and_mul(self, x: np.ndarray, act: str = "silu") -> np.ndarray:
        if not self._active():
            return self.base_layer.act_and_mul(x, act)
        return ops.act_and_mul(self(x), act)

    def norm_proj(self, x, residual, norm, act: str | None = None):
        # The fused norm + matmul op has no room for the adapters: with any in the step the
        # norm runs alone and its output feeds both the base matmul and the LoRA product.
        if not self._active():
            return self.base_layer.norm_proj(x, residual, norm, act)
        h, residual = (norm(x), x) if residual is None else norm(x, residual)
        y = self(h)
        return (y if act is None else ops.act_and_mul(y, act)), residual
