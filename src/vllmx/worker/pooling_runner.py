"""The pooling model runner: whole prompts in, pooled outputs out. No KV cache is kept between
calls (a pooling request is one forward), so requests are packed into forwards of at most
max_num_batched_tokens tokens and max_num_seqs sequences, in the order given. On the GPU the
forward runs there and its final hidden states come back to the host as f32, where the pooler
(and a classifier's small head) runs."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.device import F32, DeviceArray
from vllmx.layers.encoder_attention import PoolingBatch
from vllmx.layers.pooler import Pooler
from vllmx.pooling_params import PoolingParams


class PoolingModelRunner:
    def __init__(self, model, pooler: Pooler, max_num_batched_tokens: int, max_num_seqs: int,
                 device: str = "cpu", cache_dtype: int = F32):
        self.model = model
        self.device, self.cache_dtype = device, cache_dtype
        self.pooler = pooler
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs

    def _batches(self, lens: list[int]):
        start, tokens = 0, 0
        for i, n in enumerate(lens):
            if i > start and (tokens + n > self.max_num_batched_tokens
                              or i - start >= self.max_num_seqs):
                yield start, i
                start, tokens = i, 0
            tokens += n
        if start < len(lens):
            yield start, len(lens)

    def execute(self, token_ids: list[list[int]], token_type_ids: list[list[int] | None],
                params: list[PoolingParams]) -> list[np.ndarray]:
        """One output per prompt (see Pooler): every prompt non-empty and within the model's
        positions (the engine checks)."""
        outs: list[np.ndarray] = []
        for s, e in self._batches([len(t) for t in token_ids]):
            batch = PoolingBatch.from_lens([len(t) for t in token_ids[s:e]], self.device,
                                           self.cache_dtype)
            ids = np.concatenate([np.asarray(t, dtype=np.int32) for t in token_ids[s:e]])
            types = None
            if any(t is not None for t in token_type_ids[s:e]):
                types = np.concatenate([
                    np.zeros(len(ids_), np.int32) if t is None else np.asarray(t, np.int32)
                    for ids_, t in zip(token_ids[s:e], token_type_ids[s:e])])
            hidden = self.model.forward(ids, batch, types)
            if isinstance(hidden, DeviceArray):
                hidden = ops.to_float32(hidden).numpy()
            outs += self.pooler(hidden, batch.query_start_loc, params[s:e])
        return outs
