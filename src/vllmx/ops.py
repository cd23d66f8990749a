"""The one Python facade over the native ops. Model code calls these, never `vllmx._C`. On the
CPU activations are float32 numpy arrays and weights `Weight`s; on the GPU both are
`vllmx.device.DeviceArray`s (activations bf16 / f16). Each function only allocates its outputs
on its input's device and calls the op table (`_C.ops.<name>`, csrc/ops.def), which dispatches by
device; where a device has a fused op (the op table says so), the fused one is picked."""

from __future__ import annotations

import numpy as np

from vllmx import _C
from vllmx.device import BF16, F16, F32, Q8_0, DeviceArray, dtype_id  # noqa: F401 - ops.<id>

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


def _arg(t):
    """A tensor argument of an op: a Weight as (bytes, dtype id), arrays as they are."""
    return (t.data, t.dtype) if isinstance(t, Weight) else t


_ALIGN_FROM_BYTES = 1 << 16


def _host_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.empty, large arrays on a 64-byte boundary (malloc's large blocks start 16 bytes past a
    page; 4% of MiniLM's f32 linear on two cores)."""
    if int(np.prod(shape)) * np.dtype(dtype).itemsize < _ALIGN_FROM_BYTES:
        return np.empty(shape, dtype=dtype)
    return aligned_empty(shape, dtype)


def _empty(like, shape: tuple[int, ...], dtype=None):
    """Uninitialised output on like's device: like's dtype, or the numpy dtype given (its id on
    the GPU)."""
    if isinstance(like, DeviceArray):
        return DeviceArray.empty(shape, like.dtype if dtype is None else dtype_id(dtype))
    return _host_empty(shape, like.dtype if dtype is None else dtype)


def _on_device(a):
    """A host array's device copy (the upload waits: the host array may go right after);
    a DeviceArray as it is."""
    return a if isinstance(a, DeviceArray) else DeviceArray.from_numpy(np.ascontiguousarray(a))


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
    if not _fused("linear_act_and_mul", x):
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
    GPU decode rows (as in linear_act_and_mul) take one GEMV that normalizes x as it reads it."""
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
                           tmp_act, code)
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


def sample(logits, temperature, top_k, top_p, min_p, rng_state, with_logprobs: bool = True,
           out: tuple | None = None):
    """Token ids (int32 [B]) and their log-probs under the given logits (float32 [B]; None
    without with_logprobs), on logits' device. rng_state (uint64 [B, 2]) is advanced in place.
    out: (ids, logprobs or None) to write instead (the GPU sampler's staging buffer)."""
    if out is None:
        b = logits.shape[0]
        out = (_empty(logits, (b,), np.int32),
               _empty(logits, (b,), np.float32) if with_logprobs else None)
    _C.ops.sample(*out, logits, temperature, top_k, top_p, min_p, rng_state)
    return out


def apply_logits_processors(logits, **groups: np.ndarray) -> None:
    """In place over logits (float32 [B, V], host or GPU): allowed_token_ids, bad words, logit
    bias (and min_tokens bans), penalties; each group as CSR int32 host arrays (csrc/ops.def),
    uploaded when the logits are on the GPU."""
    if isinstance(logits, DeviceArray):
        groups = {k: _on_device(v) for k, v in groups.items()}
    _C.ops.apply_logits_processors(logits, **groups)


def apply_token_bitmask(logits, bitmask: np.ndarray, indices: np.ndarray | None = None) -> None:
    """In place over logits (float32 [B, V], host or GPU): -inf for every token whose bit is 0
    in its row's packed grammar mask (bitmask int32 [R, ceil(V / 32)], host; indices int32 [R]:
    the logits row of each mask row, None: R == B). Uploaded when the logits are on the GPU
    (unless they are there already: the sampler stages them)."""
    if isinstance(logits, DeviceArray):
        bitmask = _on_device(bitmask)
        if indices is not None:
            indices = _on_device(indices)
    _C.ops.apply_token_bitmask(logits, bitmask, indices)


def num_top_logprobs(num_logprobs: np.ndarray, vocab: int) -> int:
    """K of compute_logprobs' top lists: the largest count, at most the vocabulary (0: none)."""
    return max(0, min(int(num_logprobs.max(initial=0)), vocab))


def compute_logprobs(logits, token_ids: np.ndarray, num_logprobs: np.ndarray, out=None,
                     counts=None):
    """Per row of log_softmax(logits): the log-prob of token_ids[n] (float32 [N]), its rank
    (int32 [N]; 0 where num_logprobs[n] < 0) and the num_logprobs[n] most probable tokens
    (int32 / float32 [N, K], K = num_top_logprobs; padded with -1 / -inf). num_logprobs is a
    host array; with device logits it and token_ids (host or device) go to the GPU and the
    results are DeviceArrays: the logits never leave it. out: the four arrays to write instead
    (top ones None when K = 0), counts: num_logprobs already on the GPU (the sampler's
    staging buffer)."""
    n, vocab = logits.shape
    k = num_top_logprobs(num_logprobs, vocab) if n else 0
    if out is None:
        out = (_empty(logits, (n,), np.float32), _empty(logits, (n,), np.int32),
               _empty(logits, (n, k), np.int32) if k > 0 else None,
               _empty(logits, (n, k), np.float32) if k > 0 else None)
    token_logprob, rank, top_ids, top_logprobs = out
    if counts is None:
        counts = num_logprobs
    if isinstance(logits, DeviceArray):
        token_ids = _on_device(token_ids if isinstance(token_ids, DeviceArray)
                               else np.asarray(token_ids, dtype=np.int32))
        counts = _on_device(counts if isinstance(counts, DeviceArray)
                            else np.asarray(counts, dtype=np.int32))
    _C.ops.compute_logprobs(token_logprob, rank, top_ids, top_logprobs, logits, token_ids,
                            counts)
    if top_ids is None:  # callers index [N, 0] arrays
        top_ids, top_logprobs = np.zeros((n, 0), np.int32), np.zeros((n, 0), np.float32)
    return token_logprob, rank, top_ids, top_logprobs


def topk_softmax(gating_output, k: int, renormalize: bool):
    """MoE routing: (topk_weights f32 [T, k], topk_ids i32 [T, k]) of the softmax over the
    router logits gating_output [T, E]; renormalize divides the k weights by their sum."""
    weights = _empty(gating_output, (gating_output.shape[0], k), np.float32)
    ids = _empty(gating_output, (gating_output.shape[0], k), np.int32)
    _C.ops.topk_softmax(weights, ids, gating_output, renormalize)
    return weights, ids


def argmax(x):
    """Each row's argmax (i32 [B], on x's device; ties to the lowest index)."""
    out = _empty(x, (x.shape[0],), np.int32)
    _C.ops.argmax(out, x)
    return out


def zero_rows_at_position_(x, positions, position: int = 0):
    """x's rows whose positions equal position set to zero, in place (x's device)."""
    _C.ops.zero_rows_at_position(x, positions, position)
    return x


def remap_expert_ids(topk_ids, start: int, count: int):
    """Expert parallelism: global expert ids in [start, start + count) to this rank's local
    ones, the others -1 (fused_experts skips them), in place."""
    _C.ops.remap_expert_ids(topk_ids, start, count)
    return topk_ids


def grouped_topk(gating_output, k: int, num_expert_group: int = 1, topk_group: int = 1,
                 scoring_func: str = "softmax", renormalize: bool = False,
                 routed_scaling_factor: float = 1.0, e_score_correction_bias=None):
    """MoE routing with expert groups and a choice bias (vLLM's grouped_topk: DeepSeek V2/V3,
    GLM-4.5; contract in csrc/ops.def): (topk_weights f32 [T, k], topk_ids i32 [T, k]).
    scoring_func is "softmax" or "sigmoid"."""
    if scoring_func not in ("softmax", "sigmoid"):
        raise ValueError(f"grouped_topk: scoring_func must be 'softmax' or 'sigmoid', got "
                         f"{scoring_func!r}")
    weights = _empty(gating_output, (gating_output.shape[0], k), np.float32)
    ids = _empty(gating_output, (gating_output.shape[0], k), np.int32)
    _C.ops.grouped_topk(weights, ids, gating_output, e_score_correction_bias, num_expert_group,
                        topk_group, scoring_func == "sigmoid", renormalize,
                        routed_scaling_factor)
    return weights, ids


_EXPERT_ACTIVATIONS = {"silu": 0, "swigluoai": 1, "relu2": 2}


def fused_experts(x, w13, w2, topk_weights, topk_ids, w13_bias=None, w2_bias=None,
                  activation: str = "silu"):
    """out [T, H] = sum_j topk_weights[:, j] * w2_e(act(gate_e x, up_e x)), e = topk_ids[:, j];
    w13 [E, 2 I, H] and w2 [E, H, I] stacked expert Weights (vLLM's fused_experts), optional
    f32 biases [E, 2 I] / [E, H]; activation "silu" (SwiGLU) or "swigluoai" (gpt-oss's)."""
    if activation not in _EXPERT_ACTIVATIONS:
        raise ValueError(f"fused_experts: activation must be one of "
                         f"{sorted(_EXPERT_ACTIVATIONS)}, got {activation!r}")
    out = _empty(x, x.shape)
    _C.ops.fused_experts(out, x, _arg(w13), _arg(w2), topk_weights, topk_ids, w13_bias,
                         w2_bias, _EXPERT_ACTIVATIONS[activation])
    return out


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


def causal_conv1d(x, weight, bias, conv_state, query_start_loc, state_indices,
                  has_initial_state, silu: bool = True, spec_state_indices=None):
    """The hybrid mixers' short depthwise convolution with its window carried in conv_state
    slots (contract in csrc/ops.def): out [T, D]. spec_state_indices: a slot a row (or -1)
    that also gets the window after it."""
    out = _empty(x, x.shape)
    _C.ops.causal_conv1d(out, x, weight, bias, conv_state, query_start_loc, state_indices,
                         has_initial_state, spec_state_indices, silu)
    return out


def gated_delta_rule(q, k, v, a, b, A_log, dt_bias, recurrent_state, query_start_loc,
                     state_indices, has_initial_state, spec_state_indices=None):
    """Gated DeltaNet's recurrence over each sequence's state slot (contract in csrc/ops.def):
    out [T, Hv * dv]. spec_state_indices: a slot a row (or -1) that also gets the state
    after it."""
    out = _empty(v, v.shape)
    _C.ops.gated_delta_rule(out, recurrent_state, q, k, v, a, b, A_log, dt_bias,
                            query_start_loc, state_indices, has_initial_state,
                            spec_state_indices)
    return out


def rms_norm_gated(x, z, w, eps: float, group_size: int | None = None,
                   norm_before_gate: bool = True):
    """Gated RMSNorm over each group of group_size (default w.shape[0]) values:
    x / rms(x) * w * silu(z), or with norm_before_gate False (Mamba2's) the norm of
    x * silu(z), times w."""
    out = _empty(x, x.shape)
    _C.ops.rms_norm_gated(out, x, z, w, eps, group_size or w.shape[0], norm_before_gate)
    return out


def mamba2_scan(x, dt, B, C, A_log, D, dt_bias, ssm_state, query_start_loc, state_indices,
                has_initial_state, dt_min: float = 0.0, dt_max: float = float("inf"),
                spec_state_indices=None):
    """Mamba2's selective state space over each sequence's state slot (contract in
    csrc/ops.def): out [T, H * P]. spec_state_indices: a slot a row (or -1) that also gets the
    state after it."""
    out = _empty(x, x.shape)
    _C.ops.mamba2_scan(out, ssm_state, x, dt, B, C, A_log, D, dt_bias, query_start_loc,
                       state_indices, has_initial_state, spec_state_indices, dt_min, dt_max)
    return out


def sigmoid_gate_(x, gate) -> None:
    """In place x *= sigmoid(gate) (gate like x, or one column)."""
    _C.ops.sigmoid_gate(x, gate)
