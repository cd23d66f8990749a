"""EAGLE-1/2 draft heads for Llama-shaped targets (vLLM's EagleLlamaForCausalLM), the drafter
of speculative method eagle (spec_decode/eagle.py). The checkpoint (e.g.
yuhuili/EAGLE-LLaMA3-Instruct-8B) holds fc [H, 2H] (a bias in some) and Llama decoder layers
(layers.{j}.*, the first without input_layernorm); embed_tokens and lm_head only where the
draft has its own, else the target's are used.

At position p it reads the target's hidden state there (the final-normed one lm_head reads) and
the embedding of token p + 1; its output, read by the lm_head directly (no final norm), proposes
token p + 2:
    x = fc([embed(token p + 1); hidden p])
    out = layers(x) (the residual stream: x + attention + MLP, per layer)
A further draft chains on `out` in place of the target's hidden state. HASS checkpoints
(add_para_norm) norm the embedding and the hidden state before fc. Draft layer j attends over
the KV layer num_hidden_layers(target) + j in the target's blocks."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers import placement
from vllmx.layers.attention import AttentionMetadata
from vllmx.layers.linear import Linear, vocab_parallel_embedding
from vllmx.layers.norm import ResidualAdd, RMSNorm
from vllmx.layers.rotary import RotaryEmbedding
from vllmx.models.draft_head import DraftHead
from vllmx.models.llama import LlamaDecoderLayer, rope_config
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight


def draft_weights(weights: dict[str, Weight], first_layer: int) -> dict[str, Weight]:
    """The draft's tensors by one naming: no "model." prefix, EAGLE-3's midlayer as layer 0,
    and layer j as model.layers.{first_layer + j} (the name LlamaDecoderLayer reads, its KV
    layer's index)."""
    out = {}
    for name, w in weights.items():
        name = name.removeprefix("model.").replace("midlayer.", "layers.0.", 1)
        if name.startswith("layers."):
            j, rest = name[len("layers."):].split(".", 1)
            name = f"model.layers.{first_layer + int(j)}.{rest}"
        out[name] = w
    return out


def draft_layers(cfg: dict, w: dict[str, Weight], first_layer: int,
                 max_model_len: int) -> list[LlamaDecoderLayer]:
    """The draft's decoder layers (full attention, its own rope from its config), dense
    SwiGLU MLPs."""
    cfg = dict(cfg)
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg["num_key_value_heads"] = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    cfg.setdefault("rms_norm_eps", 1e-6)
    cfg["attn_scale"], cfg["residual_multiplier"] = cfg["head_dim"] ** -0.5, 1.0
    n = cfg["num_hidden_layers"]
    require_tensors(w, [f"model.layers.{first_layer + j}.{t}.weight" for j in range(n) for t in (
        "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")])
    theta, scaling = rope_config(cfg)
    rope = RotaryEmbedding(cfg["head_dim"], cfg["head_dim"],
                           int(cfg.get("max_position_embeddings") or 2048), theta, True, scaling,
                           num_positions=max_model_len)
    return [LlamaDecoderLayer(first_layer + j, cfg, w, rope, 0) for j in range(n)]


def own_or_target(w: dict[str, Weight], target):
    """(embed_tokens, lm_head): the draft's own where its checkpoint has them, else the
    target's (vLLM shares them)."""
    embed = w.get("embed_tokens.weight")
    embed = (target.embed_tokens if embed is None
             else placement.upload_weight(embed, "embed_tokens.weight"))
    head = w.get("lm_head.weight")
    return embed, (target.lm_head if head is None else Linear(head))


class EagleLlamaForCausalLM(DraftHead):
    def __init__(self, cfg: dict, weights: dict[str, Weight], target, max_model_len: int):
        first = target.config["num_hidden_layers"]
        w = draft_weights(weights, first)
        require_tensors(w, ["fc.weight"])
        self.layers = draft_layers(cfg, w, first, max_model_len)
        self.fc = Linear(w["fc.weight"], w.get("fc.bias"))
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.embedding_layernorm = self.hidden_states_layernorm = None
        if cfg.get("add_para_norm"):  # HASS
            require_tensors(w, ["embedding_layernorm.weight", "hidden_states_layernorm.weight"])
            self.embedding_layernorm = RMSNorm(w["embedding_layernorm.weight"], eps)
            self.hidden_states_layernorm = RMSNorm(w["hidden_states_layernorm.weight"], eps)
        self.embed_tokens, self.lm_head = own_or_target(w, target)
        self.vocab_size = self.lm_head.weight.shape[0]
        self._add = ResidualAdd(cfg["hidden_size"])

    def forward(self, input_ids: np.ndarray, positions: np.ndarray, hidden: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        """Rows of the draft's output (its residual stream after the last layer) for the tokens
        after each position (input_ids) and the hidden state at it."""
        e = vocab_parallel_embedding(input_ids, self.embed_tokens)
        if self.embedding_layernorm is not None:
            e, hidden = self.embedding_layernorm(e), self.hidden_states_layernorm(hidden)
        h = self.fc(ops.concat_columns([e, hidden]))
        residual = None
        for layer in self.layers:
            if residual is None and layer.input_layernorm is None:  # EAGLE's first layer
                h, residual = layer.forward_qkv(positions, layer.qkv_proj(h), h, md)
            else:
                h, residual = layer(positions, h, residual, md)
        self._add(h, residual)
        return residual

    def compute_logits(self, out: np.ndarray) -> np.ndarray:
        return self.lm_head(out)
