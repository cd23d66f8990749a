"""AWQ checkpoints (quantization_config quant_method "awq", AutoAWQ's GEMM layout, as vLLM reads
them): per linear `qweight` int32 [K, N / 8] and `qzeros` int32 [groups, N / 8] packed along the
output dimension in AWQ's interleaved order (nibble i of a word holds output 8w + ORDER[i]),
`scales` [groups, N], groups of group_size inputs. Dequantized at load as the format's reference
does: (q - z) * scales in the scales' dtype, then the checkpoint's. 4-bit GEMM-version weights
with zero points; the GEMV layout and other widths are refused by name."""

from __future__ import annotations

import numpy as np

from vllmx.loader import quantization as q
from vllmx.ops import Weight

METHOD = "awq"
_SUFFIXES = ("qweight", "qzeros", "scales", "bias")
# Nibble i of a packed word holds output column 8w + _ORDER[i] (AutoAWQ's pack order).
_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])


def _refuse(what: str) -> ValueError:
    return ValueError(f"awq checkpoint: {what} is not supported; vllmx runs 4-bit AWQ weights "
                      f"with zero points in the GEMM layout")


def check_config(quant: dict) -> None:
    bits = quant.get("bits", quant.get("w_bit"))
    if bits != 4:
        raise _refuse(f"bits {bits!r}")
    version = str(quant.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse(f"version {version!r}")
    if not quant.get("zero_point", True):
        raise _refuse("zero_point false")


def _columns(words: np.ndarray) -> np.ndarray:
    """[rows, N / 8] packed words -> [rows, N] values in output order."""
    slots = q.unpack_words(words, 4, words.shape[1] * 8).reshape(words.shape[0], -1, 8)
    out = np.empty_like(slots)
    out[:, :, _ORDER] = slots
    return out.reshape(words.shape[0], -1)


def check_shapes(prefix: str, parts: dict[str, Weight]) -> None:
    """A module's tensors fit one another (at load, before any is read)."""
    missing = [t for t in ("scales", "qzeros") if t not in parts]
    if missing:
        raise _refuse(f"{prefix}.qweight without {', '.join(missing)}")
    qw, sc, qz = (tuple(parts[t].shape) for t in ("qweight", "scales", "qzeros"))
    fits = len(qw) == 2 and len(sc) == 2 and sc[0] >= 1
    k, n, groups = (qw[0], qw[1] * 8, sc[0]) if fits else (0, 0, 1)
    if not fits or sc != (groups, n) or k % groups or qz != (groups, n // 8):
        raise _refuse(f"{prefix}: scales {sc} / qzeros {qz} for qweight {qw}")


def dequantize(parts: dict[str, Weight], dtype: int) -> Weight:
    qweight = q.array(parts["qweight"])
    scales_w = parts["scales"]
    scales = q.float32(scales_w)
    # In the Linear's [N, K] orientation: the 1-byte values transposed, then one pass each.
    x = np.ascontiguousarray(_columns(qweight).T).astype(np.float32)
    q.by_group(np.subtract, x, _columns(q.array(parts["qzeros"])).T)
    q.by_group(np.multiply, x, scales.T)  # exact in f32
    return q.to_dtype(x, scales_w.dtype, dtype)


def dequantize_checkpoint(weights: dict[str, Weight], quant: dict,
                          dtype: str | None) -> q.Dequantized:
    check_config(quant)

    def make(prefix: str, parts: dict[str, Weight]):
        check_shapes(prefix, parts)
        target = q.target_dtype(dtype, parts["scales"].dtype)
        return lambda: dequantize(parts, target)

    return q.replace_modules(weights, _SUFFIXES, "qweight", make)
