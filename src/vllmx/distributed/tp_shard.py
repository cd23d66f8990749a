"""One tensor-parallel rank's share of a checkpoint (vLLM's weight loaders' shard rules, in one
table for the Hugging Face and GGUF names): the model class then builds a model of fewer heads
and a narrower MLP from it, with its config's head and intermediate counts divided, and its
row-parallel layers sum the ranks' partial products (layers/linear.py RowParallelLinear,
layers/fused_moe.py).

- column-parallel (output rows cut): q by query heads; k / v by kv heads (a kv head repeated on
  several ranks where there are fewer kv heads than ranks, as vLLM does); gate / up, each
  expert's too, and their biases; MLA's q_b_proj (or q_proj) and kv_b_proj by heads (the
  latent projections, kv_a_proj_with_mqa and q_a_proj, whole: every rank writes the same
  latent rows to its cache); Gated DeltaNet's projections and convolution channels by key /
  value heads ([q; k; v] sections each cut, Qwen3-Next's per-key-head groups whole), its
  per-head A_log, dt_bias, b and a by value heads (a head's rows counted from the tensor:
  gated attention's q_proj holds [q; gate] a head);
- row-parallel (input columns cut): o_proj, down_proj, each expert's down and Gated
  DeltaNet's out_proj (a bias stays whole: rank 0 adds it once);
- vocab-parallel: the embedding's and lm_head's rows, ceil(V / tp) a rank;
- everything else (norms, routers, q/k norms) whole on every rank.

Under expert parallelism a MoE's experts are not cut: rank r holds experts [r E / tp,
(r + 1) E / tp) whole (a checkpoint's per-expert tensors read for those, a GGUF's stacked ones
cut by experts), and the router stays whole, so routing is global (layers/fused_moe.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import numpy as np

from vllmx import _C
from vllmx.distributed.parallel_state import shard_range
from vllmx.ops import Weight

# The architectures whose checkpoints these rules cover and whose layers reduce (models/llama.py
# and its MoE blocks). Others raise: their fused or extra tensors would be cut wrongly.
TP_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM",
                    "Qwen2MoeForCausalLM", "SmolLM3ForCausalLM", "GraniteForCausalLM",
                    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Qwen3NextForCausalLM",
                    "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Gemma2ForCausalLM",
                    "Gemma3ForCausalLM", "Phi3ForCausalLM", "Glm4ForCausalLM",
                    "Glm4MoeForCausalLM", "Starcoder2ForCausalLM", "CohereForCausalLM",
                    "Cohere2ForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM",
                    "Exaone4ForCausalLM", "GPTNeoXForCausalLM", "GraniteMoeForCausalLM",
                    "GraniteMoeSharedForCausalLM")
TP_GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "qwen3moe", "smollm3", "granite",
                         "gemma2", "gemma3", "starcoder2", "granitemoe")

_RULES = [  # (pattern on the tensor's name without .weight / .bias, rule)
    (r"linear_attn\.(in_proj_qkv|conv1d)$", "gdn_qkv"),  # channels [q; k; v]
    (r"linear_attn\.(in_proj_qkvz|in_proj_ba)$", "gdn_groups"),  # per key head groups
    (r"linear_attn\.(in_proj_z|in_proj_b|in_proj_a|A_log|dt_bias)$", "gdn_value_heads"),
    (r"linear_attn\.out_proj$", "row"),
    (r"self_attn\.qkv_proj$", "fused_qkv"),  # Phi-3's [q; k; v]
    (r"(mlp\.gate_up_proj|shared_mlp\.input_linear)$", "fused_gate_up"),  # [gate; up]
    (r"block_sparse_moe\.input_linear$", "stacked_gate_up"),  # GraniteMoe's [E, 2 I, H]
    (r"(block_sparse_moe|shared_mlp)\.output_linear$", "row"),
    (r"(self_attn\.q_proj|self_attn\.q_b_proj|attn_q)$", "q"),
    (r"self_attn\.q_norm$", "q_norm"),  # Cohere's [heads, head_dim] (a [head_dim] one: whole)
    (r"self_attn\.k_norm$", "k_norm"),
    (r"self_attn\.kv_b_proj$", "kv_b"),
    (r"(self_attn\.[kv]_proj|attn_[kv])$", "kv"),
    (r"((^|\.)(gate_proj|up_proj|w1|w3)|mlp\.c_fc|ffn_(gate|up)(_shexp)?)$", "column"),
    (r"ffn_(gate|up)_exps$", "column_stacked"),  # GGUF's experts [E, I, H]
    (r"((^|\.)(o_proj|down_proj|w2)|mlp\.c_proj|attn_output|ffn_down(_shexp)?|ffn_down_exps)$",
     "row"),
    (r"(^model\.embed_tokens|^lm_head|^token_embd|^output|^gpt_neox\.embed_in|^embed_out)$",
     "vocab"),
    (r"attention\.query_key_value$", "q"),  # GPT-NeoX's: [q; k; v] a head, head by head
    (r"mlp\.dense_h_to_4h$", "column"),
    (r"(attention\.dense|mlp\.dense_4h_to_h)$", "row"),
]
_RULES = [(re.compile(p), r) for p, r in _RULES]
# Per-layer names the row rule must not take: the router and Qwen2-MoE's shared-expert gate.
_WHOLE = re.compile(r"(mlp\.gate|shared_expert_gate|block_sparse_moe\.gate|ffn_gate_inp)$")


def _rule(name: str) -> str | None:
    base, _, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        base = name
    if _WHOLE.search(base):
        return None
    for pattern, rule in _RULES:
        if pattern.search(base):
            return rule if suffix != "bias" or rule != "row" else None  # a row bias: whole
    return None


def slice_weight(w: Weight, axis: int, lo: int, hi: int, name: str = "") -> Weight:
    """w's [lo, hi) along axis, copied, in w's own format (a block type's rows of blocks cut
    at block boundaries: ValueError naming the tensor where lo / hi are not on one)."""
    shape = tuple(w.shape)
    axis %= len(shape)
    _, block, type_size, quantized, _ = _C.type_info(w.dtype)
    raw = np.asarray(w.data)
    lo_i, hi_i = lo, hi
    if quantized:
        raw = raw.reshape(*shape[:-1], -1)  # rows of blocks
        if axis == len(shape) - 1:
            if lo % block or hi % block:
                raise ValueError(f"tensor parallelism: {name or 'a tensor'} {shape} cannot be "
                                 f"cut at columns {lo}..{hi}: its blocks hold {block} values")
            lo_i, hi_i = lo // block * type_size, hi // block * type_size
    else:
        raw = raw.reshape(shape)
    index = [slice(None)] * len(shape)
    index[axis] = slice(lo_i, hi_i)
    part = np.ascontiguousarray(raw[tuple(index)])
    new_shape = shape[:axis] + (hi - lo,) + shape[axis + 1:]
    if quantized:
        part = part.reshape(int(np.prod(new_shape[:-1], dtype=np.int64)), -1)
    return Weight(part, w.dtype, new_shape)


def _check_divisible(what: str, n: int, tp: int) -> None:
    if n % tp:
        raise ValueError(f"tensor_parallel_size={tp} must divide {what} ({n})")


_K_PROJ = re.compile(r"(self_attn\.k_proj|attn_k)\.weight$")
_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_PER_EXPERT = re.compile(r"experts\.\d+\.")  # a checkpoint's tensor of one expert
_STACKED_EXPERTS = re.compile(r"ffn_(gate|up|down)_exps\.")  # a GGUF's experts, stacked


def tp_config(cfg: dict, rank: int, tp: int, expert_parallel: bool = False) -> dict:
    """The config of rank's share: query / kv heads and intermediate sizes divided (kv heads
    at least 1; the experts' kept whole under expert parallelism), head_dim and the full
    vocabulary size kept."""
    archs = set(cfg.get("architectures") or [])
    arch = cfg.get("gguf_architecture")
    if not (archs & set(TP_ARCHITECTURES) or arch in TP_GGUF_ARCHITECTURES):
        raise ValueError(f"tensor / pipeline parallelism supports {', '.join(TP_ARCHITECTURES)} "
                         f"(GGUF: {', '.join(TP_GGUF_ARCHITECTURES)}) so far; this checkpoint "
                         f"is {sorted(archs) or arch}")
    out = dict(cfg)
    nq = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nq
    out["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // nq
    _check_divisible("num_attention_heads", nq, tp)
    if nkv % tp and tp % nkv:
        raise ValueError(f"tensor_parallel_size={tp} and num_key_value_heads={nkv}: one must "
                         f"divide the other")
    out["num_attention_heads"] = nq // tp
    out["num_key_value_heads"] = max(1, nkv // tp)
    for key in ("linear_num_key_heads", "linear_num_value_heads"):  # Gated DeltaNet's
        if cfg.get(key):
            _check_divisible(key, int(cfg[key]), tp)
            out[key] = int(cfg[key]) // tp
    divided = ["intermediate_size", "shared_expert_intermediate_size",
               "shared_intermediate_size"]
    if expert_parallel:
        experts = next((int(cfg[k]) for k in _EXPERT_COUNT_KEYS if cfg.get(k)), 0)
        if experts:
            _check_divisible("the number of experts", experts, tp)
    else:
        divided.append("moe_intermediate_size")
    for key in divided:
        if cfg.get(key):
            _check_divisible(key, int(cfg[key]), tp)
            out[key] = int(cfg[key]) // tp
    out["tp_rank"], out["tp_size"] = rank, tp
    return out


class ShardedWeights(Mapping):
    """rank's share of weights (a Mapping of checkpoint names), cut as each tensor is read."""

    def __init__(self, weights: Mapping, cfg: dict, rank: int, tp: int,
                 expert_parallel: bool = False):
        self._weights, self._rank, self._tp = weights, rank, tp
        self._expert_parallel = expert_parallel
        self._nq = cfg["num_attention_heads"]  # (the full counts)
        self._nkv = cfg.get("num_key_value_heads") or self._nq
        # Gated DeltaNet's key / value heads and their sizes (hybrids)
        self._hk, self._hv = cfg.get("linear_num_key_heads"), cfg.get("linear_num_value_heads")
        self._dk, self._dv = cfg.get("linear_key_head_dim"), cfg.get("linear_value_head_dim")

    def _heads(self, w: Weight, heads: int, name: str) -> Weight:
        """Rows of this rank's heads among `heads` equal runs of w's rows (a head's rows counted
        from the tensor: MLA's [nope; rope], gated attention's [q; gate])."""
        n = w.shape[0] // heads * (heads // self._tp)
        return slice_weight(w, 0, self._rank * n, (self._rank + 1) * n, name)

    def _sections(self, w: Weight, sections: list[tuple[int, int]], name: str) -> Weight:
        """This rank's rows of each (rows a head, heads) section of w's rows, in order (a
        section of fewer heads than ranks: the head of this rank's share, repeated)."""
        parts, start = [], 0
        for rows, heads in sections:
            if heads < self._tp:
                lo, n = start + self._rank * heads // self._tp * rows, rows
            else:
                n = rows * heads // self._tp
                lo = start + self._rank * n
            parts.append(np.asarray(slice_weight(w, 0, lo, lo + n, name).data))
            start += rows * heads
        data = np.concatenate(parts)
        return Weight(data, w.dtype, (data.shape[0],) + tuple(w.shape[1:]))

    def __getitem__(self, name: str) -> Weight:
        w = self._weights[name]
        if self._expert_parallel and _PER_EXPERT.search(name):
            return w  # (the model reads its own experts' tensors only)
        if self._expert_parallel and _STACKED_EXPERTS.search(name):
            count = w.shape[0] // self._tp
            return slice_weight(w, 0, self._rank * count, (self._rank + 1) * count, name)
        rule = _rule(name)
        if rule is None:
            return w
        r, tp = self._rank, self._tp
        if rule in ("q_norm", "k_norm") and len(w.shape) == 1:
            return w  # one norm for every head (Qwen3's, Gemma 3's)
        if rule in ("q", "kv_b", "q_norm"):
            return self._heads(w, self._nq, name)
        if rule in ("kv", "k_norm"):
            if self._nkv >= tp:
                return self._heads(w, self._nkv, name)
            d = w.shape[0] // self._nkv
            head = r * self._nkv // tp  # the kv head of this rank's query heads
            return slice_weight(w, 0, head * d, (head + 1) * d, name)
        if rule == "gdn_qkv":
            return self._sections(w, [(self._dk, self._hk)] * 2 + [(self._dv, self._hv)], name)
        if rule == "fused_qkv":
            d = w.shape[0] // (self._nq + 2 * self._nkv)
            return self._sections(w, [(d, self._nq), (d, self._nkv), (d, self._nkv)], name)
        if rule == "fused_gate_up":
            return self._sections(w, [(1, w.shape[0] // 2)] * 2, name)
        if rule == "stacked_gate_up":  # each expert's [gate; up] rows, half by half
            inter = w.shape[1] // 2
            n = inter // tp
            halves = [slice_weight(w, 1, h * inter + r * n, h * inter + (r + 1) * n, name)
                      for h in (0, 1)]
            data = np.concatenate([np.asarray(x.data).reshape(w.shape[0], n, -1)
                                   for x in halves], axis=1)
            return Weight(data, w.dtype, (w.shape[0], 2 * n) + tuple(w.shape[2:]))
        if rule == "gdn_groups":
            return self._heads(w, self._hk, name)
        if rule == "gdn_value_heads":
            return self._heads(w, self._hv, name)
        if rule == "vocab":
            return slice_weight(w, 0, *shard_range(w.shape[0], r, tp), name)
        # column: each output row belongs to one rank; row: each input column
        axis = {"column": -2 if len(w.shape) > 1 else 0, "column_stacked": 1, "row": -1}[rule]
        size = w.shape[axis]
        _check_divisible(f"{name}'s {size} {'rows' if rule != 'row' else 'columns'}", size, tp)
        n = size // tp
        return slice_weight(w, axis, r * n, (r + 1) * n, name)

    def __contains__(self, name: object) -> bool:
        return name in self._weights

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)


def shard_lora(module: str, lora_a: np.ndarray, lora_b: np.ndarray, rank: int, tp: int,
               num_heads: int, num_kv_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """rank's share of a LoRA adapter's matrices for one projection (A [r, in], B [out, r]),
    cut as the base projection is: a column-parallel one's B rows (q by heads, k / v by kv
    heads, repeated where there are fewer than ranks; gate / up evenly), a row-parallel one's A
    columns (its input share; the ranks' partial products are summed with the base's)."""
    def rows(a: np.ndarray, heads: int) -> np.ndarray:
        per = a.shape[0] // heads
        if heads < tp:  # the kv head of this rank's query heads
            head = rank * heads // tp
            return a[head * per:(head + 1) * per]
        n = per * (heads // tp)
        return a[rank * n:(rank + 1) * n]

    if module in ("o_proj", "down_proj"):
        n = lora_a.shape[1] // tp
        return np.ascontiguousarray(lora_a[:, rank * n:(rank + 1) * n]), lora_b
    heads = {"q_proj": num_heads, "k_proj": num_kv_heads, "v_proj": num_kv_heads}.get(module, tp)
    return lora_a, np.ascontiguousarray(rows(lora_b, heads))


def shard_checkpoint(cfg: dict, weights: Mapping, rank: int, tp: int,
                     expert_parallel: bool = False) -> tuple[dict, Mapping]:
    """(config, weights) of rank's share; ValueError where the architecture or its sizes do
    not split tp ways. (A pipeline stage's model reads its own layers' tensors only.)"""
    shapes = getattr(weights, "shapes", None)  # (DummyWeights: without making the tensors)

    def rows(name: str) -> int:
        return int(shapes[name][0] if shapes else weights[name].shape[0])

    if not cfg.get("head_dim"):  # a family's own default (Gemma's 256) read off a k projection
        k = next((n for n in weights if _K_PROJ.search(n)), None)
        if k is not None:
            cfg = {**cfg, "head_dim": rows(k) // (cfg.get("num_key_value_heads")
                                                   or cfg["num_attention_heads"])}
    local = tp_config(cfg, rank, tp, expert_parallel)
    if tp == 1:
        return local, weights
    embed = next((n for n in ("model.embed_tokens.weight", "token_embd.weight",
                              "gpt_neox.embed_in.weight")
                  if n in weights), None)
    if embed is not None:  # the full vocabulary: what lm_head's gathered logits span
        local["vocab_size"] = rows(embed)
    return local, ShardedWeights(weights, cfg, rank, tp, expert_parallel)
