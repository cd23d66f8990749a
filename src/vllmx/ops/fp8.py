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
F8_E4M3_B128 = int(_C.DType["F8_E4M3_B128"])
_BLOCK = 4 + GROUP  # an F8_E4M3_B128 block: its f32 scale, then 128 codes


def fp8_gemm_fits(n: int, k: int) -> bool:
    """Whether scaled_mm's GPU GEMM takes an [n, k] weight: K whole 128-wide groups, N a
    multiple of 8 (16-byte rows of the bf16 / f16 output)."""
    return k % GROUP == 0 and n % 8 == 0


def fp8_block_weight(codes: np.ndarray, scales: np.ndarray):
    """An F8_E4M3_B128 Weight [N, K] from e4m3 codes (uint8 [N, K]) and each row's scale per
    128-wide group of K (f32 [N, K // 128]): what the GPU's scaled_mm runs, a row's blocks
    independent (so merging, slicing and permuting rows stay exact)."""
    from vllmx.weights import Weight

    n, k = codes.shape
    blocks = np.empty((n, k // GROUP, _BLOCK), np.uint8)
    blocks[:, :, :4] = np.ascontiguousarray(scales, np.float32).reshape(n, -1, 1).view(np.uint8)
    blocks[:, :, 4:] = codes.reshape(n, k // GROUP, GROUP)
    return Weight(blocks.reshape(n, -1), F8_E4M3_B128, (n, k))


def upload_fp8_block_weight(w) -> DeviceArray:
    """An F8_E4M3_B128 Weight on the GPU as scaled_mm reads it: codes [N, K] (F8_E4M3) with
    `.scales` [K // 128, N] f32 (MN-major) beside them; a stack of them [E, N, K] (experts, as
    fused_experts reads them) as codes [E, N, K] with scales [E, K // 128, N]."""
    *lead, n, k = w.shape
    blocks = np.asarray(w.data).reshape(*lead, n, k // GROUP, _BLOCK)
    codes = DeviceArray.from_numpy(
        np.ascontiguousarray(blocks[..., 4:]).reshape(*lead, n, k), F8_E4M3)
    scales = np.ascontiguousarray(blocks[..., :4]).view(np.float32).reshape(*lead, n, k // GROUP)
    codes.scales = DeviceArray.from_numpy(np.ascontiguousarray(np.swapaxes(scales, -1, -2)))
    return codes


def is_fp8_weight(w) -> bool:
    """An fp8 weight uploaded for scaled_mm: an fp8 checkpoint's (upload_fp8_block_weight) or
    one online fp8 quantized at upload (placement.upload_weight), codes with .scales."""
    return isinstance(w, DeviceArray) and w.dtype == F8_E4M3


def fp8_linear(x, w, bias=None, w_s=None, x_dtype: int | None = None):
    """x @ w^T (+ bias) as vLLM runs block-fp8 checkpoints on Hopper: x quantized per token and
    128-wide group (per_token_group_quant_fp8), then scaled_mm, in one op (on the GPU up to 32
    rows stream the weights through the skinny TMA GEMM); out in x's dtype. w: an uploaded fp8 weight (its .scales), or on
    the host e4m3 codes (uint8 [N, K]) with w_s [K // 128, N]; x_dtype: a host bf16 x's id."""
    w_s = w.scales if w_s is None else w_s
    t, n = x.shape[0], w.shape[0]
    if isinstance(x, DeviceArray):
        out = DeviceArray.empty((t, n), x.dtype)
        _C.ops.fp8_linear(out, x, w, w_s, bias)
        return out
    out_dtype = x_dtype if x_dtype is not None else F32
    out = np.empty((t, n), host_dtype(out_dtype))
    _C.ops.fp8_linear(_typed(out, out_dtype), _typed(x, out_dtype), _typed(w, F8_E4M3), w_s,
                      None if bias is None else _typed(bias, out_dtype))
    return out


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


