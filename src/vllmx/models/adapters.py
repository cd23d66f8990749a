"""Pooling models (vLLM's models/adapters.py): the encoder classes by architecture, and any
registered decoder made an embedder (vLLM's as_embedding_model): its final hidden states
pooled, no lm_head used."""

from __future__ import annotations

import numpy as np

from vllmx.layers.encoder_attention import PoolingBatch
from vllmx.models.bert import BertModel
from vllmx.models.registry import get_model_class

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
        raise ValueError(f"sequence classification with {archs} is not supported; vllmx's "
                         f"cross-encoders are the BERT / XLM-RoBERTa ones")
    return DecoderForEmbedding


class DecoderForEmbedding:
    """A decoder's hidden states for pooling: causal attention over a scratch cache that every
    layer shares (layers/encoder_attention.py); LAST pooling by default, as Qwen3-Embedding."""

    is_pooling_model = True
    default_pooling_type = "LAST"
    classifier = None

    def __init__(self, cfg: dict, weights: dict):
        archs = cfg.get("architectures") or []
        base = next((BASE_DECODER_ARCHS[a] for a in archs if a in BASE_DECODER_ARCHS), None)
        if base is not None:
            cfg = {**cfg, "architectures": [base]}
            weights = {k if k.startswith("model.") else "model." + k: v
                       for k, v in weights.items()}
        if "lm_head.weight" not in weights:
            cfg = {**cfg, "tie_word_embeddings": True}  # the head is never used here
        model_cls = get_model_class(cfg)
        self.model = model_cls(cfg, weights)
        if getattr(self.model, "is_hybrid", False):
            raise ValueError(f"{archs}: hybrid (recurrent state) decoders cannot be pooling "
                             f"models in vllmx yet")
        self.config = self.model.config
        self.vocab_size = self.model.vocab_size
        self.max_positions = int(cfg.get("max_position_embeddings") or cfg["max_model_len"])

    def forward(self, input_ids: np.ndarray, batch: PoolingBatch,
                token_type_ids: np.ndarray | None = None) -> np.ndarray:
        if token_type_ids is not None and np.any(token_type_ids):
            raise ValueError("a decoder embedder takes no token type ids (sentence pairs)")
        c = self.config
        md = batch.causal_metadata(c["num_hidden_layers"], c["num_key_value_heads"],
                                   c["head_dim"])
        return self.model.forward(input_ids, batch.positions, md)
