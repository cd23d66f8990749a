"""NVIDIA ModelOpt checkpoints (quantization_config quant_method "modelopt", as vLLM reads them;
the algorithm under `quant_algo`, at the top or in a `quantization` sub-dict): FP8 is fp8 e4m3
weights with one f32 `weight_scale` a tensor — the layout fp8.py reads without
weight_block_size — dequantized at load the same way and run as W8A16. NVFP4 / MXFP8 / the
mixed-precision algorithms and a quantized KV cache (`kv_cache_quant_algo`) are refused by name."""

from __future__ import annotations

from vllmx.loader import fp8
from vllmx.ops import Weight

METHOD = "modelopt"


def _algos(quant: dict) -> tuple[str | None, str | None]:
    q = quant.get("quantization", quant)
    return q.get("quant_algo"), q.get("kv_cache_quant_algo")


def check_config(quant: dict) -> None:
    algo, kv = _algos(quant)
    if str(algo).upper() != "FP8":
        raise ValueError(f"modelopt checkpoint: quant_algo {algo!r} is not supported; vllmx runs "
                         f"ModelOpt's FP8 (fp8 e4m3 weights, one scale a tensor)")
    if kv is not None:
        raise ValueError(f"modelopt checkpoint: kv_cache_quant_algo {kv!r} (a quantized KV "
                         f"cache) is not supported")


def dequantize_checkpoint(weights: dict[str, Weight], quant: dict, dtype: str | None):
    check_config(quant)
    return fp8.dequantize_checkpoint(weights, {"quant_method": "fp8"}, dtype)
