"""The forward pass the pre-norm decoder families share (Llama and its kin, DeepSeek, the
hybrids, StableLM, Starcoder2, Cohere): the embeddings (times embedding_multiplier: Granite's),
each layer as (positions, h, residual, md) -> (h, residual), the final norm fused with the last
residual add, and lm_head (its logits divided by logits_scaling: Granite's)."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers.attention import AttentionMetadata


class DecoderLM:
    embedding_multiplier = 1.0
    logits_scaling = 1.0

    def forward(self, input_ids: np.ndarray, positions: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        h = ops.embedding(input_ids, self.embed_tokens)
        if self.embedding_multiplier != 1.0:
            ops.scale_(h, self.embedding_multiplier)
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, h, residual, md)
        h, _ = self.norm(h, residual)
        return h

    def compute_logits(self, hidden: np.ndarray) -> np.ndarray:
        """Logits of contiguous hidden rows, in the activation dtype."""
        logits = self.lm_head(hidden)
        if self.logits_scaling != 1.0:
            ops.scale_(logits, 1.0 / self.logits_scaling)
        return logits
