"""Paged attention layer: writes this step's keys/values into the layer's cache blocks, then
attends over the block table (prefill chunks and decodes in one varlen call). `forward_qkv`
starts from the fused qkv projection: per-head q/k norm, rope and the cache write are one op;
`forward` starts from q, k and v apart (a model that norms them its own way)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllmx import ops
from vllmx.layers.linear import Linear, MergedLinear
from vllmx.ops import Weight


@dataclass
class AttentionMetadata:
    slot_mapping: np.ndarray  # i32 [T]
    block_table: np.ndarray  # i32 [B, max_blocks]
    query_start_loc: np.ndarray  # i32 [B + 1]
    seq_lens: np.ndarray  # i32 [B]
    kv_caches: list[tuple[np.ndarray, np.ndarray]]  # per layer (key_cache, value_cache)
    cache_dtype: int
    max_query_len: int = 0  # the longest query when known (1: a decode-only step), else 0
    # Hybrid models (Gated DeltaNet / Mamba layers): each sequence's state slot (i32 [B]) and
    # whether the slot holds its state so far (i32 [B]: 0 at its first tokens).
    state_indices: np.ndarray | None = None
    has_initial_state: np.ndarray | None = None
    # With speculative decoding: a slot a row (i32 [T], -1 none) that also gets the state
    # after it (worker/state_slots.py).
    spec_state_indices: np.ndarray | None = None
    # MLA (layers/mla.py): a step whose sequences from mla_first_seq on (rows from
    # mla_first_row on) are whole prompts, which attend on decompressed keys and values of
    # those rows: their sequence b's position i at row mla_query_start_loc[b] + i of them
    # (i32 [B - mla_first_seq, L] and [B - mla_first_seq + 1]).
    mla_block_table: np.ndarray | None = None
    mla_query_start_loc: np.ndarray | None = None
    mla_first_seq: int = 0
    mla_first_row: int = 0


class Attention:
    def __init__(self, layer_idx: int, num_heads: int, num_kv_heads: int, head_size: int,
                 scale: float, sliding_window: int = 0, logits_soft_cap: float = 0.0,
                 sinks: np.ndarray | None = None):
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.scale = scale
        self.sliding_window = sliding_window or 0
        self.logits_soft_cap = logits_soft_cap or 0.0
        self.sinks = sinks  # f32 [num_heads]: gpt-oss's per-head sink logits, where it runs

    def forward_qkv(self, qkv, positions, rope, q_norm, k_norm, md: AttentionMetadata):
        """qkv [T, (nq + 2 nkv) * D] -> attention output [T, nq * D]. q_norm / k_norm: RMSNorm
        layers over a head (Qwen3, Gemma 3) or None."""
        key_cache, value_cache = md.kv_caches[self.layer_idx]
        q = ops.qk_norm_rope_cache(
            qkv, positions, rope.cos_sin_cache, rope.is_neox_style,
            None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
            1e-6 if q_norm is None else q_norm.eps, key_cache, value_cache, md.slot_mapping,
            md.cache_dtype, self.num_heads, self.num_kv_heads, self.head_size)
        return self._attend(q, key_cache, value_cache, md)

    def forward(self, q, k, v, positions, rope, md: AttentionMetadata):
        """From q [T, nq * D], k and v [T, nkv * D] already apart (OLMo 2 norms q and k over
        all heads at once): rope on q and k in place, k and v into the cache, attention."""
        key_cache, value_cache = md.kv_caches[self.layer_idx]
        rope(positions, q, k)
        ops.write_kv_cache(k, v, key_cache, value_cache, md.slot_mapping, md.cache_dtype)
        return self._attend(q, key_cache, value_cache, md)

    def _attend(self, q, key_cache, value_cache, md: AttentionMetadata):
        return ops.paged_attention(q, key_cache, value_cache, md.block_table, md.query_start_loc,
                                   md.seq_lens, self.scale, md.cache_dtype, self.sliding_window,
                                   self.logits_soft_cap, md.max_query_len, self.sinks)


class SelfAttention:
    """q / k / v / o projections (biases where the checkpoint has them) around Attention, no
    q/k norm: the attention layers of the hybrids (Granite-4's, Nemotron-H's) under prefix
    (e.g. "model.layers.3.self_attn.")."""

    def __init__(self, layer_idx: int, cfg: dict, w: dict[str, Weight], prefix: str, rope,
                 scale: float):
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        names = [prefix + f"{n}_proj" for n in "qkv"]
        self.qkv_proj = MergedLinear([w[n + ".weight"] for n in names],
                                     [w.get(n + ".bias") for n in names])
        self.o_proj = Linear(w[prefix + "o_proj.weight"], w.get(prefix + "o_proj.bias"))
        self.rope = rope
        self.attn = Attention(layer_idx, nh, nkv, hd, scale)

    def __call__(self, positions, x, md: AttentionMetadata):
        return self.o_proj(self.attn.forward_qkv(self.qkv_proj(x), positions, self.rope, None,
                                                 None, md))
