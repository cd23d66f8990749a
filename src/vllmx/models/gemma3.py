"""Gemma 2 and Gemma 3 text models (Gemma2ForCausalLM, Gemma3ForCausalLM; GGUF "gemma2",
"gemma3"). Against the Llama family: GeGLU (tanh GELU), RMSNorm as x * (1 + w) (the +1 folded
into the weight at load; llama.cpp's GGUF already holds w + 1), sandwich norms around attention
and MLP, attention scale query_pre_attn_scalar**-0.5, interleaved sliding-window and
full-attention layers, embeddings scaled by sqrt(hidden_size), optional final logit soft cap.
Gemma 3 adds per-head q/k norm and a rope base of its own on sliding layers; Gemma 2 has
neither, one rope for every layer, and soft-caps the attention logits."""

from __future__ import annotations

import math

import numpy as np

from vllmx import ops
from vllmx.distributed.parallel_state import get_tp_group
from vllmx.layers import placement
from vllmx.layers.attention import Attention, AttentionMetadata
from vllmx.layers.linear import (
    MergedLinear,
    ParallelLMHead,
    RowParallelLinear,
    vocab_parallel_embedding,
)
from vllmx.layers.norm import RMSNorm
from vllmx.layers.rotary import RotaryEmbedding
from vllmx.models.shapes import decoder_shapes, require_tensors
from vllmx.ops import Weight

# GGUF tensor names → HF names (per layer names use {i}); llama.cpp's gemma3 names.
GGUF_TO_HF = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_norm",
    "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_norm",
    "blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
    "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
}
_LAYER_TENSORS = (
    "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
    "post_feedforward_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
    "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
    "mlp.down_proj")
# llama.cpp hard-codes these (its GGUFs carry neither): every 6th layer is global in gemma3,
# every 2nd in gemma2; gemma3's sliding layers use rope base 10000 without scaling.
_GGUF_SLIDING_WINDOW_PATTERN = {"gemma2": 2, "gemma3": 6}
# Gemma 2's defaults where a GGUF has no soft-capping keys (llama.cpp's too).
_GEMMA2_ATTN_SOFTCAP, _GEMMA2_FINAL_SOFTCAP = 50.0, 30.0
_LOCAL_ROPE_THETA = 10000.0


def gguf_name_to_hf(name: str) -> str:
    base, _, suffix = name.rpartition(".")
    parts = base.split(".")
    key, i = ("blk.{i}." + ".".join(parts[2:]), parts[1]) if parts[0] == "blk" else (base, "")
    return GGUF_TO_HF[key].format(i=i) + "." + suffix if key in GGUF_TO_HF else name


def layer_types(cfg: dict, default_pattern: int) -> list[str]:
    """"sliding_attention" / "full_attention" per layer: config.json's layer_types, else the
    older sliding_window_pattern (every pattern-th layer is global; Gemma's and Cohere 2's
    rule), default_pattern where the config has neither."""
    n = cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    pattern = (cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern")
               or default_pattern)
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]


def rope_parameters(cfg: dict, gemma2: bool = False) -> dict[str, dict]:
    """Rope theta and scaling per layer type, from transformers 5's per-type rope_parameters or
    the older rope_theta / rope_local_base_freq / rope_scaling (global layers only). Gemma 2's
    one rope serves both types."""
    params = cfg.get("rope_parameters") or {}
    if gemma2:
        full = {**(cfg.get("rope_scaling") or {}), **params}
        full["rope_theta"] = cfg.get("rope_theta") or params.get("rope_theta") or 1e4
        return {"full_attention": full, "sliding_attention": full}
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {})
        sliding = dict(params.get("sliding_attention") or {})
    else:
        full = dict(cfg.get("rope_scaling") or {})
        full["rope_theta"] = cfg.get("rope_theta") or params.get("rope_theta") or 1e6
        sliding = {"rope_theta": cfg.get("rope_local_base_freq") or _LOCAL_ROPE_THETA}
    full.setdefault("rope_theta", 1e6)
    sliding.setdefault("rope_theta", _LOCAL_ROPE_THETA)
    return {"full_attention": full, "sliding_attention": sliding}


def _rope(head_dim: int, max_position: int, params: dict,
          num_positions: int | None = None) -> RotaryEmbedding:
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return RotaryEmbedding(head_dim, head_dim, max_position, float(params["rope_theta"]),
                           True, scaling, num_positions=num_positions)


def gemma_rms_norm(weight: Weight, eps: float, offset: float) -> RMSNorm:
    """Gemma's x * (1 + w) as a plain RMSNorm over w + offset (exact in f32)."""
    w = weight.to_float32().astype(np.float32) + np.float32(offset)
    return RMSNorm(Weight.from_numpy(w), eps)


class Gemma3DecoderLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight], rope: RotaryEmbedding,
                 sliding_window: int):
        p = f"model.layers.{i}."
        eps, off = cfg["rms_norm_eps"], cfg["norm_offset"]
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg["num_key_value_heads"]
        self.head_dim = cfg["head_dim"]

        def norm(name):
            return gemma_rms_norm(w[p + name + ".weight"], eps, off)

        qkv = [p + f"self_attn.{n}_proj" for n in "qkv"]
        self.qkv_proj = MergedLinear([w[n + ".weight"] for n in qkv],
                                     [w.get(n + ".bias") for n in qkv])
        self.o_proj = RowParallelLinear(w[p + "self_attn.o_proj.weight"],
                                        w.get(p + "self_attn.o_proj.bias"))
        self.q_norm = self.k_norm = None
        if p + "self_attn.q_norm.weight" in w:  # Gemma 3
            self.q_norm, self.k_norm = norm("self_attn.q_norm"), norm("self_attn.k_norm")
        self.rope = rope
        self.attn = Attention(i, self.num_heads, self.num_kv_heads, self.head_dim,
                              cfg["query_pre_attn_scalar"] ** -0.5, sliding_window,
                              cfg["attn_logit_softcapping"])
        self.gate_up_proj = MergedLinear([w[p + "mlp.gate_proj.weight"],
                                          w[p + "mlp.up_proj.weight"]], [None, None])
        self.down_proj = RowParallelLinear(w[p + "mlp.down_proj.weight"])
        self.input_layernorm = norm("input_layernorm")
        self.post_attention_layernorm = norm("post_attention_layernorm")
        self.pre_feedforward_layernorm = norm("pre_feedforward_layernorm")
        self.post_feedforward_layernorm = norm("post_feedforward_layernorm")

    def self_attn(self, positions, h, md: AttentionMetadata):
        return self.o_proj(self.attn.forward_qkv(self.qkv_proj(h), positions, self.rope,
                                                 self.q_norm, self.k_norm, md))

    def __call__(self, positions, h, residual, md: AttentionMetadata):
        # Sandwich norms; each residual add is fused into the norm that follows it.
        if residual is None:
            residual = h
            h = self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.post_attention_layernorm(self.self_attn(positions, h, md))
        h, residual = self.pre_feedforward_layernorm(h, residual)
        h = self.gate_up_proj.act_and_mul(h, "gelu_tanh")
        h = self.post_feedforward_layernorm(self.down_proj(h))
        return h, residual


class Gemma3ForCausalLM:
    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        is_gguf = "gguf_architecture" in cfg
        gemma2 = ("Gemma2ForCausalLM" in (cfg.get("architectures") or [])
                  or cfg.get("gguf_architecture") == "gemma2")
        if is_gguf:
            weights = {gguf_name_to_hf(k): v for k, v in weights.items()}
        cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        cfg["head_dim"] = cfg.get("head_dim") or 256
        cfg.setdefault("rms_norm_eps", 1e-6)
        cfg["norm_offset"] = 0.0 if is_gguf else 1.0
        if not cfg.get("query_pre_attn_scalar"):
            # GGUF has no key for it; llama.cpp uses hidden / heads for the 27Bs (Gemma 2: 46
            # layers, Gemma 3: 62).
            big = cfg["num_hidden_layers"] == (46 if gemma2 else 62)
            cfg["query_pre_attn_scalar"] = (cfg["hidden_size"] // cfg["num_attention_heads"]
                                            if big else cfg["head_dim"])
        if not gemma2:
            # transformers' Gemma3Attention never applies attn_logit_softcapping, and llama.cpp's
            # converter rejects Gemma 3 checkpoints that set it.
            cfg["attn_logit_softcapping"] = None
        elif is_gguf:
            for key, default in (("attn_logit_softcapping", _GEMMA2_ATTN_SOFTCAP),
                                 ("final_logit_softcapping", _GEMMA2_FINAL_SOFTCAP)):
                if cfg.get(key) is None:
                    cfg[key] = default
            cfg["sliding_window"] = cfg.get("sliding_window") or 4096  # llama.cpp's default
        cfg["attn_logit_softcapping"] = float(cfg.get("attn_logit_softcapping") or 0.0)
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"Gemma {2 if gemma2 else 3} with hidden_activation {act!r} is not "
                             f"supported")
        if cfg.get("use_bidirectional_attention"):
            raise ValueError("Gemma with use_bidirectional_attention is not supported (vllmx "
                             "runs causal decoders only)")
        cfg["layer_types"] = layer_types(
            cfg, _GGUF_SLIDING_WINDOW_PATTERN["gemma2" if gemma2 else "gemma3"])
        self.gemma2 = gemma2
        self.config = cfg
        self._check_weights(weights)

        max_pos = int(cfg.get("max_position_embeddings") or 2048)
        ropes = {t: _rope(cfg["head_dim"], max_pos, p, cfg.get("max_model_len"))
                 for t, p in rope_parameters(cfg, gemma2).items()}
        window = int(cfg.get("sliding_window") or 0)
        self.embed_tokens = placement.upload_weight(weights["model.embed_tokens.weight"],
                                                    "model.embed_tokens.weight")
        # transformers multiplies by sqrt(hidden) cast to the activation dtype (f32 here).
        self.embed_scale = np.float32(math.sqrt(cfg["hidden_size"]))
        self.layers = [
            Gemma3DecoderLayer(i, cfg, weights, ropes[t], window if t == "sliding_attention" else 0)
            for i, t in enumerate(cfg["layer_types"])]
        self.norm = gemma_rms_norm(weights["model.norm.weight"], cfg["rms_norm_eps"],
                                   cfg["norm_offset"])
        self.lm_head = ParallelLMHead(weights.get("lm_head.weight", self.embed_tokens),
                                      cfg.get("vocab_size"))
        self.vocab_size = self.lm_head.vocab_size
        # Tensor parallelism: this rank's heads and vocabulary rows (distributed/tp_shard.py)
        self.tp_group, self.vocab_start = get_tp_group(), self.lm_head.vocab_start
        self.final_logit_softcapping = float(cfg.get("final_logit_softcapping") or 0.0)

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors a Hugging Face checkpoint of this config holds (load_format="dummy")."""
        cfg = {**cfg, "head_dim": cfg.get("head_dim") or 256}
        return decoder_shapes(
            cfg, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"),
            qk_norm="Gemma2ForCausalLM" not in (cfg.get("architectures") or []), qkv_bias=bool(cfg.get("attention_bias")),
            o_bias=bool(cfg.get("attention_bias")),
            tied=bool(cfg.get("tie_word_embeddings", True)))

    def _check_weights(self, weights: dict[str, Weight]) -> None:
        needed = ["model.embed_tokens.weight", "model.norm.weight"]
        for i in range(self.config["num_hidden_layers"]):
            needed += [f"model.layers.{i}.{n}.weight" for n in _LAYER_TENSORS
                       if not (self.gemma2 and n.endswith(("q_norm", "k_norm")))]
        require_tensors(weights, needed)
        if len(self.config["layer_types"]) != self.config["num_hidden_layers"]:
            raise ValueError(f"layer_types has {len(self.config['layer_types'])} entries for "
                             f"{self.config['num_hidden_layers']} layers")

    def forward(self, input_ids: np.ndarray, positions: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        h = vocab_parallel_embedding(input_ids, self.embed_tokens, self.tp_group,
                                     self.vocab_start)
        ops.scale_(h, self.embed_scale)
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, h, residual, md)
        h, _ = self.norm(h, residual)
        return h

    def compute_logits(self, hidden: np.ndarray) -> np.ndarray:
        logits = self.lm_head(hidden)
        if self.final_logit_softcapping > 0:
            ops.softcap(logits, self.final_logit_softcapping)
        return logits
