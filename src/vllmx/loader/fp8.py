"""Checkpoints in vLLM's "fp8" format (quantization_config quant_method "fp8"): with block scales
(`weight_block_size`, as DeepSeek-V3 / R1, Qwen3-*-FP8 and GLM-4.5-FP8 ship) each quantized
linear's fp8 e4m3 `weight` and its `weight_scale_inv` (one f32 scale, or a UE8M0 power of two,
per weight_block_size block, partial at the edges); without, as AutoFP8 writes them, its
`weight` and one f32 `weight_scale` for the tensor (vLLM's per-tensor Fp8LinearMethod). Either
becomes one dense `weight` at load, the product in f32 rounded to the checkpoint's dtype as
transformers' own dequantization does. The activation scheme (static `input_scale`s, or dynamic
per-token(-group) fp8) is not applied: the model runs as W8A16, as vLLM runs these on GPUs
without fp8 tensor cores."""

from __future__ import annotations

import numpy as np

from vllmx.device import BF16, F32
from vllmx.loader import quantization as q
from vllmx.loader.safetensors import FP8_E4M3
from vllmx.ops import Weight

METHOD = "fp8"
_SUFFIXES = ("weight", "weight_scale_inv", "weight_scale", "input_scale", "activation_scale")


def _refuse(what: str) -> ValueError:
    return ValueError(f"fp8 checkpoint: {what} is not supported; vllmx runs fp8 e4m3 weights "
                      f"with block scales (weight_block_size, weight_scale_inv) or one scale a "
                      f"tensor (weight_scale)")


def check_config(quant: dict) -> None:
    """Raises ValueError naming the part of the quantization_config vllmx does not run."""
    block = quant.get("weight_block_size")
    if block is not None and len(block) != 2:
        raise _refuse(f"weight_block_size {block!r}")
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _refuse(f"fmt {fmt!r}")


def dequantize_checkpoint(weights: dict[str, Weight], quant: dict,
                          dtype: str | None) -> q.Dequantized:
    """weights with each fp8 module's weight and scales replaced by its dense `weight`, in the
    checkpoint's dtype (config.json's torch_dtype; bf16 where it names none)."""
    check_config(quant)
    block = quant.get("weight_block_size")
    block = None if block is None else tuple(int(b) for b in block)
    key = "weight_scale" if block is None else "weight_scale_inv"
    target = q.target_dtype(dtype, BF16)

    def make(prefix: str, parts: dict[str, Weight]):
        w, s = parts.get("weight"), parts[key]
        if w is None or w.dtype != FP8_E4M3 or len(w.shape) != 2:
            raise _refuse(f"{prefix}.weight beside a {key} is not a 2-D fp8 e4m3 matrix")
        n, k = w.shape
        grid = (1, 1) if block is None else (-(-n // block[0]), -(-k // block[1]))
        if int(np.prod(s.shape)) != grid[0] * grid[1] or len(s.shape) == 2 and \
                tuple(s.shape) != grid:
            raise _refuse(f"{prefix}.{key} of shape {s.shape} for a [{n}, {k}] weight"
                          + ("" if block is None else f" in {block[0]}x{block[1]} blocks"))

        def dense() -> Weight:
            x = q.weight_values(w) * q.expand(q.float32(s), n, k, block)  # f32, as transformers
            return q.to_dtype(x.astype(np.float32), F32, target)
        return dense

    return q.replace_modules(weights, _SUFFIXES, key, make)
