"""Where the layers being built put their weights (vLLM's `set_default_torch_dtype` plus the
device): the loader builds the model inside `placement(Placement("cuda", BF16))` and each layer
uploads what it holds, once, at construction. The host code that shapes weights (fusing q/k/v,
Gemma's 1 + w) stays the same for every device."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from vllmx import _C, ops
from vllmx.device import BF16, F8_E4M3, F16, F32, DeviceArray
from vllmx.ops import Weight
from vllmx.ops.fp8 import GROUP
from vllmx.pages import off_the_file


@dataclass(frozen=True)
class Placement:
    device: str = "cpu"  # "cpu" | "cuda"
    dtype: int = F32  # activations (and dense weights) on the GPU: BF16 or F16
    # The Gated DeltaNet and Mamba2 layers' recurrent states: F32, or `dtype` on the GPU (vLLM's
    # mamba_ssm_cache_dtype, resolved by the worker; recurrent_state_dtype() checks it).
    ssm_state_dtype: int = F32
    # vLLM's online fp8 (quantization="fp8" on an unquantized checkpoint, Hopper): dense
    # projections go up as e4m3 codes with per-row, per-128-column scales (upload_weight's
    # fp8=True callers: Linear, not the lm_head or embeddings).
    fp8_weights: bool = False

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"


_current = Placement()

# Weight types a model may place on the GPU: those the CUDA linear and embedding kernels take
# (cuda/linear.cu, embedding.cu), each tested there against the CPU's dequantization
# (tests/cuda test_linear_blocks, test_linear_k_quants, test_embedding): the dense types, the
# 32-blocks Q8_0 / Q4_0 / Q4_1, the k-quants of Q4_K_M / Q5_K_M / Q6_K files and IQ4_NL / IQ4_XS.
CUDA_WEIGHT_TYPES = {F32, F16, BF16, ops.Q4_0, ops.Q4_1, ops.Q8_0, ops.Q4_K, ops.Q5_K, ops.Q6_K,
                     ops.IQ4_NL, ops.IQ4_XS, ops.F8_E4M3_B128}


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


def _dense_as(w: Weight, dtype: int) -> np.ndarray:
    """A dense weight (f32 / f16 / bf16) as a 2-D host array of dtype: the native dequantize
    upcasts, the native bf16 quantizer rounds to nearest even (as torch does)."""
    rows = w.shape[0] if len(w.shape) > 1 else 1
    if w.dtype == dtype:
        return np.ascontiguousarray(w.data).reshape(rows, -1)
    f32 = w.to_float32().reshape(rows, -1)
    if dtype == F32:
        return f32
    if dtype == F16:
        return f32.astype(np.float16)
    return ops.quantize_weight(f32, BF16)


def host_as(a: np.ndarray, dtype: int) -> np.ndarray:
    """An f32 host array in a dense dtype's host form (f16; bf16 as uint16, rounded to nearest
    even): what a device array of that dtype is copied from, or a host weight of it holds."""
    a = np.ascontiguousarray(a, np.float32)
    return _dense_as(Weight.from_numpy(a.reshape(-1, a.shape[-1])), dtype).reshape(a.shape)


def recurrent_state_dtype() -> int:
    """The dtype a mixer built now keeps its recurrent (delta-rule / SSM) state in: F32 on the
    CPU; on the GPU the placement's ssm_state_dtype, which the kernels take as f32 or the
    activations' dtype."""
    p = _current
    if not p.on_gpu:
        return F32
    if p.ssm_state_dtype not in (F32, p.dtype):
        raise ValueError(f"mamba_ssm_cache_dtype {_C.type_info(p.ssm_state_dtype)[0]}: the GPU "
                         f"keeps recurrent states in float32 or in the activations' dtype "
                         f"({_C.type_info(p.dtype)[0]}); use auto or float32")
    return p.ssm_state_dtype


def state_zeros(shape: tuple[int, ...], on_gpu: bool, dtype: int = F32):
    """A hybrid mixer's per-request state, zeros: a device array of `dtype` on the GPU, else
    f32 host pages committed as slots are first written (recurrent_state_dtype: the CPU's is
    f32)."""
    from vllmx.pages import lazy_zeros

    return DeviceArray.zeros(shape, dtype) if on_gpu else lazy_zeros(shape, np.float32)


def upload_weight(w: Weight | DeviceArray, name: str = "weight",
                  fp8: bool = False) -> Weight | DeviceArray:
    """A matmul / embedding weight where the current placement wants it: unchanged on the CPU;
    on the GPU dense weights in the activation dtype, block types as stored. fp8: a projection
    that online fp8 (Placement.fp8_weights) quantizes where the fp8 GEMM takes its shape."""
    p = _current
    if not p.on_gpu or isinstance(w, DeviceArray):
        return w
    if fp8 and len(w.shape) == 2 and _online_fp8(w):
        return _fp8_quantized(_dense_as(w, p.dtype))
    if w.dtype not in CUDA_WEIGHT_TYPES:
        raise ValueError(
            f"{name}: GGUF type {_C.type_info(w.dtype)[0]} has no CUDA kernel (CUDA runs bf16, "
            f"f16, f32, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS weights); run this "
            f"model with device='cpu'")
    if w.dtype in (F32, F16, BF16):
        return DeviceArray.from_numpy(_dense_as(w, p.dtype), p.dtype)
    if w.dtype == ops.F8_E4M3_B128:  # fp8 checkpoints: codes and scales as scaled_mm reads them
        return ops.upload_fp8_block_weight(w)
    rows = w.shape[0] if len(w.shape) > 1 else 1
    out = DeviceArray.from_numpy(np.asarray(w.data).reshape(rows, -1), w.dtype)
    out.dequant_dtype = p.dtype  # an embedding's rows come out in the activation dtype
    return out


def _online_fp8(w: Weight) -> bool:
    """Whether online fp8 (Placement.fp8_weights) quantizes w: a dense matrix [N, K], or a
    stack of them, of a shape the fp8 GEMM takes."""
    return (_current.fp8_weights and w.dtype in (F32, F16, BF16)
            and ops.fp8_gemm_fits(*w.shape[-2:]))


def _fp8_quantized(dense: np.ndarray) -> DeviceArray:
    """A dense host matrix [N, K] in the activation dtype's host form, quantized on the device
    row by row as activations are (per_token_group_quant_fp8: each row's 128-wide groups scaled
    to e4m3's range): codes [N, K] with `.scales` [K/128, N]."""
    codes, scales = ops.per_token_group_quant_fp8(DeviceArray.from_numpy(dense, _current.dtype))
    codes.scales = scales
    return codes


def experts_fp8(w: Weight) -> bool:
    """Whether a stack of expert weights [E, N, K] may run on fused_experts' fp8 grouped GEMM
    (Hopper): an fp8 checkpoint's (F8_E4M3_B128: the loader kept its codes), or dense ones
    online fp8 (Placement.fp8_weights) quantizes, where the GEMM takes the shape. fused_experts
    takes both stacks of a layer fp8 or neither (SparseMoeBlock asks for both)."""
    if not _current.on_gpu or isinstance(w, DeviceArray):
        return False
    return w.dtype == ops.F8_E4M3_B128 and ops.fp8_gemm_fits(*w.shape[1:]) or _online_fp8(w)


def upload_experts(w: Weight, name: str = "experts",
                   fp8: bool = False) -> Weight | DeviceArray:
    """Stacked expert weights [E, N, K] where the current placement wants them: unchanged on the
    CPU; on the GPU a dense [E, N, K] array in the activation dtype, or, with fp8 (experts_fp8
    said yes for the layer's two stacks), e4m3 codes [E, N, K] with `.scales` [E, K/128, N]
    (fused_experts' fp8 experts): an fp8 checkpoint's as stored, dense ones quantized on the
    device per row and 128-wide group, each expert as online fp8 quantizes a projection. The
    CUDA fused_experts kernels run no other quantized experts, so GGUF block types (a Q4_K_M
    MoE's experts, gpt-oss's MXFP4) and fp8 stacks whose partner cannot go fp8 are dequantized
    here, expert by expert (the whole stack in f32 on the host would be four bytes a weight):
    ~3.6x a Q4_K stack's bytes on the device in bf16."""
    p = _current
    if not p.on_gpu or isinstance(w, DeviceArray):
        return w
    if fp8 and w.dtype == ops.F8_E4M3_B128:
        return ops.upload_fp8_block_weight(w)
    if fp8 and w.dtype in (F32, F16, BF16):
        codes = DeviceArray.empty(w.shape, F8_E4M3)
        codes.scales = DeviceArray.empty((w.shape[0], w.shape[2] // GROUP, w.shape[1]), F32)
        for e, dense in enumerate(dense_experts(w, p.dtype)):
            q = _fp8_quantized(dense)
            codes[e].copy_from(q)
            codes.scales[e].copy_from(q.scales)
        return codes
    if w.dtype in (F32, F16, BF16):
        return DeviceArray.from_numpy(_dense_as(w, p.dtype).reshape(w.shape), p.dtype)
    out = DeviceArray.empty(w.shape, p.dtype)
    for e, dense in enumerate(dense_experts(w, p.dtype)):
        out[e].copy_from(dense)
    return out


def dense_experts(w: Weight, dtype: int):
    """Each expert [N, K] of a stacked weight [E, N, K] of any type, in turn, as a host array of
    a dense dtype's host form (f32, f16, bf16 as uint16)."""
    shape = tuple(w.shape[1:])
    blocks = np.asarray(w.data).reshape(w.shape[0], -1)
    for e in range(w.shape[0]):
        yield _dense_as(Weight(blocks[e], w.dtype, shape), dtype).reshape(shape)


def upload_vector(a: np.ndarray, dtype: int | None = None) -> np.ndarray | DeviceArray:
    """A small f32 host array (norm weight, bias, rope cache) on the current device: on the CPU
    as it is (copied off a mapped file: pages.off_the_file); on the GPU in `dtype` (default the
    activation dtype)."""
    p = _current
    if not p.on_gpu:
        return off_the_file(a)
    dtype = p.dtype if dtype is None else dtype
    return DeviceArray.from_numpy(host_as(np.reshape(a, (1, -1)), dtype).reshape(np.shape(a)),
                                  dtype)
