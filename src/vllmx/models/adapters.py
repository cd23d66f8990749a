"""Pooling models (vLLM's models/adapters.py): the encoder classes by architecture, and any
registered decoder made an embedder (vLLM's as_embedding_model): its final hidden states
pooled, no lm_head used."""

from __future__ import annotations

import numpy as np

from vllmx.layers.encoder_attention import PoolingBatch
from vllmx.layers.linear import Linear
from vllmx.layers.placement import Placement, placement
from vllmx.models.bert import BertModel
from vllmx.models.registry import get_model_class
from vllmx.ops import Weight

ENCODER_ARCHS = {
    "BertModel", "BertForMaskedLM", "BertForSequenceClassification", "RobertaModel",
    "RobertaForMaskedLM", "RobertaForSequenceClassification", "XLMRobertaModel",
    "XLMRobertaForMaskedLM", "XLMRobertaForSequenceClassification",
}
# Decoders saved as their bare base model (transformers' Qwen3Model, as Qwen3-Embedding's
# sentence-transformers checkpoints are): tensors without the 'model.' prefix, no lm_head.
BASE_DECODER_ARCHS = {"LlamaModel": "LlamaForCausalLM", "MistralModel": "MistralForCausalLM",
                      "Qwen2Model": "Qwen2ForCausalLM", "Qwen3Model": "Qwen3ForCausalLM"}


def pooling_model_class(hf_config: dict):
    """The class that builds this checkpoint as a pooling model: (cfg, weights) -> model."""
    archs = hf_config.get("architectures") or []
    if any(a in ENCODER_ARCHS for a in archs):
        return BertModel
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return DecoderForSequenceClassification
    return DecoderForEmbedding


def _causal_lm_config(cfg: dict) -> dict:
    """cfg with its architecture named as the registered decoder: a base model's (Qwen3Model)
    or a sequence classifier's (Qwen3ForSequenceClassification) ForCausalLM."""
    archs = cfg.get("architectures") or []
    for a in archs:
        if a in BASE_DECODER_ARCHS:
            return {**cfg, "architectures": [BASE_DECODER_ARCHS[a]]}
        if a.endswith("ForSequenceClassification"):
            causal = a.removesuffix("ForSequenceClassification") + "ForCausalLM"
            try:
                get_model_class({**cfg, "architectures": [causal]})
            except ValueError:
                raise ValueError(f"sequence classification with {a} is not supported (no "
                                 f"{causal} decoder to build it on)") from None
            return {**cfg, "architectures": [causal]}
    return cfg


class DecoderForEmbedding:
    """A decoder's hidden states for pooling: causal attention over a scratch cache that every
    layer shares (layers/encoder_attention.py); LAST pooling by default, as Qwen3-Embedding."""

    is_pooling_model = True
    default_pooling_type = "LAST"

    def __init__(self, cfg: dict, weights: dict):
        archs = cfg.get("architectures") or []
        if any(a in BASE_DECODER_ARCHS for a in archs):
            weights = {k if k.startswith("model.") else "model." + k: v
                       for k, v in weights.items()}
        cfg = _causal_lm_config(cfg)
        if "lm_head.weight" not in weights:
            cfg = {**cfg, "tie_word_embeddings": True}  # the head is never used here
        with placement(Placement()):  # the head runs on the host, over the pooled rows
            self.classifier = self._classifier(cfg, weights)
        model_cls = get_model_class(cfg)
        self.model = model_cls(cfg, weights)
        if getattr(self.model, "is_hybrid", False) or self.model.config.get("use_mla"):
            raise ValueError(f"{archs}: hybrid (recurrent state) and latent-attention (MLA) "
                             f"decoders cannot be pooling models in vllmx yet (their caches "
                             f"are not the scratch cache's layout)")
        self.config = self.model.config
        self.vocab_size = self.model.vocab_size
        self.max_positions = int(cfg.get("max_position_embeddings") or cfg["max_model_len"])

    def _classifier(self, cfg: dict, weights: dict):
        return None

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The decoder's tensors (load_format="dummy"), under its ForCausalLM names."""
        causal = _causal_lm_config(cfg)
        return get_model_class(causal).checkpoint_shapes(causal)

    def forward(self, input_ids: np.ndarray, batch: PoolingBatch,
                token_type_ids: np.ndarray | None = None) -> np.ndarray:
        # token_type_ids: unused, a decoder has no token-type embedding (a pair is its two
        # texts' tokens one after the other)
        c = self.config
        md = batch.causal_metadata(c["num_hidden_layers"], c["num_key_value_heads"],
                                   c["head_dim"])
        return self.model.forward(batch.to_device(input_ids), batch.to_device(batch.positions),
                                  md)


class DecoderForSequenceClassification(DecoderForEmbedding):
    """A decoder's last token through a linear head (vLLM's as_seq_cls_model): transformers'
    *ForSequenceClassification `score.weight` [num_labels, H], or, for a reranker that reads
    answer tokens off the LM head (Qwen3-Reranker, hf_overrides' classifier_from_token), those
    rows of lm_head: with two tokens ["no", "yes"] one logit, yes - no (sigmoid: P(yes))."""

    def _classifier(self, cfg: dict, weights: dict):
        token_ids = cfg.get("classifier_from_token_ids")
        if token_ids is not None:
            head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
            rows = head.to_float32().reshape(head.shape)[np.asarray(token_ids)]
            w = rows[1:2] - rows[0:1] if len(token_ids) == 2 else rows
            return DecoderClassifierHead(Weight.from_numpy(np.ascontiguousarray(w, np.float32)))
        if "score.weight" not in weights:
            raise ValueError(f"{cfg.get('architectures')}: the checkpoint has no score.weight "
                             f"(and no classifier_from_token in hf_overrides)")
        return DecoderClassifierHead(weights["score.weight"])


class DecoderClassifierHead:
    def __init__(self, weight: Weight):
        self.score = Linear(weight)
        self.num_labels = weight.shape[0]

    def __call__(self, pooled: np.ndarray) -> np.ndarray:
        return self.score(np.ascontiguousarray(pooled, np.float32))
