"""Checkpoints in vLLM's "fp8" format (quantization_config quant_method "fp8"): with block scales
(`weight_block_size`, as DeepSeek-V3 / R1, Qwen3-*-FP8 and GLM-4.5-FP8 ship) each quantized
linear's fp8 e4m3 `weight` and its `weight_scale_inv` (one f32 scale, or a UE8M0 power of two,
per weight_block_size block, partial at the edges); without, as AutoFP8 writes them, its
`weight` and one f32 `weight_scale` for the tensor (vLLM's per-tensor Fp8LinearMethod). Either
becomes one dense `weight` at load, the product in f32 rounded to the checkpoint's dtype as
transformers' own dequantization does, and the model runs as W8A16 (as vLLM runs these on GPUs
without fp8 tensor cores) — except on a Hopper GPU, where a weight whose scales are constant over
128-wide column groups (per tensor, or blocks 128 columns wide) and whose shape the fp8 GEMM
takes (K a multiple of 128, N of 8) keeps its codes, each row's scale per group beside them
(ops.fp8_block_weight), and runs as vLLM runs it there: activations quantized per token and
128-wide group to fp8 (dynamic, whatever activation_scheme says), fp8 tensor cores
(ops.scaled_mm)."""

from __future__ import annotations

import numpy as np

from vllmx.device import BF16, F32
from vllmx.loader import quantization as q
from vllmx.loader.safetensors import FP8_E4M3
from vllmx.ops import Weight
from vllmx.ops.fp8 import GROUP, fp8_block_weight, fp8_gemm_fits

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


def fp8_gemm_takes(n: int, k: int) -> bool:
    """Whether an [n, k] fp8 weight may run on the GPU's fp8 GEMM: the model being built is
    placed on a Hopper GPU and the GEMM takes the shape (its scales must fit too:
    fp8_row_group_scales)."""
    from vllmx import _C
    from vllmx.layers import placement

    return placement.current().on_gpu and _C.cuda_sm90_kernels() and fp8_gemm_fits(n, k)


def fp8_row_group_scales(scale: np.ndarray, n: int, k: int,
                         block: tuple[int, int] | None) -> np.ndarray | None:
    """Each row's scale per 128-wide group of K (f32 [n, k // 128], what ops.fp8_block_weight
    takes) for a scheme whose scale is constant over each such group — per tensor, per channel,
    groups or blocks whole multiples of 128 wide — else None."""
    if k % GROUP:
        return None
    cols = scale.reshape(scale.shape[0], -1).shape[1] if scale.size > 1 else 1
    if scale.size == 1 or scale.shape[0] == n and cols == 1:
        fits = True
    elif block is not None:
        fits = block[1] % GROUP == 0
    else:  # groups along K
        fits = scale.shape[0] == n and k % cols == 0 and (k // cols) % GROUP == 0
    full = q.expand(scale, n, k, block) if fits else None
    return None if full is None else np.ascontiguousarray(full[:, ::GROUP], np.float32)


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
            rows = fp8_row_group_scales(q.float32(s), n, k, block) if fp8_gemm_takes(n, k) \
                else None
            if rows is not None:  # W8A8 on Hopper
                return fp8_block_weight(q.array(w).reshape(n, k), rows)
            x = q.weight_values(w) * q.expand(q.float32(s), n, k, block)  # f32, as transformers
            return q.to_dtype(x.astype(np.float32), F32, target)
        return dense

    return q.replace_modules(weights, _SUFFIXES, key, make)
