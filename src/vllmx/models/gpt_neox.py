"""GPT-NeoX (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B). Against the Llama family: LayerNorms
with biases, one query_key_value projection whose rows are per head [q; k; v] (regrouped at
load into [q heads; k heads; v heads], the layout the attention prologue reads), rope over the
first rotary_pct of each head (neox style), a gelu MLP with biases, an untied embed_out, and
parallel residual by default (use_parallel_residual): attention and MLP both read the layer's
input, each through its own norm, and their outputs join the residual together. From GGUF
("gptneox"): query_key_value already regrouped by llama.cpp's converter."""

from __future__ import annotations

import numpy as np

from vllmx.distributed.parallel_state import get_tp_group
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import (
    Linear,
    ParallelLMHead,
    RowParallelLinear,
    qkv_by_group,
    vocab_parallel_embedding,
)
from vllmx.layers.mlp import GeluMLP
from vllmx.layers.norm import LayerNorm, ResidualAdd
from vllmx.layers.rotary import RotaryEmbedding, get_rope
from vllmx.models.llama import gguf_name_to_hf
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight

_LAYER_TENSORS = ("input_layernorm", "post_attention_layernorm", "attention.query_key_value",
                  "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")


class GPTNeoXLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope: RotaryEmbedding,
                 add: ResidualAdd):
        p = f"gpt_neox.layers.{i}."
        eps = cfg["layer_norm_eps"]
        nh, d = cfg["num_attention_heads"], cfg["head_dim"]

        def norm(name):
            return LayerNorm(w[p + name + ".weight"], w[p + name + ".bias"], eps)

        qkv = p + "attention.query_key_value"
        if cfg["qkv_by_head"]:
            self.query_key_value = Linear(*qkv_by_group(w[qkv + ".weight"], w.get(qkv + ".bias"),
                                                        nh, 1, d))
        else:  # a GGUF's: [q heads; k heads; v heads] already
            self.query_key_value = Linear(w[qkv + ".weight"], w.get(qkv + ".bias"))
        self.dense = RowParallelLinear(w[p + "attention.dense.weight"],
                                       w.get(p + "attention.dense.bias"))
        self.rope = rope
        self.attn = Attention(i, nh, nh, d, d ** -0.5)
        self.mlp = GeluMLP(w[p + "mlp.dense_h_to_4h.weight"], w.get(p + "mlp.dense_h_to_4h.bias"),
                           w[p + "mlp.dense_4h_to_h.weight"], w.get(p + "mlp.dense_4h_to_h.bias"),
                           cfg["hidden_act"], "GPT-NeoX")
        self.input_layernorm = norm("input_layernorm")
        self.post_attention_layernorm = norm("post_attention_layernorm")
        self.use_parallel_residual = cfg["use_parallel_residual"]
        self.add = add

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        """As the Llama layers: returns (branch output, residual stream), the branch output being
        added to the stream by the next norm."""
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        a = self.dense(self.attn.forward_qkv(self.query_key_value(x), positions, self.rope, None,
                                             None, md))
        if self.use_parallel_residual:  # h + attn(ln1(h)) + mlp(ln2(h))
            m = self.mlp(self.post_attention_layernorm(residual))
            self.add(a, residual)
            return m, residual
        x, residual = self.post_attention_layernorm(a, residual)
        return self.mlp(x), residual


class GPTNeoXForCausalLM:
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        gguf_arch = cfg.get("gguf_architecture")
        if gguf_arch is not None:
            weights = {gguf_name_to_hf(k, gguf_arch): v for k, v in weights.items()}
        cfg["qkv_by_head"] = gguf_arch is None
        nh = cfg["num_attention_heads"]
        cfg["num_key_value_heads"] = nh
        # (tensor parallelism's share keeps the whole model's head_dim, tp_shard.tp_config)
        cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // nh
        cfg.setdefault("layer_norm_eps", 1e-5)
        cfg["hidden_act"] = cfg.get("hidden_act") or "gelu"
        cfg["use_parallel_residual"] = bool(cfg.get("use_parallel_residual", True))
        # Older config.json files: rotary_pct and rotary_emb_base at the top.
        rope = dict(cfg.get("rope_parameters") or {})
        rope.setdefault("partial_rotary_factor", cfg.get("rotary_pct")
                        or cfg.get("partial_rotary_factor") or 0.25)
        rope.setdefault("rope_theta", cfg.get("rotary_emb_base") or cfg.get("rope_theta") or 10000)
        cfg["rope_parameters"] = rope
        self.config = cfg
        self._check_weights(weights)

        self.rope = get_rope(cfg, cfg["head_dim"])
        self.embed_in = placement.upload_weight(weights["gpt_neox.embed_in.weight"],
                                                "gpt_neox.embed_in.weight")
        self._add = ResidualAdd(cfg["hidden_size"])
        self.layers = [GPTNeoXLayer(i, cfg, weights, self.rope, self._add)
                       for i in range(cfg["num_hidden_layers"])]
        self.final_layer_norm = LayerNorm(weights["gpt_neox.final_layer_norm.weight"],
                                          weights["gpt_neox.final_layer_norm.bias"],
                                          cfg["layer_norm_eps"])
        # embed_out as checkpoints name it (transformers 5 loads it as lm_head); tied if asked.
        head = weights.get("embed_out.weight", weights.get("lm_head.weight"))
        self.embed_out = ParallelLMHead(self.embed_in if head is None else head,
                                        cfg.get("vocab_size"))
        self.vocab_size = self.embed_out.vocab_size
        # (under tensor parallelism: this rank's heads, and the vocabulary rows embed_out's)
        self.tp_group, self.vocab_start = get_tp_group(), self.embed_out.vocab_start

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors a Hugging Face checkpoint of this config holds (load_format="dummy")."""
        h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
        bias = cfg.get("attention_bias", True)
        shapes = {"gpt_neox.embed_in.weight": (v, h), "gpt_neox.final_layer_norm.weight": (h,),
                  "gpt_neox.final_layer_norm.bias": (h,)}
        if not cfg.get("tie_word_embeddings"):
            shapes["embed_out.weight"] = (v, h)
        for i in range(cfg["num_hidden_layers"]):
            p = f"gpt_neox.layers.{i}."
            for name, out, k, with_bias in (
                    ("attention.query_key_value", 3 * h, h, bias), ("attention.dense", h, h, bias),
                    ("mlp.dense_h_to_4h", inter, h, True), ("mlp.dense_4h_to_h", h, inter, True)):
                shapes[f"{p}{name}.weight"] = (out, k)
                if with_bias:
                    shapes[f"{p}{name}.bias"] = (out,)
            for norm in ("input_layernorm", "post_attention_layernorm"):
                shapes[f"{p}{norm}.weight"] = shapes[f"{p}{norm}.bias"] = (h,)
        return shapes

    def _check_weights(self, weights: dict[str, Weight]) -> None:
        needed = ["gpt_neox.embed_in.weight", "gpt_neox.final_layer_norm.weight",
                  "gpt_neox.final_layer_norm.bias"]
        for i in range(self.config["num_hidden_layers"]):
            needed += [f"gpt_neox.layers.{i}.{n}.weight" for n in _LAYER_TENSORS]
            needed += [f"gpt_neox.layers.{i}.{n}.bias" for n in _LAYER_TENSORS[:2]]
        if not self.config.get("tie_word_embeddings") and not (
                "embed_out.weight" in weights or "lm_head.weight" in weights):
            needed.append("embed_out.weight")
        require_tensors(weights, needed)

    def forward(self, input_ids: np.ndarray, positions: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        h = vocab_parallel_embedding(input_ids, self.embed_in, self.tp_group, self.vocab_start)
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, h, residual, md)
        h, _ = self.final_layer_norm(h, residual)
        return h

    def compute_logits(self, hidden: np.ndarray) -> np.ndarray:
        return self.embed_out(hidden)
