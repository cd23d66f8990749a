"""The one Python facade over the native ops. Model code calls these, never `vllmx._C`. On the
CPU activations are float32 numpy arrays and weights `Weight`s; on the GPU both are
`vllmx.device.DeviceArray`s (activations bf16 / f16). Each function only allocates its outputs
on its input's device and calls the op table (`_C.ops.<name>`, csrc/ops.def), which dispatches by
device; where a device has a fused op (the op table says so), the fused one is picked. The
mixture-of-experts, hybrid-mixer and sampling ops live in modules of their own (ops/moe.py,
ops/linear_attn.py, ops/sampling.py), read as ops.<name> all the same."""

from __future__ import annotations

import numpy as np

from vllmx import _C
from vllmx.device import BF16, F16, F32, Q8_0, DeviceArray, dtype_id  # noqa: F401 - ops.<id>
from vllmx.ops._base import _arg, _empty, _host_empty, _on_device  # noqa: F401 - ops._arg

# The weight type, the dtype ids and the weights' host preparation (vllmx/weights.py), read by
# model code as ops.<name>.
from vllmx.weights import (  # noqa: F401
    IQ4_NL,
    IQ4_XS,
    Q2_K,
    Q3_K,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_1,
    QUANTIZE_TYPES,
    Weight,
    align_weight,
    aligned_empty,
    dtype_name,
    is_supported,
    packed_dtype,
    quantize_weight,
    repack_experts,
    repack_weight,
)


def _rows(table) -> int:
    """Elements in a table's last dim (a block type's bytes / block bytes * block size)."""
    if isinstance(table, Weight):
        return table.shape[-1]
    _, block_size, type_size, quantized, _ = _C.type_info(table.dtype)
    return table.shape[-1] // type_size * block_size if quantized else table.shape[-1]


def embedding(ids, table, out_dtype: int | None = None, out=None):
    """table[ids]: [T, H] rows, dequantized. On the host f32; on the GPU out_dtype (default: the
    table's dtype if dense, else its dequant_dtype, the model's activation dtype), or into out
    when given."""
    if out is None and isinstance(ids, DeviceArray):
        if out_dtype is None:
            out_dtype = table.dtype if table.dtype in (F32, F16, BF16) else table.dequant_dtype
        out = DeviceArray.empty((ids.shape[0], _rows(table)), out_dtype)
    elif out is None:
        out = _host_empty((ids.shape[0], _rows(table)), np.float32)
    _C.ops.embedding(out, ids, _arg(table))
    return out


def embedding_shard(ids, table, vocab_start: int):
    """A vocab-parallel embedding's share (host): table's rows for the ids in [vocab_start,
    vocab_start + rows), zeros for the others."""
    out = _host_empty((ids.shape[0], _rows(table)), np.float32)
    _C.ops.embedding_shard(out, ids, _arg(table), vocab_start)
    return out


def linear(x, w, bias=None):
    if is_fp8_weight(w):
        return fp8_linear(x, w, bias)
    out = _empty(x, (x.shape[0], w.shape[0]))
    _C.ops.linear(out, x, _arg(w), bias)
    return out


def rms_norm(x, w, eps: float):
    out = _empty(x, x.shape)
    _C.ops.rms_norm(out, x, w, eps)
    return out


def fused_add_rms_norm(x, residual, w, eps: float) -> None:
    """In place: residual += x; x = rms_norm(residual) * w."""
    _C.ops.fused_add_rms_norm(x, residual, w, eps)


def layer_norm(x, w, b, eps: float):
    """LayerNorm over each group of w.shape[-1] values of x's rows (w, b: [D] shared, or
    [G, D] one per group, e.g. per-head q/k norms); b may be None."""
    out = _empty(x, x.shape)
    _C.ops.layer_norm(out, x, w, b, eps)
    return out


def fused_add_layer_norm(x, residual, w, b, eps: float) -> None:
    """In place: residual += x; x = layer_norm(residual) * w + b (b may be None)."""
    _C.ops.fused_add_layer_norm(x, residual, w, b, eps)


def rotary(positions, q, k, cos_sin_cache, head_size: int, is_neox: bool) -> None:
    _C.ops.rotary(positions, q, k, cos_sin_cache, head_size, is_neox)


_ACTS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}  # linear_act_and_mul's act codes (ops.def)


def _act_code(op: str, act: str) -> int:
    if act not in _ACTS:
        raise ValueError(f"{op}: act must be one of {sorted(_ACTS)}, got {act!r}")
    return _ACTS[act]


def _fused(name: str, x) -> bool:
    """Whether the op table has a kernel of the fused op `name` for x's device (the GPU's fused
    decode ops; elsewhere the unfused ops run one after the other)."""
    return getattr(_C.ops, name).has_kernel("cuda" if isinstance(x, DeviceArray) else "cpu")


def act_and_mul(x, act: str = "silu"):
    """act(x[:, :I]) * x[:, I:] for act "silu", "gelu" (erf) or "gelu_tanh"."""
    _act_code("act_and_mul", act)
    if act == "silu":
        return silu_and_mul(x)
    return gelu_and_mul(x, "tanh" if act == "gelu_tanh" else "none")


def batched_linear(x, w, out=None):
    """out[:, g, :] = x[:, g, :] @ w[g]^T per group g: x [T, G, K] (a strided view is fine),
    w a stacked Weight [G, N, K]; out [T, G, N] (new, or a view to write into)."""
    if out is None:
        out = _empty(x, (x.shape[0], x.shape[1], w.shape[1]))
    _C.ops.batched_linear(out, x, _arg(w))
    return out


def linear_act_and_mul(x, w, act: str = "silu"):
    """act(x @ gate^T) * (x @ up^T) for w = [gate; up] (a merged gate_up_proj); act is "silu",
    "gelu" (erf) or "gelu_tanh". On the GPU decode rows take one fused GEMV (up to 4 rows of
    block weights, 2 of bf16 / f16 ones)."""
    code = _act_code("linear_act_and_mul", act)
    if not _fused("linear_act_and_mul", x) or is_fp8_weight(w):
        return act_and_mul(linear(x, w), act)
    n = w.shape[0]
    out = _empty(x, (x.shape[0], n // 2))
    tmp = _empty(x, (x.shape[0], n))  # used when the op runs unfused
    _C.ops.linear_act_and_mul(out, x, _arg(w), tmp, code)
    return out


def rms_norm_linear(x, residual, norm_w, eps: float, w, bias=None, act: str | None = None):
    """A decoder layer's norm and the projection after it: h = x + residual (or x when residual
    is None), y = rms_norm(h) * norm_w, out = linear(y, w, bias), or linear_act_and_mul(y, w,
    act) when act is given. Returns (out, h), h being the residual stream from here on. Without
    the fused op (the CPU) the residual is updated in place (vLLM's fused_add_rms_norm); on the
    GPU decode rows (as in linear_act_and_mul) take one GEMV that normalizes x as it reads it,
    and an fp8 w's rows are quantized by the norm's kernel (fp8_linear's bits)."""
    code = -1 if act is None else _act_code("rms_norm_linear", act)
    # (A biased gate_up (Llama's mlp_bias) is activated after its bias: the separate ops.)
    if not _fused("rms_norm_linear", x) or (bias is not None and act is not None):
        if residual is None:
            h, residual = rms_norm(x, norm_w, eps), x
        else:
            fused_add_rms_norm(x, residual, norm_w, eps)
            h = x
        if act is None:
            out = linear(h, w, bias)
        elif bias is None:
            out = linear_act_and_mul(h, w, act)
        else:
            out = act_and_mul(linear(h, w, bias), act)
        return out, residual
    t, k, n = x.shape[0], x.shape[1], w.shape[0]
    out = _empty(x, (t, n if code < 0 else n // 2))
    res_out = None if residual is None else _empty(x, (t, k))
    tmp_norm = _empty(x, (t, k))  # the unfused path's buffers
    tmp_act = _empty(x, (t, n)) if code >= 0 else None
    _C.ops.rms_norm_linear(out, res_out, x, residual, norm_w, eps, _arg(w), bias, tmp_norm,
                           tmp_act, code, w.scales if is_fp8_weight(w) else None)
    return out, (x if residual is None else res_out)


def silu_and_mul(x):
    out = _empty(x, (x.shape[0], x.shape[1] // 2))
    _C.ops.silu_and_mul(out, x)
    return out


def write_kv_cache(key, value, key_cache, value_cache, slot_mapping, cache_dtype: int) -> None:
    """cache_dtype: the host caches' dtype id (device caches carry their own)."""
    if not isinstance(key, DeviceArray):
        key_cache, value_cache = (key_cache, cache_dtype), (value_cache, cache_dtype)
    _C.ops.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def qk_norm_rope_cache(qkv, positions, cos_sin_cache, is_neox: bool, q_norm, k_norm,
                       eps: float, key_cache, value_cache, slot_mapping, cache_dtype: int,
                       num_heads: int, num_kv_heads: int, head_size: int):
    """The attention prologue: from qkv [T, (nq + 2 nkv) * D], q and k rms-normed per head
    (q_norm / k_norm weights, or None for none) and rotated, k and v written to the cache slots;
    returns q [T, nq * D]. One op where the device has it (the GPU); otherwise the separate ops,
    which a recorded step (worker/step_capture.py) replays."""
    if _fused("qk_norm_rope_cache", qkv):
        q = _empty(qkv, (qkv.shape[0], num_heads * head_size))
        _C.ops.qk_norm_rope_cache(q, qkv, positions, cos_sin_cache, q_norm, k_norm, eps,
                                  key_cache, value_cache, slot_mapping, num_heads, num_kv_heads,
                                  is_neox)
        return q
    t, d = qkv.shape[0], head_size
    q, k, v = split_columns(qkv, [num_heads * d, num_kv_heads * d, num_kv_heads * d])
    if q_norm is not None:
        q = rms_norm(q.reshape(t * num_heads, d), q_norm, eps).reshape(t, -1)
        k = rms_norm(k.reshape(t * num_kv_heads, d), k_norm, eps).reshape(t, -1)
    rotary(positions, q, k, cos_sin_cache, head_size, is_neox)
    write_kv_cache(k, v, key_cache, value_cache, slot_mapping, cache_dtype)
    return q


def paged_attention(q, key_cache, value_cache, block_table, query_start_loc, seq_lens,
                    scale: float, cache_dtype: int, sliding_window: int = 0,
                    logits_soft_cap: float = 0.0, max_query_len: int = 0, sinks=None):
    """max_query_len: the longest query of the batch when known (1: decode only), else 0.
    cache_dtype: the host caches' dtype id (device caches carry their own). sinks: f32 [nq]
    attention-sink logits (gpt-oss) or None."""
    if not isinstance(q, DeviceArray):
        key_cache, value_cache = (key_cache, cache_dtype), (value_cache, cache_dtype)
    out = _empty(q, q.shape)
    _C.ops.paged_attention(out, q, key_cache, value_cache, block_table, query_start_loc,
                           seq_lens, scale, sliding_window, logits_soft_cap, max_query_len,
                           sinks)
    return out


def zero_rows_at_position_(x, positions, position: int = 0):
    """x's rows whose positions equal position set to zero, in place (x's device)."""
    _C.ops.zero_rows_at_position(x, positions, position)
    return x


def add_lora_linear(y, x, lora_a, lora_b, lora_indices: np.ndarray,
                    output_slices: np.ndarray) -> None:
    """In place, for y's column slices [o_i, o_i+1) (output_slices i32 [S + 1], o_0 = 0, o_S =
    N): y[t, o_i:o_i+1] += (x[t] @ lora_a[s, i r:(i + 1) r]^T) @ lora_b[s, o_i:o_i+1]^T for
    s = lora_indices[t] >= 0 (-1: no adapter); lora_a [L, S r, K], lora_b [L, N, r] f32 arrays
    or Weights in linear's 16-row panels (F32_X16: each slot's A, each slot's slices of B)
    (vLLM's punica add_lora_linear with its output_slices)."""
    _C.ops.add_lora_linear(y, x, _arg(lora_a), _arg(lora_b), lora_indices, output_slices)


def relu2(x):
    """max(x, 0)^2 elementwise (Nemotron-H's MLP activation)."""
    out = _empty(x, x.shape)
    _C.ops.relu2(out, x)
    return out


def swigluoai_and_mul(x, alpha: float = 1.702, limit: float = 7.0):
    """gpt-oss's clamped SwiGLU over x [T, 2 I] = [gate; up] (vLLM's swigluoai_and_mul)."""
    out = _empty(x, (x.shape[0], x.shape[1] // 2))
    _C.ops.swigluoai_and_mul(out, x, alpha, limit)
    return out


def gelu_and_mul(x, approximate: str = "none"):
    """GeGLU: gelu(x[:, :I]) * x[:, I:]; approximate is "none" (erf) or "tanh" (PyTorch's)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    out = _empty(x, (x.shape[0], x.shape[1] // 2))
    _C.ops.gelu_and_mul(out, x, approximate == "tanh")
    return out


def gelu(x, approximate: str = "none"):
    """gelu(x) elementwise; approximate is "none" (erf) or "tanh" (PyTorch's)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    out = _empty(x, x.shape)
    _C.ops.gelu(out, x, approximate == "tanh")
    return out


def fill_uniform(out, seed: int, low: float, high: float):
    """out = uniform values in [low, high) from a counter-based hash of (seed, element index):
    the same bits on either device; out f32/f16/bf16 (a host half array as (array, dtype id))."""
    _C.ops.fill_uniform(out, seed, low, high)
    return out


def softcap(x, cap: float):
    """x = cap * tanh(x / cap) in place (Gemma's logit soft-capping); returns x."""
    _C.ops.softcap(x, cap)
    return x


def split_columns(x, sizes: list[int]) -> list:
    """Contiguous copies of consecutive column ranges of x [T, sum(sizes)] (e.g. q, k, v out of
    one fused projection): the native ops take contiguous rows. A native copy, so that a
    recorded step (worker/step_capture.py) replays it."""
    pieces, start = [], 0
    for n in sizes:
        out = _empty(x, (x.shape[0], n))
        _C.ops.copy_columns(out, 0, x, start, n)
        pieces.append(out)
        start += n
    return pieces


def concat_columns(xs: list):
    """[T, sum(widths)] from arrays [T, width_i] side by side (the inverse of split_columns)."""
    out = _empty(xs[0], (xs[0].shape[0], sum(x.shape[1] for x in xs)))
    start = 0
    for x in xs:
        _C.ops.copy_columns(out, start, x, 0, x.shape[1])
        start += x.shape[1]
    return out


def copy_rows(out, x) -> None:
    """out[:] = x ([T, H] both), natively, so that a recorded step replays it (a captured
    step's hidden states kept for a drafter)."""
    _C.ops.copy_columns(out, 0, x, 0, x.shape[1])


def copy_of(x):
    """A copy of [T, H] x where x is (on the GPU queued after what is queued before; on the
    host a numpy array of its own, outside any step's arena)."""
    if not isinstance(x, DeviceArray):
        return np.array(x)
    out = DeviceArray.empty(x.shape, x.dtype)
    copy_rows(out, x)
    return out


def copy_columns(out, start: int, x) -> None:
    """out[:, start:start + width] = x ([T, width]), natively (a recorded step replays it)."""
    _C.ops.copy_columns(out, start, x, 0, x.shape[1])


def zeros(like, shape: tuple[int, ...]):
    """Zeros of like's dtype on like's device (on the GPU a memset queued on vllmx's stream)."""
    if isinstance(like, DeviceArray):
        return DeviceArray.zeros(shape, like.dtype)
    out = _host_empty(shape, like.dtype)
    out.fill(0)
    return out


def empty(like, shape: tuple[int, ...]):
    """Uninitialised memory of like's dtype on like's device."""
    return _empty(like, shape)


def copy_head_columns(out, out_col: int, x, x_col: int, n: int, heads: int,
                      out_head_stride: int, x_head_stride: int) -> None:
    """For each head h < heads: out[:, out_col + h * out_head_stride :][:n] = x[:, x_col + h *
    x_head_stride :][:n] (x_head_stride 0: the same columns of x for every head), natively."""
    _C.ops.copy_columns(out, out_col, x, x_col, n, heads, out_head_stride, x_head_stride)


def scatter_tokens(out, dst, tokens, src) -> None:
    """In place: out[dst[i]] = tokens[src[i]] (i32 arrays on one device; an index out of range
    skips its entry): a step's input ids from the tokens the step before sampled, on the device
    that holds them."""
    _C.ops.scatter_tokens(out, dst, tokens, src)


def scale_(x, s: float) -> None:
    """In place: x *= s (f32), natively, so that a recorded step replays it."""
    _C.ops.scale(x, x, s)


def gather_rows(x, rows, out_dtype: int | None = None):
    """x[rows], contiguous; on the GPU optionally cast to out_dtype. rows: a host int array,
    or on the GPU an i32 device array (already there: no upload, which waits for the stream)."""
    if isinstance(x, DeviceArray):
        ids = rows if isinstance(rows, DeviceArray) else DeviceArray.from_numpy(
            np.ascontiguousarray(rows, dtype=np.int32))
        return embedding(ids, x, out_dtype)
    return np.ascontiguousarray(x[rows])


_arange: DeviceArray | None = None  # 0, 1, 2, ... on the GPU (grow-only)


def to_float32(x):
    """Activations as f32: a device array is cast on the GPU (logits for the sampler), by a
    gather over a kept device arange (an upload per call would wait for the stream)."""
    global _arange
    if isinstance(x, DeviceArray):
        if x.dtype == F32:
            return x
        n = x.shape[0]
        if _arange is None or _arange.shape[0] < n:
            _arange = DeviceArray.from_numpy(np.arange(max(n, 1024), dtype=np.int32))
        return embedding(_arange[:n], x, F32)
    return x


def cuda_available() -> bool:
    return _C.cuda_available()


# Families of ops in modules of their own (ops/moe.py, ops/linear_attn.py, ops/sampling.py),
# read as ops.<name> as the others are.
from vllmx.ops.fp8 import (  # noqa: F401
    F8_E4M3_B128,
    fp8_block_weight,
    fp8_gemm_fits,
    fp8_linear,
    is_fp8_weight,
    per_token_group_quant_fp8,
    scaled_mm,
    upload_fp8_block_weight,
)
from vllmx.ops.linear_attn import (  # noqa: F401
    causal_conv1d,
    gated_delta_rule,
    mamba2_scan,
    rms_norm_gated,
    sigmoid_gate_,
)
from vllmx.ops.moe import (  # noqa: F401
    _EXPERT_ACTIVATIONS,
    fused_experts,
    grouped_topk,
    remap_expert_ids,
    topk_softmax,
)
from vllmx.ops.sampling import (  # noqa: F401
    apply_logits_processors,
    apply_token_bitmask,
    argmax,
    compute_logprobs,
    num_top_logprobs,
    sample,
)
