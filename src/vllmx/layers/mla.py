"""Multi-head latent attention (DeepSeek V2/V3), computed in the latent space as vLLM's MLA
backends decode: the cache holds one row a token, [k_pe (rotated, qk_rope_head_dim) ; c (the
normed kv latent, kv_lora_rank)], read as the keys and the values of a single KV head. Each
head's query is carried into that space ahead of attention, q_h = [q_pe_h ; q_nope_h @ W_UK_h]
(W_UK_h: head h's key rows of kv_b_proj), so that q_h . row = q_nope_h . k_nope_h + q_pe_h .
k_pe, the score of the decompressed key; the attention output's latent part goes back through
the value rows W_UV_h. The cache is (kv_lora_rank + qk_rope_head_dim) values a token instead of
heads * (qk_head_dim + v_head_dim), and no key or value is ever decompressed. kv_b_proj comes
whole (HF checkpoints, older GGUFs) or as llama.cpp's converter splits it (k_b_proj = W_UK^T,
v_b_proj = W_UV, per head); the split ones run in their own block type, as llama.cpp runs them
(on the GPU both stacks are dense, in the activation dtype, and the attention over the
576-wide rows of DeepSeek's shapes runs on cuda/attention_mla.cu's tensor-core kernel)."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.device import BF16, F16, F32
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import Linear, RowParallelLinear, take_rows
from vllmx.layers.norm import RMSNorm
from vllmx.layers.rotary import RotaryEmbedding
from vllmx.ops import Weight

_NP = {F32: np.float32, F16: np.float16, BF16: np.uint16}


def _dense(w: Weight) -> tuple[np.ndarray, int]:
    """w's values as an array of its own float dtype (block types dequantized to f32)."""
    if w.dtype in _NP:
        return np.asarray(w.data).reshape(w.shape), w.dtype
    return w.to_float32(), F32


def _up_projections(w: dict[str, Weight], p: str, nh: int, dn: int, dv: int,
                    r: int) -> tuple[Weight, Weight]:
    """(W_UK^T [nh, r, dn], W_UV [nh, dv, r]) from kv_b_proj [nh * (dn + dv), r] (head h's key
    rows W_UK_h [dn, r], then its value rows W_UV_h), or from llama.cpp's split of it: k_b_proj
    holding W_UK^T already, v_b_proj W_UV. A block type stays one where no transpose is needed,
    so that its products quantize the activations as llama.cpp's do."""
    if p + "kv_b_proj.weight" not in w:
        k_b, v_b = w[p + "k_b_proj.weight"], w[p + "v_b_proj.weight"]
        return (Weight(np.asarray(k_b.data).reshape(nh, r, -1), k_b.dtype, (nh, r, dn)),
                Weight(np.asarray(v_b.data).reshape(nh, dv, -1), v_b.dtype, (nh, dv, r)))
    kv_b = w[p + "kv_b_proj.weight"]
    rows = np.asarray(kv_b.data).reshape(nh, dn + dv, -1)
    w_uv = Weight(np.ascontiguousarray(rows[:, dn:]), kv_b.dtype, (nh, dv, r))
    dense, dt = _dense(kv_b)
    w_uk_t = dense.reshape(nh, dn + dv, r)[:, :dn].transpose(0, 2, 1)
    return Weight(np.ascontiguousarray(w_uk_t), dt, (nh, r, dn)), w_uv


class MLAAttention:
    def __init__(self, layer_idx: int, cfg: dict, w: dict[str, Weight], prefix: str,
                 rope: RotaryEmbedding, scale: float):
        nh, dn, dr = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
        dv, r, eps = cfg["v_head_dim"], cfg["kv_lora_rank"], cfg["rms_norm_eps"]
        self.nh, self.dn, self.dr, self.dv, self.r = nh, dn, dr, dv, r
        p = prefix
        self.q_a_proj = self.q_a_layernorm = None
        q_rows = p + "q_proj"
        if cfg.get("q_lora_rank"):
            self.q_a_proj = Linear(w[p + "q_a_proj.weight"], w.get(p + "q_a_proj.bias"))
            self.q_a_layernorm = RMSNorm(w[p + "q_a_layernorm.weight"], eps)
            q_rows = p + "q_b_proj"
        # Each head's query rows are [nope (dn); rope (dr)]: two projections, one per part.
        head = np.arange(nh)[:, None] * (dn + dr)
        self.q_nope_proj = Linear(take_rows(w[q_rows + ".weight"], (head + np.arange(dn)).ravel()))
        self.q_pe_proj = Linear(take_rows(w[q_rows + ".weight"],
                                          (head + dn + np.arange(dr)).ravel()))
        # kv_a_proj_with_mqa's rows are [latent (r); k_pe (dr)].
        kv_a, kv_a_bias = w[p + "kv_a_proj_with_mqa.weight"], w.get(p + "kv_a_proj_with_mqa.bias")
        self.kv_c_proj = Linear(take_rows(kv_a, np.arange(r)),
                                None if kv_a_bias is None else take_rows(kv_a_bias, np.arange(r)))
        self.k_pe_proj = Linear(take_rows(kv_a, r + np.arange(dr)), None if kv_a_bias is None
                                else take_rows(kv_a_bias, r + np.arange(dr)))
        self.kv_a_layernorm = RMSNorm(w[p + "kv_a_layernorm.weight"], eps)
        # batched_linear computes x_h @ w_h^T: the query side takes W_UK_h^T [r, dn], the output
        # side W_UV_h [dv, r] on the latent part of each head's attention output.
        self.w_uk_t, self.w_uv = _up_projections(w, p, nh, dn, dv, r)
        # On the GPU dense stacks in the activation dtype (CUDA's batched_linear: one launch for
        # a decode step's rows, each head through linear for a prefill's; a GGUF's block types
        # dequantized); unchanged on the CPU.
        self.w_uk_t = placement.upload_experts(self.w_uk_t, p + "w_uk_t")
        self.w_uv = placement.upload_experts(self.w_uv, p + "w_uv")
        self.o_proj = RowParallelLinear(w[p + "o_proj.weight"], w.get(p + "o_proj.bias"))
        self.rope = rope
        self.attn = Attention(layer_idx, nh, 1, dr + r, scale)

    def __call__(self, positions, x, md: AttentionMetadata):
        t, nh, dr, r = x.shape[0], self.nh, self.dr, self.r
        qc = x if self.q_a_proj is None else self.q_a_layernorm(self.q_a_proj(x))
        q_lat = ops.batched_linear(self.q_nope_proj(qc).reshape(t, nh, self.dn), self.w_uk_t)
        # Native copies (a recorded CPU step replays only native ops): per head [q_pe ; q_lat].
        q = ops.concat_columns([self.q_pe_proj(qc).reshape(t * nh, dr),
                                q_lat.reshape(t * nh, r)])
        kv = ops.concat_columns([self.k_pe_proj(x), self.kv_a_layernorm(self.kv_c_proj(x))])
        # One tensor is the key and the value: rope turns its k_pe part, the cache stores it once.
        o = self.attn.forward(q.reshape(t, nh * (dr + r)), kv, kv, positions, self.rope, md)
        # Each head's output row is [the weighted k_pe (meaningless) ; the weighted latent].
        _, o_lat = ops.split_columns(o.reshape(t * nh, dr + r), [dr, r])
        o = ops.batched_linear(o_lat.reshape(t, nh, r), self.w_uv)
        return self.o_proj(o.reshape(t, nh * self.dv))
