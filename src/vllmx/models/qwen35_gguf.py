"""Qwen3.5's Gated DeltaNet tensors as llama.cpp's converter stores them, back in the
checkpoint's order. With fewer key heads than value heads (r value heads per key head) the
checkpoint orders value heads grouped by key head (g r + j); the converter reorders them tiled
(j Hk + g) so that ggml broadcasts the key heads, in every tensor with a value-head axis: the v
part of in_proj_qkv and of the conv, in_proj_z, in_proj_b / in_proj_a, A_log, dt_bias (rows or
elements) and out_proj (columns). vllmx's kernel pairs value head h with key head h // r, so
the grouped order is restored at load. out_proj's columns move a head (dv values) at a time:
in place for a block type whose blocks tile a head, else dequantized to f32."""

from __future__ import annotations

import numpy as np

from vllmx import _C
from vllmx.layers.linear import take_rows
from vllmx.ops import F16, F32, Weight


def qwen35_grouped(cfg: dict, weights: dict[str, Weight]) -> None:
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if hk == hv:
        return
    r = hv // hk
    # tiled index of the value head at grouped position g r + j
    heads = (np.arange(r)[None, :] * hk + np.arange(hk)[:, None]).ravel()

    def rows(d: int) -> np.ndarray:
        return (heads[:, None] * d + np.arange(d)).ravel()

    qk = 2 * hk * dk
    for name in list(weights):
        if ".linear_attn." not in name:
            continue
        w, part = weights[name], name.split(".linear_attn.")[1]
        if part in ("in_proj_qkv.weight", "conv1d.weight", "conv1d.bias"):
            weights[name] = take_rows(w, np.concatenate([np.arange(qk), qk + rows(dv)]))
        elif part == "in_proj_z.weight":
            weights[name] = take_rows(w, rows(dv))
        elif part in ("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias"):
            weights[name] = take_rows(w, heads)
        elif part == "out_proj.weight":
            weights[name] = _take_columns(w, heads, dv)


def _take_columns(w: Weight, heads: np.ndarray, d: int) -> Weight:
    """w's columns in runs of d (one head each), in the order heads gives."""
    if w.dtype in (F32, F16):
        cols = (heads[:, None] * d + np.arange(d)).ravel()
        data = np.asarray(w.data).reshape(w.shape)[:, cols]
        return Weight(np.ascontiguousarray(data), w.dtype, w.shape)
    _, block, type_size, _, _ = _C.type_info(w.dtype)
    if d % block:  # a head is not whole blocks: reorder the f32 values
        return _take_columns(Weight.from_numpy(w.to_float32()), heads, d)
    per_head = d // block
    data = np.asarray(w.data).reshape(w.shape[0], -1, per_head * type_size)[:, heads]
    return Weight(np.ascontiguousarray(data.reshape(w.shape[0], -1)), w.dtype, w.shape)
