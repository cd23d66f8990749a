"""Checkpoints in the compressed-tensors format (config.json's quantization_config with
quant_method "compressed-tensors", as llm-compressor writes them and vLLM reads them): integer
weights packed into int32 words ("pack-quantized": W4A16, W8A16, symmetric or with zero points,
per channel or per group), int8 stored as is
("int-quantized" / "naive-quantized"), fp8 e4m3 ("float-quantized": per tensor, channel or
128x128 block).

Each quantized linear's tensors (`weight_packed` / `weight` and `weight_scale`, `weight_zero_point`,
`weight_shape`) become one dense `weight` at load, dequantized as
compressed-tensors' own `dequantize` does — (q - zero_point) * scale in the scale's dtype — so
that the model runs the matrices the format's reference decompression gives, in the checkpoint's
dtype. Activation quantization in the scheme (FP8's static or dynamic input scales) is not
applied: fp8 W8A8 checkpoints run as W8A16, as vLLM runs them on GPUs without fp8 tensor cores.
What the format holds beyond this (sparsity, transforms, a quantized KV cache, NVFP4 / MXFP4
packing, integer activations) is refused by name (check_config)."""

from __future__ import annotations

import re

import numpy as np

from vllmx.loader.safetensors import FP8_E4M3, I8
from vllmx.ops import BF16, F16, F32, Weight

METHOD = "compressed-tensors"
_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized", "dense")
_STRATEGIES = ("tensor", "channel", "group", "block")
_SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
             "weight_g_idx", "input_scale", "input_zero_point", "weight")
# fp8 e4m3fn's 256 values as f32 (exact): sign, 4 exponent bits (bias 7), 3 mantissa bits.
_E4M3 = np.array([(-1.0) ** (b >> 7) * (
    2.0 ** (((b >> 3) & 15) - 7) * (1 + (b & 7) / 8) if (b >> 3) & 15 else 2.0 ** -6 * (b & 7) / 8)
    for b in range(256)], dtype=np.float32)
_E4M3[[0x7F, 0xFF]] = np.nan


def _refuse(what: str) -> ValueError:
    return ValueError(f"compressed-tensors checkpoint: {what} is not supported; vllmx runs "
                      f"integer (pack-quantized, int-quantized) and fp8 (float-quantized) "
                      f"weights per tensor, channel, group or block")


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
        if kind == "int" and not 2 <= int(bits) <= 8 or kind == "float" and bits != 8 \
                or kind not in ("int", "float"):
            raise _refuse(f"config group {name!r}'s {bits}-bit {kind} weights")
        if strategy not in _STRATEGIES:
            raise _refuse(f"config group {name!r}'s weight strategy {strategy!r}")
        acts = group.get("input_activations")
        if acts and acts.get("type") != "float":
            raise _refuse(f"config group {name!r}'s {acts.get('num_bits')}-bit "
                          f"{acts.get('type')} input activations (W{bits}A{acts.get('num_bits')})")
        if group.get("output_activations"):
            raise _refuse(f"config group {name!r}'s output activation quantization")


def _block_structure(quant: dict) -> tuple[int, int] | None:
    for group in (quant.get("config_groups") or {}).values():
        w = group.get("weights") or {}
        if w.get("strategy") == "block":
            return tuple(w.get("block_structure") or (128, 128))
    return None


def _array(w: Weight) -> np.ndarray:
    return np.asarray(w.data).reshape(w.shape)


def _float32(w: Weight) -> np.ndarray:
    """A scale as f32 (exact: bf16 / f16 / f32)."""
    a = _array(w)
    if w.dtype == BF16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def _unpack_bits(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` unsigned `bits`-bit values of each row of int32 words, packed densely
    from the lowest bit up (compressed-tensors' pack_to_int32, before its signed offset)."""
    b = np.ascontiguousarray(words).view(np.uint8).reshape(words.shape[0], -1)
    if bits == 8:
        return b[:, :count].astype(np.int32)
    if bits == 4:
        out = np.empty((b.shape[0], 2 * b.shape[1]), np.int32)
        out[:, 0::2], out[:, 1::2] = b & 15, b >> 4
        return out[:, :count]
    stream = np.unpackbits(b, axis=1, bitorder="little")[:, :count * bits]
    return (stream.reshape(b.shape[0], count, bits).astype(np.int32) << np.arange(bits)).sum(-1)


def _round_to(x: np.ndarray, dtype: int) -> np.ndarray:
    """f32 values rounded to dtype and back (to nearest, ties to even, as torch's casts and its
    multiplies in that dtype round)."""
    if dtype == F32:
        return x
    if dtype == F16:
        return x.astype(np.float16).astype(np.float32)
    bits = np.ascontiguousarray(x).view(np.uint32)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _as_weight(x: np.ndarray, dtype: int) -> Weight:
    """f32 values already representable in dtype, stored as dtype."""
    if dtype == BF16:
        return Weight((np.ascontiguousarray(x).view(np.uint32) >> 16).astype(np.uint16), BF16,
                      x.shape)
    return Weight.from_numpy(x.astype(np.float16) if dtype == F16 else x)


def _expand(scale: np.ndarray, n: int, k: int, block: tuple[int, int] | None) -> np.ndarray:
    """A per-element [n, k] view of a tensor / channel / group / block scale (or zero point)."""
    if scale.size == 1:
        return np.broadcast_to(scale.reshape(1, 1), (n, k))
    scale = scale.reshape(scale.shape[0], -1)
    if scale.shape[0] == n and scale.shape[1] == 1:
        return np.broadcast_to(scale, (n, k))
    if scale.shape[0] == n:  # groups along k
        return np.repeat(scale, k // scale.shape[1], axis=1)
    if block is None:
        raise _refuse(f"a scale of shape {scale.shape} for a [{n}, {k}] weight")
    bn, bk = block
    return np.repeat(np.repeat(scale, bn, axis=0)[:n], bk, axis=1)[:, :k]


def _dequantize(parts: dict[str, Weight], block: tuple[int, int] | None,
                dtype: int) -> Weight:
    if "weight_g_idx" in parts:  # compressed-tensors itself no longer reads it: no oracle
        raise _refuse("weight_g_idx (groups in activation order, an older GPTQ layout)")
    scale_w = parts["weight_scale"]
    scale = _float32(scale_w)
    if "weight_packed" in parts:
        n, k = (int(v) for v in _array(parts["weight_shape"]).reshape(-1))
        words = _array(parts["weight_packed"])
        bits = words.shape[1] * 32 // k
        if not 2 <= bits <= 8 or -(-k * bits // 32) != words.shape[1]:
            raise _refuse(f"weight_packed of shape {words.shape} for a [{n}, {k}] weight")
        q = _unpack_bits(words, bits, k) - (1 << (bits - 1))
        zp = parts.get("weight_zero_point")
        if zp is not None:  # packed along the rows
            z = _array(zp)
            z = _unpack_bits(np.ascontiguousarray(z.T.astype(np.int32)), bits, n).T \
                - (1 << (bits - 1)) if z.dtype == np.int32 else z
    else:
        raw = _array(parts["weight"])
        n, k = raw.shape
        q = _E4M3[raw] if parts["weight"].dtype == FP8_E4M3 else raw.astype(np.int32)
        zp = parts.get("weight_zero_point")
        z = None if zp is None else _array(zp)
    x = q.astype(np.float32)
    if zp is not None:
        x = x - _expand(z.astype(np.float32), n, k, block)
    # In the scale's dtype (the products are exact in f32, so one rounding gives torch's), then
    # in the model's, as transformers loads the decompressed weight into its parameter.
    x = _round_to(_round_to(x * _expand(scale, n, k, block), scale_w.dtype), dtype)
    return _as_weight(x, dtype)


def dequantize_checkpoint(weights: dict[str, Weight], quant: dict,
                          dtype: str | None) -> dict[str, Weight]:
    """weights with each quantized module's tensors replaced by its dense `weight`, in the
    checkpoint's dtype (config.json's torch_dtype; the scales' where it names none)."""
    check_config(quant)
    block = _block_structure(quant)
    modules: dict[str, dict[str, Weight]] = {}
    pattern = re.compile(r"^(.*)\.(" + "|".join(_SUFFIXES) + r")$")
    for name, w in weights.items():
        m = pattern.match(name)
        if m:
            modules.setdefault(m.group(1), {})[m.group(2)] = w
    out = dict(weights)
    for prefix, parts in modules.items():
        if "weight_scale" not in parts:
            continue  # not quantized (an ignored module, a norm)
        for suffix in parts:
            del out[f"{prefix}.{suffix}"]
        target = {"bfloat16": BF16, "float16": F16, "float32": F32}.get(
            dtype or "", parts["weight_scale"].dtype)
        out[f"{prefix}.weight"] = _dequantize(parts, block, target)
    left = [n for n, w in out.items() if w.dtype in (FP8_E4M3, I8)]
    if left:
        raise _refuse(f"tensor {left[0]!r} ({'fp8' if out[left[0]].dtype == FP8_E4M3 else 'int8'} "
                      f"without a weight_scale)")
    return out
