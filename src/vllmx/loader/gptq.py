"""GPTQ checkpoints (quantization_config quant_method "gptq", AutoGPTQ / GPTQModel's layout, as
vLLM reads them): per linear `qweight` int32 [K / (32 / bits), N] packed along the input
dimension (value of input k at bits * (k % per_word) of word k // per_word), `qzeros` int32
[groups, N / per_word] packed along the output dimension, `scales` [groups, N] and `g_idx` [K],
the group of each input (activation order; k // group_size without it). Dequantized at load as
the format's reference does: scales[g] * (q - z), z the stored zero plus one in the original
"gptq" checkpoint_format (gptq_v2 stores it as is), in the scales' dtype, then the checkpoint's.
4- and 8-bit weights; other widths are refused by name."""

from __future__ import annotations

import numpy as np

from vllmx.loader import quantization as q
from vllmx.ops import Weight

METHOD = "gptq"
_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx", "bias")


def _refuse(what: str) -> ValueError:
    return ValueError(f"gptq checkpoint: {what} is not supported; vllmx runs 4- and 8-bit GPTQ "
                      f"weights (any group size, activation order, gptq and gptq_v2 formats)")


def check_config(quant: dict) -> None:
    bits = quant.get("bits")
    if bits not in (4, 8):
        raise _refuse(f"bits {bits!r}")
    fmt = quant.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse(f"checkpoint_format {fmt!r}")


def check_shapes(prefix: str, parts: dict[str, Weight], bits: int) -> None:
    """A module's tensors fit one another (at load, before any is read)."""
    missing = [t for t in ("scales", "qzeros") if t not in parts]
    if missing:
        raise _refuse(f"{prefix}.qweight without {', '.join(missing)}")
    per = 32 // bits
    qw, sc, qz = (tuple(parts[t].shape) for t in ("qweight", "scales", "qzeros"))
    fits = len(qw) == 2 and len(sc) == 2 and sc[0] >= 1
    k, n, groups = (qw[0] * per, qw[1], sc[0]) if fits else (0, 0, 1)
    if not fits or sc != (groups, n) or qz != (groups, n // per):
        raise _refuse(f"{prefix}: scales {sc} / qzeros {qz} for qweight {qw}")
    if "g_idx" in parts:
        if tuple(parts["g_idx"].shape) != (k,):
            raise _refuse(f"{prefix}.g_idx of shape {tuple(parts['g_idx'].shape)} for a "
                          f"[{k}, {n}] qweight")
    elif k % groups:
        raise _refuse(f"{prefix}: {groups} groups for the {k} inputs of a qweight")


def dequantize(parts: dict[str, Weight], bits: int, v2: bool, dtype: int) -> Weight:
    qweight = q.array(parts["qweight"])
    scales_w = parts["scales"]
    scales = q.float32(scales_w)
    per = 32 // bits
    k, n = qweight.shape[0] * per, qweight.shape[1]
    groups = scales.shape[0]
    # In the Linear's [N, K] orientation throughout: contiguous rows, one pass each.
    x = q.unpack_words(np.ascontiguousarray(qweight.T), bits, k).astype(np.float32)
    z = q.unpack_words(q.array(parts["qzeros"]), bits, n).T.astype(np.float32)  # [N, groups]
    if not v2:
        z += 1.0
    g = None
    if "g_idx" in parts:
        g = q.array(parts["g_idx"]).astype(np.int64)
        if g.min() < 0 or g.max() >= groups:  # (its values: read when the weight is made)
            raise _refuse(f"g_idx values outside the {groups} groups of a [{k}, {n}] qweight")
    q.by_group(np.subtract, x, z, g)
    q.by_group(np.multiply, x, scales.T, g)  # exact in f32: 8 bits times the scale's 11
    return q.to_dtype(x, scales_w.dtype, dtype)


def dequantize_checkpoint(weights: dict[str, Weight], quant: dict,
                          dtype: str | None) -> q.Dequantized:
    check_config(quant)
    bits, v2 = int(quant["bits"]), quant.get("checkpoint_format") == "gptq_v2"

    def make(prefix: str, parts: dict[str, Weight]):
        check_shapes(prefix, parts, bits)
        target = q.target_dtype(dtype, parts["scales"].dtype)
        return lambda: dequantize(parts, bits, v2, target)

    return q.replace_modules(weights, _SUFFIXES, "qweight", make)
