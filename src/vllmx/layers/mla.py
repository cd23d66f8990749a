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
576-wide rows of DeepSeek's shapes runs on cuda/attention_mla.cu's tensor-core kernel).

Prefill, as vLLM's MLA backends run it: for the whole prompts of a step (those without a
prefix-cache hit, or a first chunk of one; at least 64 tokens each, which the model runner puts
at the end of the batch), whose context is their own rows, the GPU decompresses the keys and
values, k_h = [k_pe ; c @ W_UK_h^T] and v_h = c @ W_UV_h^T, and attends on them as multi-head
attention over heads of the padded size prefill_head_size (qk_rope_head_dim + qk_nope_head_dim
= 192 and v_head_dim = 128 for DeepSeek: 256), on the tensor-core prefill kernels: per (query,
key) pair 2 x 256 products where the latent space takes 576 + 512, and a key tile serves 64
query rows where the latent kernel's serves one token's heads. The latent rows still go to the
cache for the decodes after; the step's other sequences (decodes, later chunks, short prompts)
attend in the latent space in the same call. AttentionMetadata.mla_block_table (the runner's,
worker/step_inputs_runner_mixin.py) marks such a step."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.device import BF16, F16, F32, DeviceArray, dtype_id
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import Linear, RowParallelLinear, take_rows
from vllmx.layers.norm import RMSNorm
from vllmx.layers.rotary import RotaryEmbedding
from vllmx.ops import Weight

_NP = {F32: np.float32, F16: np.float16, BF16: np.uint16}
_PREFILL_HEAD_SIZES = (64, 128, 256)  # the GPU's tensor-core attention's


def prefill_head_size(dn: int, dr: int, dv: int) -> int:
    """The head size of decompressed prefill: the smallest the tensor-core attention takes that
    holds [k_pe ; k_nope] and v (0: none does)."""
    return next((d for d in _PREFILL_HEAD_SIZES if d >= max(dn + dr, dv)), 0)


def _kv_b(w: dict[str, Weight], p: str, nh: int, dn: int, dv: int, r: int) -> Weight:
    """kv_b_proj [nh * (dn + dv), r] (head h's key rows, then its value rows): the checkpoint's,
    or put back together from llama.cpp's split of it (dequantized)."""
    if p + "kv_b_proj.weight" in w:
        return w[p + "kv_b_proj.weight"]
    k_b = w[p + "k_b_proj.weight"].to_float32().reshape(nh, r, dn)
    v_b = w[p + "v_b_proj.weight"].to_float32().reshape(nh, dv, r)
    rows = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(nh * (dn + dv), r)
    return Weight.from_numpy(np.ascontiguousarray(rows))


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
    # Whether prompts' prefill runs on decompressed keys and values (above); None: on the GPU
    # (Hopper, whose tensor-core attention takes head size 256; others where the padded head
    # is at most 128). The CPU attends in the latent space, as llama.cpp does (its GGUF parity);
    # tests set it to check one path against the other.
    decompress_prefill: bool | None = None

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
        self.scale = scale
        self.attn = Attention(layer_idx, nh, 1, dr + r, scale)
        self.prefill_head = prefill_head_size(dn, dr, dv)
        on = self.decompress_prefill
        if on is None:
            on = placement.current().on_gpu and (self.prefill_head <= 128 or _sm90())
        self.kv_b_proj = Linear(_kv_b(w, p, nh, dn, dv, r)) if on and self.prefill_head else None

    def __call__(self, positions, x, md: AttentionMetadata):
        t, nh, dr, r = x.shape[0], self.nh, self.dr, self.r
        qc = x if self.q_a_proj is None else self.q_a_layernorm(self.q_a_proj(x))
        if md.mla_block_table is not None and self.kv_b_proj is not None:
            return self._prefill(positions, x, qc, md)
        q = self._latent_query(self.q_nope_proj(qc), self.q_pe_proj(qc))
        kv = self._cache_rows(x)
        # One tensor is the key and the value: rope turns its k_pe part, the cache stores it once.
        o = self.attn.forward(q.reshape(t, nh * (dr + r)), kv, kv, positions, self.rope, md)
        return self.o_proj(self._latent_output(o))

    def _cache_rows(self, x):
        """The tokens' cache rows [k_pe ; the normed latent] ([t, dr + r], k_pe not yet
        rotated)."""
        return ops.concat_columns([self.k_pe_proj(x), self.kv_a_layernorm(self.kv_c_proj(x))])

    def _latent_query(self, q_nope, q_pe):
        """Per head [q_pe ; q_nope @ W_UK_h] ([t * nh, dr + r]) from q_nope [t, nh * dn] and
        q_pe [t, nh * dr]; native copies (a recorded CPU step replays only native ops)."""
        t, nh = q_nope.shape[0], self.nh
        q_lat = ops.batched_linear(q_nope.reshape(t, nh, self.dn), self.w_uk_t)
        return ops.concat_columns([q_pe.reshape(t * nh, self.dr), q_lat.reshape(t * nh, self.r)])

    def _latent_output(self, o):
        """Latent attention's output [t, nh * (dr + r)], each head's row [the weighted k_pe
        (meaningless) ; the weighted latent], through W_UV: [t, nh * dv]."""
        t, nh = o.shape[0], self.nh
        _, o_lat = ops.split_columns(o.reshape(t * nh, self.dr + self.r), [self.dr, self.r])
        return ops.batched_linear(o_lat.reshape(t, nh, self.r), self.w_uv).reshape(
            t, nh * self.dv)

    def _prefill(self, positions, x, qc, md: AttentionMetadata):
        """A step whose last sequences are whole prompts (the module's docstring): their rows,
        from md.mla_first_row on, attend on decompressed keys and values of those rows
        (md.mla_block_table: their sequence b's position i at row mla_query_start_loc[b] + i
        of them, blocks of one row); the sequences before (decodes, later chunks of prompts) in
        the latent space."""
        t, nh, dn, dr, dv, r, d = x.shape[0], self.nh, self.dn, self.dr, self.dv, self.r, \
            self.prefill_head
        t0, b0 = md.mla_first_row, md.mla_first_seq
        kv = self._cache_rows(x)
        q_pe, q_nope = self.q_pe_proj(qc), self.q_nope_proj(qc)
        cos_sin, neox = self.rope.cos_sin_cache, self.rope.is_neox_style
        ops.rotary(positions, q_pe, None, cos_sin, dr, neox)
        ops.rotary(positions, kv, None, cos_sin, dr + r, neox)  # k_pe, the first dr of the row
        key_cache, value_cache = md.kv_caches[self.attn.layer_idx]
        ops.write_kv_cache(kv, kv, key_cache, value_cache, md.slot_mapping, md.cache_dtype)
        o_v = ops.empty(x, (t, nh * dv))
        if t0 > 0:
            q = self._latent_query(q_nope[:t0], q_pe[:t0])
            o = ops.paged_attention(q.reshape(t0, nh * (dr + r)), key_cache, value_cache,
                                    md.block_table[:b0], md.query_start_loc[:b0 + 1],
                                    md.seq_lens[:b0], self.scale, md.cache_dtype)
            ops.copy_columns(o_v[:t0], 0, self._latent_output(o))
        n = t - t0
        up = self.kv_b_proj(ops.split_columns(kv[t0:], [dr, r])[1])  # [n, nh * (dn + dv)]
        # Heads of d: q [q_pe ; q_nope ; 0], k [k_pe (every head's) ; k_nope ; 0] (zeros:
        # padding whose products add nothing), v [v ; anything] (an output column reads only
        # its own column of v, and the padded ones are dropped).
        q, k, v = ops.zeros(x, (n, nh * d)), ops.zeros(x, (n, nh * d)), ops.empty(x, (n, nh * d))
        ops.copy_head_columns(q, 0, q_pe[t0:], 0, dr, nh, d, dr)
        ops.copy_head_columns(q, dr, q_nope[t0:], 0, dn, nh, d, dn)
        ops.copy_head_columns(k, 0, kv[t0:], 0, dr, nh, d, 0)
        ops.copy_head_columns(k, dr, up, 0, dn, nh, d, dn + dv)
        ops.copy_head_columns(v, 0, up, dn, dv, nh, d, dn + dv)
        # (on the host k and v are caches of x's dtype; the longest query: the table's width)
        o = ops.paged_attention(q, k.reshape(n, 1, nh, d), v.reshape(n, 1, nh, d),
                                md.mla_block_table, md.mla_query_start_loc, md.seq_lens[b0:],
                                self.scale, _dtype(x), max_query_len=md.mla_block_table.shape[1])
        ops.copy_head_columns(o_v[t0:], 0, o, 0, dv, nh, dv, d)
        return self.o_proj(o_v)


def _dtype(a) -> int:
    """a's dtype id (a DeviceArray's, or a host array's numpy dtype's)."""
    return a.dtype if isinstance(a, DeviceArray) else dtype_id(a.dtype)


def _sm90() -> bool:
    from vllmx import _C

    return bool(_C.cuda_sm90_kernels())
