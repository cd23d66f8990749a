"""Where the layers being built put their weights (vLLM's `set_default_torch_dtype` plus the
device): the loader builds the model inside `placement(Placement("cuda", BF16))` and each layer
uploads what it holds, once, at construction. The host code that shapes weights (fusing q/k/v,
Gemma's 1 + w) stays the same for every device."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from vllmx import _C
from vllmx.device import BF16, F16, F32, DeviceArray
from vllmx.ops import Weight


@dataclass(frozen=True)
class Placement:
    device: str = "cpu"  # "cpu" | "cuda"
    dtype: int = F32  # activations (and dense weights) on the GPU: BF16 or F16

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"


_current = Placement()

# Weight types the CUDA linear and embedding kernels take (cuda/linear.cu, elementwise.cu).
CUDA_WEIGHT_TYPES = {F32, F16, BF16, 2, 3, 8}  # + Q4_0, Q4_1, Q8_0


def current() -> Placement:
    return _current


@contextmanager
def placement(p: Placement):
    global _current
    old, _current = _current, p
    try:
        yield p
    finally:
        _current = old


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """f32 -> bf16 (round to nearest even, as torch does), as uint16 bits."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def _dense_as(a: np.ndarray, src_dtype: int, dtype: int) -> np.ndarray:
    """A dense host array (f32 / f16 / bf16 bits) in dtype's host form."""
    if src_dtype == dtype:
        return np.ascontiguousarray(a)
    if src_dtype == BF16:
        a = (np.asarray(a, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    a = np.asarray(a, dtype=np.float32)
    if dtype == F32:
        return np.ascontiguousarray(a)
    if dtype == F16:
        return a.astype(np.float16)
    return f32_to_bf16_bits(a)


def upload_weight(w: Weight | DeviceArray, name: str = "weight") -> Weight | DeviceArray:
    """A matmul / embedding weight where the current placement wants it: unchanged on the CPU;
    on the GPU dense weights in the activation dtype, block types as stored."""
    p = _current
    if not p.on_gpu or isinstance(w, DeviceArray):
        return w
    if w.dtype not in CUDA_WEIGHT_TYPES:
        raise ValueError(
            f"{name}: GGUF type {_C.type_info(w.dtype)[0]} has no CUDA kernel (CUDA runs bf16, "
            f"f16, f32, Q8_0, Q4_0 and Q4_1 weights); run this model with device='cpu'")
    rows = w.shape[0] if len(w.shape) > 1 else 1
    data = np.asarray(w.data).reshape(rows, -1)
    if w.dtype in (F32, F16, BF16):
        return DeviceArray.from_numpy(_dense_as(data, w.dtype, p.dtype), p.dtype)
    return DeviceArray.from_numpy(data, w.dtype)


def upload_vector(a: np.ndarray, dtype: int | None = None) -> np.ndarray | DeviceArray:
    """A small f32 host array (norm weight, bias, rope cache) on the current device: unchanged
    on the CPU; on the GPU in `dtype` (default the activation dtype)."""
    p = _current
    if not p.on_gpu:
        return a
    dtype = p.dtype if dtype is None else dtype
    return DeviceArray.from_numpy(_dense_as(np.asarray(a, np.float32), F32, dtype), dtype)
