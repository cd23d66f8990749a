"""fp8 e4m3 with block scales (vLLM's per_token_group_quant_fp8 and cutlass_scaled_mm, DeepSeek's
scheme): activations quantized per token and 128-wide group of K, weights carrying one scale per
row and group (a checkpoint's per-tensor, per-channel or 128 x 128 block scales written out per
row), scales MN-major ([K / 128, rows]). Codes are uint8 arrays on the host (passed typed) and
F8_E4M3 DeviceArrays on the GPU."""

from __future__ import annotations

import numpy as np

from vllmx import _C
from vllmx.device import BF16, F8_E4M3, F32, DeviceArray, host_dtype
from vllmx.ops._base import _arg

GROUP = 128  # K values a scale covers


def _typed(t, dtype: int):
    """A host array as the op table takes one of dtype (fp8 codes, bf16); device arrays as
    they are."""
    return t if isinstance(t, DeviceArray) or t is None else (t, dtype)


def per_token_group_quant_fp8(x, x_dtype: int | None = None):
    """x [T, K] (f32, f16 or bf16; K a multiple of 128) -> (codes [T, K] e4m3, scales f32
    [K // 128, T]): each row's 128-wide groups scaled by max(|max|, 1e-10) / 448, rounded to
    nearest even. x_dtype: a host bf16 array's id (BF16; its numpy dtype is uint16)."""
    t, k = x.shape
    if isinstance(x, DeviceArray):
        q, s = DeviceArray.empty((t, k), F8_E4M3), DeviceArray.empty((k // GROUP, t), F32)
        _C.ops.per_token_group_quant_fp8(q, s, x)
        return q, s
    q, s = np.empty((t, k), np.uint8), np.empty((k // GROUP, t), np.float32)
    _C.ops.per_token_group_quant_fp8(_typed(q, F8_E4M3), s,
                                     _typed(x, x_dtype) if x_dtype is not None else x)
    return q, s


def scaled_mm(a, b, a_s, b_s, out_dtype: int = BF16, bias=None):
    """out [T, N] (out_dtype: F32 on the host, or F16 / BF16) = per group g of 128 along K:
    a_s[g, t] * b_s[g, n] * (a[t, g] . b[n, g]), summed, + bias; a [T, K] and b [N, K] e4m3
    codes (a Weight of dtype F8_E4M3 for b is taken too)."""
    t, n = a.shape[0], b.shape[0]
    if isinstance(a, DeviceArray):
        out = DeviceArray.empty((t, n), out_dtype)
        _C.ops.scaled_mm(out, a, _arg(b), a_s, b_s, bias)
        return out
    out = np.empty((t, n), host_dtype(out_dtype))
    _C.ops.scaled_mm(_typed(out, out_dtype), _typed(a, F8_E4M3),
                     _arg(b) if not isinstance(b, np.ndarray) else _typed(b, F8_E4M3), a_s, b_s,
                     None if bias is None else _typed(bias, out_dtype))
    return out


