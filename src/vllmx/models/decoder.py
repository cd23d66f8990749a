"""The forward pass the pre-norm decoder families share (Llama and its kin, DeepSeek, the
hybrids, StableLM, Starcoder2, Cohere): the embeddings (times embedding_multiplier: Granite's),
each layer as (positions, h, residual, md) -> (h, residual), the final norm fused with the last
residual add, and lm_head (its logits divided by logits_scaling: Granite's)."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.device import DeviceArray
from vllmx.layers.attention import AttentionMetadata
from vllmx.layers.linear import vocab_parallel_embedding
from vllmx.layers.norm import ResidualAdd


class DecoderLM:
    embedding_multiplier = 1.0
    logits_scaling = 1.0
    # EAGLE-3 drafting (vLLM's aux_hidden_state_layers): the residual stream entering each of
    # these layers is written, side by side, into aux_hidden_out's columns (set_aux_hidden_state_
    # layers); natively, so that a recorded step replays it.
    aux_hidden_state_layers: tuple[int, ...] = ()
    aux_hidden_out: np.ndarray | None = None
    # Tensor parallelism: the group the model was built for (distributed/parallel_state.py),
    # whose embed_tokens holds its share of the vocabulary's rows, from vocab_start.
    tp_group = None
    vocab_start = 0
    # Pipeline parallelism: this rank's stage (its layers built, the others None)
    pp_stage = None

    def state_arrays(self) -> list[np.ndarray]:
        """Hybrid models: every mixer's per-request state arrays, slot first (those of this
        rank's layers; none in other models)."""
        return [a for layer in self.layers if layer is not None
                for part in vars(layer).values() if hasattr(part, "state_arrays")
                for a in part.state_arrays()]

    def copy_states(self, dst: np.ndarray, src: np.ndarray) -> None:
        """Hybrid models (speculative decoding's rollback, worker/state_slots.py): every
        state slot dst[i] gets slot src[i]'s contents."""
        for a in self.state_arrays():
            if isinstance(a, DeviceArray):  # (a few requests a step: a queued copy a slot)
                for d, s in zip(dst.tolist(), src.tolist()):
                    a[d].copy_from(a[s])
            else:
                a[dst] = a[src]

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...], out: np.ndarray) -> None:
        """layers: ascending, distinct; out: [max tokens, len(layers) * hidden_size]."""
        self.aux_hidden_state_layers, self.aux_hidden_out = tuple(layers), out
        self._aux_add = ResidualAdd(self.config["hidden_size"])

    def forward(self, input_ids: np.ndarray, positions: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        if self.pp_stage is not None:
            return self._forward_stages(input_ids, positions, md)
        h = self.embed(input_ids)
        if self.embedding_multiplier != 1.0:
            ops.scale_(h, self.embedding_multiplier)
        residual = None
        for i, layer in enumerate(self.layers):
            if i in self.aux_hidden_state_layers:
                self._keep_aux_hidden_state(i, h, residual)
            h, residual = layer(positions, h, residual, md)
        h, _ = self.norm(h, residual)
        return h

    def _forward_stages(self, input_ids, positions, md: AttentionMetadata) -> np.ndarray:
        """The pipeline's forward, the same on every rank: the stages run in turn, each handing
        its residual stream (h, residual) on to the next, and the last its normed hidden
        states to every rank (vLLM's IntermediateTensors, one microbatch)."""
        pp = self.pp_stage
        shape = (len(input_ids), self.config["hidden_size"])
        h = residual = None
        for stage in range(pp.num_stages):
            if stage == pp.stage:
                if pp.is_first:
                    h = self.embed(input_ids)
                    if self.embedding_multiplier != 1.0:
                        ops.scale_(h, self.embedding_multiplier)
                for layer in self.layers:
                    if layer is not None:
                        h, residual = layer(positions, h, residual, md)
                if pp.is_last:
                    h, _ = self.norm(h, residual)
            h = pp.hand_off(stage, h, shape)
            if stage < pp.num_stages - 1:
                residual = pp.hand_off(stage, residual, shape)
        return h

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        """The tokens' embeddings; under tensor parallelism (vLLM's VocabParallelEmbedding)
        each rank looks up the ids in its rows, zeros elsewhere, and the ranks' rows are
        summed."""
        return vocab_parallel_embedding(input_ids, self.embed_tokens, self.tp_group,
                                        self.vocab_start)

    def _keep_aux_hidden_state(self, layer: int, h, residual) -> None:
        """h + residual (layer 0: the embeddings) into layer's columns of aux_hidden_out, the
        model's own h and residual left as they are (its tokens must not change)."""
        stream = h
        if residual is not None:
            stream = ops.concat_columns([residual])  # (a copy)
            self._aux_add(ops.concat_columns([h]), stream)
        k, width = self.aux_hidden_state_layers.index(layer), h.shape[1]
        ops.copy_columns(self.aux_hidden_out[:h.shape[0]], k * width, stream)

    def compute_logits(self, hidden: np.ndarray) -> np.ndarray:
        """Logits of contiguous hidden rows, in the activation dtype."""
        logits = self.lm_head(hidden)
        if self.logits_scaling != 1.0:
            ops.scale_(logits, 1.0 / self.logits_scaling)
        return logits
