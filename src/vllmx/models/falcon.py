"""Falcon (FalconForCausalLM: Falcon-7B / 40B / 180B, Falcon2-11B; vLLM's falcon.py). Against
GPT-NeoX: one fused query_key_value laid out in kv groups, each [its q heads; its k head; its v
head], regrouped at load into [q heads; k heads; v heads]: num_kv_heads groups with
new_decoder_architecture (Falcon-40B), one with multi_query (Falcon-7B), else one a head (GPT-NeoX's
layout). Rope over whole heads (neox style), LayerNorms with bias, projections with bias when
`bias`, a gelu MLP, tied lm_head. Attention and MLP run in parallel (parallel_attn; always with
new_decoder_architecture), through two norms (ln_attn, ln_mlp) where num_ln_in_parallel_attn is 2
(the new architecture's default), else both through input_layernorm; without parallel_attn they
run one after the other (input_layernorm, post_attention_layernorm). ALiBi Falcons (alibi=True:
Falcon-RW) are refused: the attention op has no position bias. GGUF ("falcon"): query_key_value
already regrouped by llama.cpp's converter, attn_norm_2 the attention's norm when present; parallel
always."""

from __future__ import annotations

import numpy as np

from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import Linear, LMHeadLinear, qkv_by_group, vocab_parallel_embedding
from vllmx.layers.mlp import GELU_APPROXIMATE, GeluMLP
from vllmx.layers.norm import LayerNorm, ResidualAdd
from vllmx.layers.rotary import RotaryEmbedding, get_rope
from vllmx.models.llama import gguf_name_to_hf
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight

_LAYER_TENSORS = ("self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
                  "mlp.dense_4h_to_h")


def norm_names(cfg: dict) -> tuple[str, str | None]:
    """(the attention's norm, the MLP's norm or None where the MLP reads the attention's), as
    transformers' FalconDecoderLayer picks them."""
    if cfg.get("new_decoder_architecture"):
        two = (cfg.get("num_ln_in_parallel_attn") or 2) == 2
        return ("ln_attn", "ln_mlp") if two else ("input_layernorm", None)
    if cfg.get("parallel_attn", True):
        return "input_layernorm", None
    return "input_layernorm", "post_attention_layernorm"


def qkv_groups(cfg: dict) -> tuple[int, int]:
    """(kv heads, q heads per kv head) of a Hugging Face checkpoint's query_key_value."""
    nh = cfg["num_attention_heads"]
    if cfg.get("new_decoder_architecture"):
        nkv = cfg.get("num_kv_heads") or nh
    else:  # transformers ignores num_kv_heads here: one shared kv head, or one per q head
        nkv = 1 if cfg.get("multi_query", True) else nh
    return nkv, nh // nkv


class FalconDecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope: RotaryEmbedding,
                 add: ResidualAdd):
        p = f"transformer.h.{i}."
        eps = cfg["layer_norm_epsilon"]
        nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

        def norm(name):
            return LayerNorm(w[p + name + ".weight"], w[p + name + ".bias"], eps)

        qkv = p + "self_attention.query_key_value"
        weight, bias = w[qkv + ".weight"], w.get(qkv + ".bias")
        if cfg["qkv_by_group"]:  # a GGUF's is [q heads; k heads; v heads] already
            weight, bias = qkv_by_group(weight, bias, nkv, nh // nkv, d)
        self.query_key_value = Linear(weight, bias)
        self.dense = Linear(w[p + "self_attention.dense.weight"],
                            w.get(p + "self_attention.dense.bias"))
        self.rope = rope
        self.attn = Attention(i, nh, nkv, d, d ** -0.5)
        self.mlp = GeluMLP(w[p + "mlp.dense_h_to_4h.weight"], w.get(p + "mlp.dense_h_to_4h.bias"),
                           w[p + "mlp.dense_4h_to_h.weight"], w.get(p + "mlp.dense_4h_to_h.bias"),
                           cfg["activation"], "Falcon")
        attn_norm, mlp_norm = norm_names(cfg)
        self.attn_norm = norm(attn_norm)
        self.mlp_norm = None if mlp_norm is None else norm(mlp_norm)
        self.parallel = cfg["parallel"]
        self.add = add

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        """As the Llama layers: returns (branch output, residual stream), the branch output being
        added to the stream by the next norm."""
        if residual is None:
            residual, x = h, self.attn_norm(h)
        else:
            x, residual = self.attn_norm(h, residual)
        a = self.dense(self.attn.forward_qkv(self.query_key_value(x), positions, self.rope, None,
                                             None, md))
        if not self.parallel:  # h' = h + attn(ln1(h)); h' + mlp(ln2(h'))
            x, residual = self.mlp_norm(a, residual)
            return self.mlp(x), residual
        # h + attn(ln_attn(h)) + mlp(ln_mlp(h)), or one norm for both
        m = self.mlp(x if self.mlp_norm is None else self.mlp_norm(residual))
        self.add(a, residual)
        return m, residual


class FalconForCausalLM:
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        gguf_arch = cfg.get("gguf_architecture")
        if gguf_arch is not None:
            weights = self._from_gguf(cfg, weights, gguf_arch)
        if cfg.get("alibi"):
            raise ValueError("Falcon with alibi=True (ALiBi position biases, e.g. Falcon-RW) is "
                             "not supported: vllmx's attention has no ALiBi bias; only rotary "
                             "Falcons run")
        nh = cfg["num_attention_heads"]
        cfg["head_dim"] = cfg["hidden_size"] // nh
        cfg["qkv_by_group"] = gguf_arch is None
        if gguf_arch is None:
            cfg["num_key_value_heads"] = qkv_groups(cfg)[0]
        cfg["parallel"] = bool(cfg.get("new_decoder_architecture")
                               or cfg.get("parallel_attn", True))
        cfg["layer_norm_epsilon"] = cfg.get("layer_norm_epsilon") or 1e-5
        cfg["activation"] = cfg.get("activation") or "gelu"
        if cfg["activation"] not in GELU_APPROXIMATE:
            raise ValueError(f"Falcon with activation {cfg['activation']!r} is not supported "
                             f"(supported: {', '.join(sorted(GELU_APPROXIMATE))})")
        self.config = cfg
        self._check_weights(weights)

        self.rope = get_rope(cfg, cfg["head_dim"])
        self.word_embeddings = placement.upload_weight(
            weights["transformer.word_embeddings.weight"], "transformer.word_embeddings.weight")
        self._add = ResidualAdd(cfg["hidden_size"])
        self.layers = [FalconDecoderLayer(i, cfg, weights, self.rope, self._add)
                       for i in range(cfg["num_hidden_layers"])]
        self.ln_f = LayerNorm(weights["transformer.ln_f.weight"], weights["transformer.ln_f.bias"],
                              cfg["layer_norm_epsilon"])
        self.lm_head = LMHeadLinear(weights.get("lm_head.weight", self.word_embeddings))
        self.vocab_size = self.lm_head.weight.shape[0]

    @staticmethod
    def _from_gguf(cfg: dict, weights: dict[str, Weight], arch: str) -> dict[str, Weight]:
        """HF names for a GGUF's tensors, and the switches its tensors say: llama.cpp's attn_norm
        is ln_mlp where the file has attn_norm_2 (ln_attn: Falcon-40B's two norms), else the one
        input_layernorm; attention and MLP always in parallel."""
        weights = {gguf_name_to_hf(k, arch): v for k, v in weights.items()}
        two = "transformer.h.0.ln_attn.weight" in weights
        if two:
            weights = {k.replace(".input_layernorm.", ".ln_mlp."): v for k, v in weights.items()}
        cfg.update(new_decoder_architecture=two, num_ln_in_parallel_attn=2 if two else 1,
                   parallel_attn=True)
        return weights

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors a Hugging Face checkpoint of this config holds (load_format="dummy"):
        query_key_value's rows (q heads + 2 per kv group), biases with `bias`, each norm's."""
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        ffn = cfg.get("ffn_hidden_size") or 4 * h
        nkv, q_per_kv = qkv_groups(cfg)
        d = h // cfg["num_attention_heads"]
        shapes = {"transformer.word_embeddings.weight": (v, h),
                  "transformer.ln_f.weight": (h,), "transformer.ln_f.bias": (h,)}
        if not cfg.get("tie_word_embeddings", True):
            shapes["lm_head.weight"] = (v, h)
        for i in range(cfg["num_hidden_layers"]):
            p = f"transformer.h.{i}."
            for name, out, k in (("self_attention.query_key_value", nkv * (q_per_kv + 2) * d, h),
                                 ("self_attention.dense", h, h), ("mlp.dense_h_to_4h", ffn, h),
                                 ("mlp.dense_4h_to_h", h, ffn)):
                shapes[f"{p}{name}.weight"] = (out, k)
                if cfg.get("bias"):
                    shapes[f"{p}{name}.bias"] = (out,)
            for norm in norm_names(cfg):
                if norm is not None:
                    shapes[f"{p}{norm}.weight"] = shapes[f"{p}{norm}.bias"] = (h,)
        return shapes

    def _check_weights(self, weights: dict[str, Weight]) -> None:
        needed = ["transformer.word_embeddings.weight", "transformer.ln_f.weight",
                  "transformer.ln_f.bias"]
        norms = [n for n in norm_names(self.config) if n is not None]
        for i in range(self.config["num_hidden_layers"]):
            p = f"transformer.h.{i}."
            needed += [f"{p}{n}.weight" for n in _LAYER_TENSORS]
            needed += [f"{p}{n}.{s}" for n in norms for s in ("weight", "bias")]
        require_tensors(weights, needed)

    def forward(self, input_ids: np.ndarray, positions: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        h = vocab_parallel_embedding(input_ids, self.word_embeddings)
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, h, residual, md)
        h, _ = self.ln_f(h, residual)
        return h

    def compute_logits(self, hidden: np.ndarray) -> np.ndarray:
        return self.lm_head(hidden)
