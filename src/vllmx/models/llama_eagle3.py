"""EAGLE-3 draft heads for Llama-shaped targets (vLLM's Eagle3LlamaForCausalLM; checkpoints
with architectures LlamaForCausalLMEagle3, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), the drafter
of speculative method eagle3 (spec_decode/eagle.py). The checkpoint holds fc [H, 3H], midlayer.*
(a Llama decoder layer whose q/k/v read 2H, with input_layernorm for the embeddings and
hidden_norm for the hidden state), norm, its own lm_head over a draft vocabulary of
draft_vocab_size tokens with d2t (draft id -> target id - draft id) and t2d, and embed_tokens only
where it has its own (else the target's).

The target's residual streams entering three of its layers (vLLM's aux hidden states: layers
eagle_aux_hidden_state_layer_ids, else 2, L // 2 and L - 3) are concatenated and projected by fc
into the first pass's hidden state; at position p, with the embedding of token p + 1:
    x = [input_layernorm(embed(token p + 1)); hidden_norm(hidden p)]
    out = midlayer(x) with hidden p as its residual (hidden_norm(hidden p) where
          norm_before_residual), then any further layers
    draft = d2t-mapped argmax of lm_head(norm(out))
A further draft chains on `out` (the stream before norm) in place of fc's output. Draft layer j
attends over the KV layer num_hidden_layers(target) + j in the target's blocks."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers.attention import AttentionMetadata
from vllmx.layers.linear import Linear, vocab_parallel_embedding
from vllmx.layers.norm import ResidualAdd, RMSNorm
from vllmx.models.draft_head import DraftHead
from vllmx.models.llama_eagle import draft_layers, draft_weights, own_or_target
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight


def use_aux_hidden_state(cfg: dict) -> bool:
    """Whether the draft reads the target's aux hidden states through fc (vLLM's
    eagle_config.use_aux_hidden_state, default true); else the target's final ones."""
    return bool((cfg.get("eagle_config") or {}).get("use_aux_hidden_state", True))


def aux_hidden_state_layers(cfg: dict, num_target_layers: int) -> tuple[int, ...]:
    """The target layers whose entering residual stream the draft reads, ascending (the order
    the target's forward meets them, as vLLM concatenates them)."""
    ids = (cfg.get("eagle_aux_hidden_state_layer_ids")
           or (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
           or (2, num_target_layers // 2, num_target_layers - 3))
    bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < num_target_layers)]
    if bad:
        raise ValueError(f"aux hidden state layers {list(ids)} name layers the target lacks "
                         f"({bad}; it has "
                         f"{num_target_layers}: give eagle_aux_hidden_state_layer_ids in the "
                         f"draft's config.json)")
    return tuple(sorted(set(ids)))


class Eagle3LlamaForCausalLM(DraftHead):
    def __init__(self, cfg: dict, weights: dict[str, Weight], target, max_model_len: int):
        if not any(n.endswith("hidden_norm.weight") for n in weights):
            raise ValueError("no midlayer.hidden_norm.weight: not an EAGLE-3 head (an EAGLE-1/2 "
                             "head runs with method 'eagle')")
        first = target.config["num_hidden_layers"]
        w = draft_weights(weights, first)
        p = f"model.layers.{first}."
        require_tensors(w, ["norm.weight", p + "input_layernorm.weight",
                            p + "hidden_norm.weight"])
        self.layers = draft_layers(cfg, w, first, max_model_len)
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.hidden_norm = RMSNorm(w[p + "hidden_norm.weight"], eps)
        self.norm_before_residual = bool(cfg.get("norm_before_residual", False))
        self.fc = None
        if use_aux_hidden_state(cfg):
            require_tensors(w, ["fc.weight"])
            self.fc = Linear(w["fc.weight"])
            self.aux_hidden_state_layers = aux_hidden_state_layers(cfg, first)
            width = len(self.aux_hidden_state_layers) * target.config["hidden_size"]
            if self.fc.weight.shape[1] != width:
                raise ValueError(f"EAGLE-3 head: fc reads {self.fc.weight.shape[1]} columns, "
                                 f"the target's aux hidden states of layers "
                                 f"{list(self.aux_hidden_state_layers)} are {width}")
        self.norm = RMSNorm(w["norm.weight"], eps)
        self.embed_tokens, self.lm_head = own_or_target(w, target)
        self.vocab_size = self.lm_head.weight.shape[0]
        d2t = w.get("d2t")
        if d2t is not None:  # draft id i is target id i + d2t[i]
            d2t = np.asarray(d2t.data, dtype=np.int64).reshape(-1)
            self.draft_id_to_target_id = (np.arange(len(d2t)) + d2t).astype(np.int32)
        self._add = ResidualAdd(cfg["hidden_size"])

    def combine_hidden_states(self, hidden: np.ndarray) -> np.ndarray:
        """The first pass's hidden states: fc over the target's concatenated aux ones."""
        return hidden if self.fc is None else self.fc(hidden)

    def forward(self, input_ids: np.ndarray, positions: np.ndarray, hidden: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        """Rows of the draft's residual stream after its last layer (before norm); `hidden`
        becomes the first layer's residual and is overwritten."""
        e = vocab_parallel_embedding(input_ids, self.embed_tokens)
        first = self.layers[0]
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = ops.concat_columns([first.input_layernorm(e), normed])
        h, residual = first.forward_qkv(positions, first.qkv_proj(x), residual, md)
        for layer in self.layers[1:]:
            h, residual = layer(positions, h, residual, md)
        self._add(h, residual)
        return residual

    def compute_logits(self, out: np.ndarray) -> np.ndarray:
        """Logits over the draft vocabulary (draft_id_to_target_id maps their ids)."""
        return self.lm_head(self.norm(out))
