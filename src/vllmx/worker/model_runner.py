"""Turns a SchedulerOutput into one model forward over a mixed batch of prefill chunks and
decodes, then samples. Per-step inputs live in persistent, preallocated buffers (sliced each
step), so that a later step-capture can replay a decode step over the same memory."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllmx import ops
from vllmx.core.sched_output import ModelRunnerOutput, NewRequestData, SchedulerOutput
from vllmx.layers.attention import AttentionMetadata
from vllmx.sampling_params import SamplingParams

_MASK = np.uint64((1 << 64) - 1)


def seed_rng_state(seed: int) -> np.ndarray:
    """A sampler generator state (u64[2]) from a seed, by splitmix64."""
    out = np.empty(2, dtype=np.uint64)
    x = seed & ((1 << 64) - 1)
    for i in range(2):
        x = (x + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
        out[i] = z ^ (z >> 31)
    if not out.any():
        out[0] = 1
    return out


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    num_prompt_tokens: int
    rng_state: np.ndarray

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class ModelRunner:
    def __init__(self, model, kv_caches, cache_dtype: int, block_size: int,
                 max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, seed: int):
        self.model = model
        self.kv_caches = kv_caches
        self.cache_dtype = cache_dtype
        self.block_size = block_size
        self.max_blocks_per_req = -(-max_model_len // block_size)
        self.requests: dict[str, CachedRequestState] = {}
        self.global_rng = np.random.default_rng(seed)
        t, b = max_num_batched_tokens, max_num_seqs
        self.input_ids = np.zeros(t, dtype=np.int32)
        self.positions = np.zeros(t, dtype=np.int32)
        self.slot_mapping = np.zeros(t, dtype=np.int32)
        self.query_start_loc = np.zeros(b + 1, dtype=np.int32)
        self.seq_lens = np.zeros(b, dtype=np.int32)
        self.block_table = np.zeros((b, self.max_blocks_per_req), dtype=np.int32)

    def _add_request(self, new: NewRequestData) -> None:
        sp = new.sampling_params
        seed = sp.seed if sp.seed is not None else int(self.global_rng.integers(0, 2**63))
        old = self.requests.get(new.req_id)
        rng = old.rng_state if old is not None else seed_rng_state(seed)  # resumed: same stream
        self.requests[new.req_id] = CachedRequestState(
            new.req_id, list(new.token_ids), sp, list(new.block_ids), new.num_computed_tokens,
            new.num_prompt_tokens, rng)

    def _update_states(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            self._add_request(new)
        c = so.scheduled_cached_reqs
        for req_id, blocks, computed in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens):
            state = self.requests[req_id]
            state.block_ids.extend(blocks)
            state.num_computed_tokens = computed

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(so)
        req_ids = list(so.num_scheduled_tokens)
        if not req_ids:
            return ModelRunnerOutput([], {}, {})
        bs = self.block_size
        t = 0
        logits_rows: list[int] = []
        sample_ids: list[str] = []
        for b, req_id in enumerate(req_ids):
            state = self.requests[req_id]
            n = so.num_scheduled_tokens[req_id]
            start = state.num_computed_tokens
            end = start + n
            pos = np.arange(start, end, dtype=np.int32)
            blocks = np.asarray(state.block_ids, dtype=np.int32)
            self.input_ids[t:t + n] = state.token_ids[start:end]
            self.positions[t:t + n] = pos
            self.slot_mapping[t:t + n] = blocks[pos // bs] * bs + pos % bs
            self.block_table[b, :len(blocks)] = blocks
            self.seq_lens[b] = end
            t += n
            self.query_start_loc[b + 1] = t
            if end == len(state.token_ids):  # caught up: this step samples the next token
                logits_rows.append(t - 1)
                sample_ids.append(req_id)
        nb = len(req_ids)
        md = AttentionMetadata(self.slot_mapping[:t], self.block_table[:nb],
                               self.query_start_loc[:nb + 1], self.seq_lens[:nb],
                               self.kv_caches, self.cache_dtype)
        hidden = self.model.forward(self.input_ids[:t], self.positions[:t], md)
        if not sample_ids:
            return ModelRunnerOutput(req_ids, {}, {})
        logits = self.model.compute_logits(hidden[logits_rows])
        ids, logprobs = self._sample(logits, sample_ids)
        for req_id, tok in zip(sample_ids, ids.tolist()):
            self.requests[req_id].token_ids.append(tok)
        return ModelRunnerOutput(req_ids, dict(zip(sample_ids, ids.tolist())),
                                 dict(zip(sample_ids, logprobs.tolist())))

    def _sample(self, logits: np.ndarray, req_ids: list[str]):
        n = len(req_ids)
        temperature = np.empty(n, dtype=np.float32)
        top_k = np.empty(n, dtype=np.int32)
        top_p = np.empty(n, dtype=np.float32)
        min_p = np.empty(n, dtype=np.float32)
        rng = np.empty((n, 2), dtype=np.uint64)
        raw = None
        for i, req_id in enumerate(req_ids):
            state = self.requests[req_id]
            sp = state.sampling_params
            temperature[i] = 0.0 if sp.greedy else sp.temperature
            top_k[i], top_p[i], min_p[i] = sp.top_k, sp.top_p, sp.min_p
            rng[i] = state.rng_state
            if state.num_output_tokens < sp.min_tokens:  # EOS and stop ids cannot end it yet
                if raw is None:
                    raw = logits.copy()
                banned = set(sp.stop_token_ids)
                if not sp.ignore_eos:
                    banned |= sp.all_stop_token_ids
                banned = [b for b in banned if 0 <= b < logits.shape[1]]
                logits[i, banned] = -np.inf
        ids, logprobs = ops.sample(logits, temperature, top_k, top_p, min_p, rng)
        if raw is not None:  # logprobs refer to the model's distribution, before masking
            m = raw.max(axis=1, keepdims=True)
            lse = (m + np.log(np.exp(raw - m).sum(axis=1, keepdims=True)))[:, 0]
            logprobs = raw[np.arange(n), ids] - lse
        for i, req_id in enumerate(req_ids):
            self.requests[req_id].rng_state = rng[i].copy()
        return ids, logprobs
