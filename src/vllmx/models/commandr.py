"""Cohere Command R (CohereForCausalLM) and Cohere 2 (Cohere2ForCausalLM: Command R7B, Command A);
vLLM's commandr.py. Against the Llama family: LayerNorms without bias, attention and the SwiGLU MLP
in parallel (both read the one input_layernorm's output and join the residual together),
interleaved (GPT-J style) rope, optional q/k LayerNorms per head (use_qk_norm, each head its own
weight), logits multiplied by logit_scale, tied embeddings. Cohere 2 interleaves sliding-window
layers with full-attention ones that have no rope (NoPE). GGUF ("command-r", "cohere2"): the
Llama names; q/k norms when the file has them, as llama.cpp decides; cohere2's every 4th layer
full (llama.cpp's fixed pattern: its GGUFs carry none)."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.distributed.parallel_state import get_tp_group
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import MergedLinear, ParallelLMHead, RowParallelLinear
from vllmx.layers.norm import LayerNorm, ResidualAdd
from vllmx.layers.rotary import RotaryEmbedding, get_rope
from vllmx.models.decoder import DecoderLM
from vllmx.models.gemma3 import layer_types
from vllmx.models.llama import gguf_name_to_hf
from vllmx.models.shapes import decoder_shapes, require_tensors
from vllmx.ops import Weight

_LAYER_TENSORS = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                  "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class CohereDecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope: RotaryEmbedding,
                 add: ResidualAdd, sliding_window: int = 0):
        p = f"model.layers.{i}."
        eps = cfg["layer_norm_eps"]
        nq, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.qkv_sizes = [nq * d, nkv * d, nkv * d]
        qkv = [p + f"self_attn.{n}_proj" for n in "qkv"]
        self.qkv_proj = MergedLinear([w[n + ".weight"] for n in qkv],
                                     [w.get(n + ".bias") for n in qkv])
        self.o_proj = RowParallelLinear(w[p + "self_attn.o_proj.weight"],
                                        w.get(p + "self_attn.o_proj.bias"))
        self.q_norm = self.k_norm = None
        if cfg["use_qk_norm"]:  # weights [heads, head_dim]: one LayerNorm per head
            self.q_norm = LayerNorm(w[p + "self_attn.q_norm.weight"], None, eps)
            self.k_norm = LayerNorm(w[p + "self_attn.k_norm.weight"], None, eps)
        self.rope = rope
        self.attn = Attention(i, nq, nkv, d, d ** -0.5, sliding_window)
        self.gate_up_proj = MergedLinear([w[p + "mlp.gate_proj.weight"],
                                          w[p + "mlp.up_proj.weight"]], [None, None])
        self.down_proj = RowParallelLinear(w[p + "mlp.down_proj.weight"])
        self.input_layernorm = LayerNorm(w[p + "input_layernorm.weight"], None, eps)
        self.add = add

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        """h + attn(ln(h)) + mlp(ln(h)), as the Llama layers: returns (MLP output, residual
        stream with the attention output added), the MLP output being added by the next norm."""
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        qkv = self.qkv_proj(x)
        if self.q_norm is not None:  # per-head LayerNorms, then rope
            q, k, v = ops.split_columns(qkv, self.qkv_sizes)
            a = self.attn.forward(self.q_norm(q), self.k_norm(k), v, positions, self.rope, md)
        else:
            a = self.attn.forward_qkv(qkv, positions, self.rope, None, None, md)
        a = self.o_proj(a)
        m = self.down_proj(self.gate_up_proj.act_and_mul(x, "silu"))
        self.add(a, residual)
        return m, residual


class CohereForCausalLM(DecoderLM):
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        if cfg.get("gguf_architecture") is not None:
            weights = {gguf_name_to_hf(k, cfg["gguf_architecture"]): v for k, v in weights.items()}
            cfg["use_qk_norm"] = "model.layers.0.self_attn.q_norm.weight" in weights
        cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        cfg["layer_norm_eps"] = cfg.get("layer_norm_eps") or 1e-5
        cfg["use_qk_norm"] = bool(cfg.get("use_qk_norm"))
        act = cfg.get("hidden_act") or "silu"
        if act != "silu":
            raise ValueError(f"Cohere with hidden_act {act!r} is not supported")
        self.config = cfg
        self._check_weights(weights)

        self.rope = get_rope(cfg, cfg["head_dim"], is_neox_style=False)
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight")
        self._add = ResidualAdd(cfg["hidden_size"])
        self.layers = [CohereDecoderLayer(i, cfg, weights, rope, self._add, window)
                       for i, (rope, window) in enumerate(self.layer_attention(cfg))]
        self.norm = LayerNorm(weights["model.norm.weight"], None, cfg["layer_norm_eps"])
        self.lm_head = ParallelLMHead(weights.get("lm_head.weight", self.embed_tokens),
                                      cfg.get("vocab_size"))
        self.vocab_size = self.lm_head.vocab_size
        self.tp_group = get_tp_group()  # (under tensor parallelism: this rank's heads, rows)
        self.vocab_start = self.lm_head.vocab_start  # (embed_tokens holds the same rows)
        self.logit_scale = float(cfg.get("logit_scale") or 1.0)

    def layer_attention(self, cfg: dict) -> list[tuple[RotaryEmbedding, int]]:
        """(rope, sliding window) per layer: Command R's one rope everywhere, no window."""
        return [(self.rope, 0)] * cfg["num_hidden_layers"]

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors a Hugging Face checkpoint of this config holds (load_format="dummy"): one
        norm a layer, q/k norms [heads, head_dim] with use_qk_norm."""
        shapes = decoder_shapes(cfg, ("input_layernorm",), qk_norm=False,
                                qkv_bias=bool(cfg.get("attention_bias")),
                                o_bias=bool(cfg.get("attention_bias")),
                                tied=bool(cfg.get("tie_word_embeddings", True)))
        nq = cfg["num_attention_heads"]
        nkv = cfg.get("num_key_value_heads") or nq
        d = cfg.get("head_dim") or cfg["hidden_size"] // nq
        if cfg.get("use_qk_norm"):
            for i in range(cfg["num_hidden_layers"]):
                shapes[f"model.layers.{i}.self_attn.q_norm.weight"] = (nq, d)
                shapes[f"model.layers.{i}.self_attn.k_norm.weight"] = (nkv, d)
        return shapes

    def _check_weights(self, weights: dict[str, Weight]) -> None:
        needed = ["model.embed_tokens.weight", "model.norm.weight"]
        names = _LAYER_TENSORS + (("self_attn.q_norm", "self_attn.k_norm")
                                  if self.config["use_qk_norm"] else ())
        for i in range(self.config["num_hidden_layers"]):
            needed += [f"model.layers.{i}.{n}.weight" for n in names]
        require_tensors(weights, needed)

    def compute_logits(self, hidden: np.ndarray) -> np.ndarray:
        logits = self.lm_head(hidden)
        if self.logit_scale != 1.0:
            ops.scale_(logits, self.logit_scale)
        return logits


class Cohere2ForCausalLM(CohereForCausalLM):
    """Cohere's layers (no q/k norms) in two kinds, per config.json's layer_types (older configs:
    every sliding_window_pattern-th layer full, 4 by default, as transformers reads them):
    sliding-window layers with rope, and full-attention layers without positions (NoPE)."""

    def layer_attention(self, cfg: dict) -> list[tuple[RotaryEmbedding, int]]:
        types = layer_types(cfg, default_pattern=4)
        if len(types) != cfg["num_hidden_layers"]:
            raise ValueError(f"Cohere 2: layer_types has {len(types)} entries for "
                             f"{cfg['num_hidden_layers']} layers")
        window = int(cfg.get("sliding_window") or 0)
        nope = self.rope.identity()
        # transformers rotates q and k only in layers with a window (in none without one).
        return [(self.rope, window) if t == "sliding_attention" and window else (nope, 0)
                for t in types]
