"""Checkpoints in the compressed-tensors format (config.json's quantization_config with
quant_method "compressed-tensors", as llm-compressor writes them and vLLM reads them): integer
weights packed into int32 words ("pack-quantized": W4A16, W8A16, symmetric or with zero points,
per channel or per group), int8 stored as is
("int-quantized" / "naive-quantized"), fp8 e4m3 ("float-quantized": per tensor, channel or
128x128 block), NVFP4 and MXFP4 ("nvfp4-pack-quantized", "mxfp4-pack-quantized").

Each quantized linear's tensors (`weight_packed` / `weight` and `weight_scale`, `weight_zero_point`,
`weight_shape`) become one dense `weight` at load, dequantized as
compressed-tensors' own `dequantize` does — (q - zero_point) * scale in the scale's dtype — so
that the model runs the matrices the format's reference decompression gives, in the checkpoint's
dtype. Activation quantization in the scheme (FP8's or INT8's static or dynamic input scales)
is not applied: W8A8 checkpoints run as W8A16, as vLLM runs fp8 ones on GPUs without fp8
tensor cores — except fp8 weights on a Hopper GPU whose scales are constant over 128-wide
column groups (fp8_row_group_scales): those run W8A8 as loader/fp8.py's do (activations
quantized per token and 128-wide group, dynamically, whatever the scheme's input scales say;
not yet run on a GPU). Elsewhere they run as transformers runs the format's decompressed
weights. What the format holds
beyond this (sparsity, transforms, a quantized KV cache, fp4 with zero points, output
activation quantization) is refused by name (check_config)."""

from __future__ import annotations

import numpy as np

from vllmx.device import BF16, U8
from vllmx.loader import quantization as q
from vllmx.loader.fp8 import fp8_gemm_takes, fp8_row_group_scales
from vllmx.loader.safetensors import FP8_E4M3
from vllmx.ops import Weight
from vllmx.ops.fp8 import fp8_block_weight

METHOD = "compressed-tensors"
_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized",
            "nvfp4-pack-quantized", "mxfp4-pack-quantized", "dense")
_FP4_FORMATS = ("nvfp4-pack-quantized", "mxfp4-pack-quantized")
_STRATEGIES = ("tensor", "channel", "group", "block", "tensor_group")
_SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
             "weight_g_idx", "weight_global_scale", "input_scale", "input_zero_point",
             "input_global_scale", "weight")
# e2m1's eight magnitudes (fp4: a sign bit over them).
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def _refuse(what: str) -> ValueError:
    return ValueError(f"compressed-tensors checkpoint: {what} is not supported; vllmx runs "
                      f"integer (pack-quantized, int-quantized), fp8 (float-quantized) and fp4 "
                      f"(nvfp4- / mxfp4-pack-quantized) weights per tensor, channel, group or "
                      f"block")


def check_config(quant: dict) -> None:
    """Raises ValueError naming the first part of the quantization_config vllmx does not run."""
    if quant.get("sparsity_config") and quant["sparsity_config"].get("format", "dense") != "dense":
        raise _refuse(f"sparsity format {quant['sparsity_config'].get('format')!r}")
    if quant.get("transform_config"):
        raise _refuse("transform_config (rotations applied to weights and activations)")
    if quant.get("kv_cache_scheme"):
        raise _refuse("kv_cache_scheme (a quantized KV cache)")
    for name, group in (quant.get("config_groups") or {}).items():
        fmt = group.get("format") or quant.get("format")
        if fmt not in _FORMATS:
            raise _refuse(f"config group {name!r}'s format {fmt!r}")
        w = group.get("weights")
        if w is None:
            continue
        kind, bits, strategy = w.get("type"), w.get("num_bits"), w.get("strategy")
        float_bits = 4 if fmt in _FP4_FORMATS else 8
        if kind == "int" and not 2 <= int(bits) <= 8 or kind == "float" and bits != float_bits \
                or kind not in ("int", "float"):
            raise _refuse(f"config group {name!r}'s {bits}-bit {kind} weights")
        if fmt in _FP4_FORMATS and not w.get("symmetric", True):
            raise _refuse(f"config group {name!r}'s fp4 weights with zero points")
        if strategy not in _STRATEGIES:
            raise _refuse(f"config group {name!r}'s weight strategy {strategy!r}")
        acts = group.get("input_activations")
        if acts and acts.get("type") not in ("int", "float"):
            raise _refuse(f"config group {name!r}'s {acts.get('type')} input activations")
        if group.get("output_activations"):
            raise _refuse(f"config group {name!r}'s output activation quantization")


def _block_structure(quant: dict) -> tuple[int, int] | None:
    for group in (quant.get("config_groups") or {}).values():
        w = group.get("weights") or {}
        if w.get("strategy") == "block":
            return tuple(w.get("block_structure") or (128, 128))
    return None


def _unpack_bits(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` unsigned `bits`-bit values of each row of int32 words, packed densely
    from the lowest bit up (compressed-tensors' pack_to_int32, before its signed offset)."""
    if bits in (4, 8):
        return q.unpack_words(words, bits, count)
    b = np.ascontiguousarray(words).view(np.uint8).reshape(words.shape[0], -1)
    stream = np.unpackbits(b, axis=1, bitorder="little")[:, :count * bits]
    return (stream.reshape(b.shape[0], count, bits).astype(np.int32) << np.arange(bits)).sum(-1)


def _dequantize(parts: dict[str, Weight], block: tuple[int, int] | None,
                dtype: int) -> Weight:
    if "weight_g_idx" in parts:  # compressed-tensors itself no longer reads it: no oracle
        raise _refuse("weight_g_idx (groups in activation order, an older GPTQ layout)")
    scale_w = parts["weight_scale"]
    z = None
    if "weight_packed" in parts and parts["weight_packed"].dtype == U8:
        return _dequantize_fp4(parts, dtype)
    if "weight_packed" in parts:
        n, k = (int(v) for v in q.array(parts["weight_shape"]).reshape(-1))
        words = q.array(parts["weight_packed"])
        bits = words.shape[1] * 32 // k
        if not 2 <= bits <= 8 or -(-k * bits // 32) != words.shape[1]:
            raise _refuse(f"weight_packed of shape {words.shape} for a [{n}, {k}] weight")
        x = _unpack_bits(words, bits, k).astype(np.float32) - (1 << (bits - 1))
        if "weight_zero_point" in parts:  # packed along the rows
            z = q.array(parts["weight_zero_point"])
            if z.dtype == np.int32:
                z = _unpack_bits(np.ascontiguousarray(z.T), bits, n).T.astype(np.int32) \
                    - (1 << (bits - 1))
    else:
        w = parts["weight"]
        if w.dtype == FP8_E4M3 and "weight_zero_point" not in parts and len(w.shape) == 2:
            n, k = w.shape
            rows = fp8_row_group_scales(q.float32(scale_w), n, k, block) \
                if fp8_gemm_takes(n, k) else None
            if rows is not None:  # W8A8 on Hopper (loader/fp8.py)
                return fp8_block_weight(q.array(w).reshape(n, k), rows)
        x = q.weight_values(w)
        n, k = x.shape
        if "weight_zero_point" in parts:
            z = q.array(parts["weight_zero_point"])
    scale = q.expand(q.float32(scale_w), n, k, block)
    if scale is None:
        raise _refuse(f"a weight_scale of shape {scale_w.shape} for a [{n}, {k}] weight")
    if z is not None:
        x = x - q.expand(z.astype(np.float32), n, k, block)
    # In the scale's dtype (the products are exact in f32, so one rounding gives torch's), then
    # in the model's, as transformers loads the decompressed weight into its parameter.
    x *= scale
    return q.to_dtype(x, scale_w.dtype, dtype)


def _dequantize_fp4(parts: dict[str, Weight], dtype: int) -> Weight:
    """NVFP4 / MXFP4 (compressed-tensors' fp4 packing: two e2m1 values a byte, the low nibble
    first; an fp8 e4m3 scale per 16 (NVFP4, over a global f32 one) or a UE8M0 one per 32
    (MXFP4)), as its decompression does: the scale divided by the global one in f32, times the
    value in f32, rounded to bf16, then to the checkpoint's dtype."""
    packed = q.array(parts["weight_packed"])
    n, k = packed.shape[0], 2 * packed.shape[1]
    nib = np.empty((n, k), np.uint8)
    nib[:, 0::2], nib[:, 1::2] = packed & 15, packed >> 4
    x = np.where(nib & 8, -1.0, 1.0).astype(np.float32) * _E2M1[nib & 7]
    scale_w = parts["weight_scale"]
    scale = q.weight_values(scale_w) if scale_w.dtype == FP8_E4M3 else q.float32(scale_w)
    if "weight_global_scale" in parts:
        scale = scale / q.float32(parts["weight_global_scale"]).reshape(-1)[0]
    full = q.expand(scale.astype(np.float32), n, k, None)
    if full is None:
        raise _refuse(f"a weight_scale of shape {scale_w.shape} for a [{n}, {k}] fp4 weight")
    return q.to_dtype(x * full, BF16, dtype)


def dequantize_checkpoint(weights: dict[str, Weight], quant: dict,
                          dtype: str | None) -> q.Dequantized:
    """weights with each quantized module's tensors replaced by its dense `weight`, in the
    checkpoint's dtype (config.json's torch_dtype; the scales' where it names none)."""
    check_config(quant)
    block = _block_structure(quant)

    def make(prefix: str, parts: dict[str, Weight]):
        target = q.target_dtype(dtype, parts["weight_scale"].dtype)
        return lambda: _dequantize(parts, block, target)

    return q.replace_modules(weights, _SUFFIXES, "weight_scale", make)
