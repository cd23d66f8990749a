"""Pre-quantized safetensors checkpoints (config.json's quantization_config, read as vLLM reads
it): the formats vllmx loads by quant_method, and the numerics they share. Each format's module
turns its quantized modules' tensors into one dense `weight` at load, dequantized exactly as the
format's own reference decompression does, in the checkpoint's dtype: the model then runs the
matrices that reference gives (and takes the memory of the unquantized model)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from vllmx.device import BF16, F16, F32, U8
from vllmx.loader.safetensors import FP8_E4M3, I8
from vllmx.ops import Weight

# fp8 e4m3fn's 256 values as f32 (exact): sign, 4 exponent bits (bias 7), 3 mantissa bits.
E4M3 = np.array([(-1.0) ** (b >> 7) * (
    2.0 ** (((b >> 3) & 15) - 7) * (1 + (b & 7) / 8) if (b >> 3) & 15 else 2.0 ** -6 * (b & 7) / 8)
    for b in range(256)], dtype=np.float32)
E4M3[[0x7F, 0xFF]] = np.nan
_DTYPES = {"bfloat16": BF16, "float16": F16, "float32": F32}


def methods() -> dict:
    """quant_method -> the module that reads it (check_config, dequantize_checkpoint)."""
    from vllmx.loader import awq, compressed_tensors, fp8, gptq, modelopt

    return {m.METHOD: m for m in (compressed_tensors, fp8, gptq, awq, modelopt)}


def check_config(quant: dict) -> bool:
    """Whether vllmx reads this quantization_config's method; raises ValueError naming the part
    of a method it reads that it does not run."""
    module = methods().get(quant.get("quant_method"))
    if module is None:
        return False
    module.check_config(quant)
    return True


# vLLM's names for a method's kernels, which read the same checkpoints.
_ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq", "compressed_tensors": "compressed-tensors"}


def check_requested(requested: str | None, hf_config: dict, is_gguf: bool) -> None:
    """vLLM's `quantization` argument against what the checkpoint holds: the same method (or
    one of vLLM's kernel names for it), or ValueError naming both. A method asked of an
    unquantized checkpoint is refused too, but "fp8" (vLLM's online fp8: the projections
    quantized at load, on a Hopper GPU; placement.Placement.fp8_weights)."""
    if requested is None:
        return
    method = _ALIASES.get(requested, requested)
    if is_gguf:
        if method != "gguf":
            raise ValueError(f"quantization={requested!r} but the model is a GGUF file (its "
                             f"quantization is 'gguf')")
        return
    quant = hf_config.get("quantization_config")
    held = quant.get("quant_method") if isinstance(quant, dict) else None
    if held is None and method == "fp8":
        from vllmx import _C
        from vllmx.layers import placement

        if not (placement.current().on_gpu and _C.cuda_sm90_kernels()):
            raise ValueError("quantization='fp8' on an unquantized checkpoint quantizes its "
                             "projections to fp8 at load for Hopper's fp8 tensor cores: it runs "
                             "on a compute capability 9.0 GPU only; here load a quantized "
                             "checkpoint (compressed-tensors, fp8, GPTQ, AWQ) or a GGUF file")
        return
    if held is None:
        raise ValueError(f"quantization={requested!r} asks vllmx to quantize an unquantized "
                         f"checkpoint at load, which it does only for 'fp8' on a Hopper GPU; "
                         f"load a quantized checkpoint (compressed-tensors, fp8, GPTQ, AWQ) or a "
                         f"GGUF file")
    if method != held:
        raise ValueError(f"quantization={requested!r} does not match the method in the "
                         f"checkpoint's quantization_config ({held!r})")


def dequantize_checkpoint(weights: dict[str, Weight], hf_config: dict) -> Mapping[str, Weight]:
    """A checkpoint's weights with its quantized modules made dense; any fp8 or int8 tensor no
    format explains is refused by name."""
    quant = hf_config.get("quantization_config")
    module = methods().get(quant.get("quant_method")) if isinstance(quant, dict) else None
    if module is not None:
        weights = module.dequantize_checkpoint(
            weights, quant, hf_config.get("torch_dtype", hf_config.get("dtype")))
    kept = weights.kept() if isinstance(weights, Dequantized) else weights.items()
    for name, w in kept:
        if w.dtype in (FP8_E4M3, I8):
            raise ValueError(f"tensor {name!r} is {'fp8' if w.dtype == FP8_E4M3 else 'int8'} "
                             f"and config.json's quantization_config says nothing vllmx reads "
                             f"about it")
    return weights


class Dequantized(Mapping):
    """A checkpoint's tensors with each quantized module's parts replaced by its dense `weight`,
    made when asked for and not kept (as DummyWeights are): the model holds what it keeps (a
    repacked or uploaded copy), so a quantized checkpoint never holds all its dense weights in
    host memory at once. raw: the checkpoint's tensors as read."""

    def __init__(self, raw: Mapping[str, Weight], dense: dict[str, Callable[[], Weight]],
                 dropped: set[str]):
        self.raw, self._dense, self._dropped = raw, dense, dropped

    def __getitem__(self, name: str) -> Weight:
        make = self._dense.get(name)
        if make is not None:
            return make()
        if name in self._dropped:
            raise KeyError(name)
        return self.raw[name]

    def kept(self) -> Iterator[tuple[str, Weight]]:
        """The checkpoint's tensors handed on as read."""
        return ((n, w) for n, w in self.raw.items()
                if n not in self._dropped and n not in self._dense)

    def __iter__(self) -> Iterator[str]:
        yield from (n for n, _ in self.kept())
        yield from self._dense

    def __len__(self) -> int:
        return sum(1 for _ in self)


def replace_modules(weights: Mapping[str, Weight], suffixes: tuple[str, ...], key: str,
                    make: Callable[[str, dict[str, Weight]], Callable[[], Weight]]
                    ) -> Dequantized:
    """weights with each module that has a `key` tensor (among its tensors named
    <module>.<suffix>) replaced by <module>.weight, the dense weight make(module, tensors)
    returns a maker of (make checks the tensors now; the maker dequantizes when asked)."""
    dense, dropped = {}, set()
    for prefix, parts in modules(weights, suffixes).items():
        if key not in parts:
            continue  # not quantized (an ignored module, a norm)
        dense[f"{prefix}.weight"] = make(prefix, parts)
        dropped.update(f"{prefix}.{s}" for s in parts if s != "bias")
    return Dequantized(weights, dense, dropped)


def modules(weights: Mapping[str, Weight], suffixes: tuple[str, ...]) -> dict[str, dict[str, Weight]]:
    """The tensors named <module>.<suffix>, by module."""
    pattern = re.compile(r"^(.*)\.(" + "|".join(suffixes) + r")$")
    out: dict[str, dict[str, Weight]] = {}
    for name, w in weights.items():
        m = pattern.match(name)
        if m:
            out.setdefault(m.group(1), {})[m.group(2)] = w
    return out


def unpack_words(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` unsigned `bits`-bit values (4 or 8) of each row of int32 words, the
    lowest bits first (GPTQ's and AWQ's packing, before AWQ's column order), as uint8."""
    b = np.ascontiguousarray(words).view(np.uint8).reshape(words.shape[0], -1)
    if bits == 8:
        return b[:, :count]
    out = np.empty((b.shape[0], 2 * b.shape[1]), np.uint8)
    np.bitwise_and(b, 15, out=out[:, 0::2])
    np.right_shift(b, 4, out=out[:, 1::2])
    return out[:, :count]


def by_group(op, x: np.ndarray, a: np.ndarray, g_idx: np.ndarray | None = None) -> None:
    """x[n, c] op= a[n, group of c], in place (op: np.subtract, np.multiply): groups of
    k / groups consecutive columns, or column c in group g_idx[c]."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if g_idx is not None:
        op(x, a[:, g_idx], out=x)
        return
    v = x.reshape(a.shape[0], a.shape[1], -1)
    op(v, a[:, :, None], out=v)


def target_dtype(dtype: str | None, fallback: int) -> int:
    """The dense weights' dtype: the checkpoint's torch_dtype, else fallback."""
    return _DTYPES.get(dtype or "", fallback)


def array(w: Weight) -> np.ndarray:
    return np.asarray(w.data).reshape(w.shape)


def float32(w: Weight) -> np.ndarray:
    """A scale as f32 (exact: bf16 / f16 / f32, or a UE8M0 byte's power of two)."""
    a = array(w)
    if w.dtype == BF16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    if w.dtype == U8:
        return np.exp2(a.astype(np.float32) - 127.0)
    return a.astype(np.float32)


def weight_values(w: Weight) -> np.ndarray:
    """An fp8 or int8 weight's values as f32 (exact)."""
    a = array(w)
    return E4M3[a] if w.dtype == FP8_E4M3 else a.astype(np.float32)


def round_to(x: np.ndarray, dtype: int) -> np.ndarray:
    """f32 values rounded to dtype and back (to nearest, ties to even, as torch's casts and its
    multiplies in that dtype round). A new array; x is left as it is."""
    if dtype == F32:
        return x
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    cut = 16 if dtype == BF16 else 13  # the f32 mantissa bits the dtype drops
    out = bits >> cut  # add half an ulp less one plus the kept part's lowest bit, then cut
    out &= 1
    out += (1 << (cut - 1)) - 1
    out += bits
    out &= np.uint32(0xFFFFFFFF << cut & 0xFFFFFFFF)
    out = out.view(np.float32)
    if dtype == F16:  # f16's subnormals and overflow: numpy's own (slow) conversion there
        mag = np.abs(x)
        odd = mag < 2.0**-14
        odd &= mag != 0
        odd |= ~(mag < 65504.0)
        if odd.any():
            with np.errstate(over="ignore"):  # (past f16's range: inf, as torch's cast)
                out[odd] = x[odd].astype(np.float16).astype(np.float32)
    return out


def as_weight(x: np.ndarray, dtype: int) -> Weight:
    """f32 values already representable in dtype, stored as dtype."""
    if dtype == BF16:  # the high halves of the f32 words (little-endian)
        high = np.ascontiguousarray(x, dtype=np.float32).view(np.uint16)[..., 1::2]
        return Weight(np.ascontiguousarray(high), BF16, x.shape)
    return Weight.from_numpy(x.astype(np.float16) if dtype == F16 else x)


def to_dtype(x: np.ndarray, via: int, dtype: int) -> Weight:
    """Exact f32 products rounded to the scales' dtype `via` (the format's arithmetic), then to
    the checkpoint's, as a weight of that dtype."""
    x = round_to(x, via)
    return as_weight(x if dtype == via else round_to(x, dtype), dtype)


def expand(scale: np.ndarray, n: int, k: int, block: tuple[int, int] | None) -> np.ndarray | None:
    """A per-element [n, k] view of a tensor / channel / group / block scale (or zero point):
    groups run along k; blocks of block = (rows, columns), partial at the far edges. None for a
    shape none of these give."""
    if scale.size == 1:
        return np.broadcast_to(scale.reshape(1, 1), (n, k))
    scale = scale.reshape(scale.shape[0], -1)
    if scale.shape[0] == n and scale.shape[1] == 1:
        return np.broadcast_to(scale, (n, k))
    if block is not None and scale.shape == (-(-n // block[0]), -(-k // block[1])):
        bn, bk = block
        return np.repeat(np.repeat(scale, bn, axis=0)[:n], bk, axis=1)[:, :k]
    if scale.shape[0] == n and k % scale.shape[1] == 0:
        return np.repeat(scale, k // scale.shape[1], axis=1)
    return None
