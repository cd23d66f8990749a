"""Token parity (TESTING.md): greedy vllmx tokens teacher-forced through an oracle; at every
generated position the oracle's log-prob of vllmx's token must be within delta of its best."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ParityReport:
    strict: int
    near_tie: int
    failed: int
    worst_gap: float

    def __str__(self) -> str:
        return (f"strict {self.strict}, near-tie {self.near_tie}, failed {self.failed}, "
                f"worst gap {self.worst_gap:.4g} nats")


def check_positions(logprobs_rows, tokens, delta: float) -> ParityReport:
    """logprobs_rows[j]: the oracle's log-softmax at the position that produced tokens[j]."""
    strict = near = failed = 0
    worst = 0.0
    for row, tok in zip(logprobs_rows, tokens):
        gap = float(np.max(row) - row[tok])
        worst = max(worst, gap)
        if int(np.argmax(row)) == tok or gap == 0.0:
            strict += 1
        elif gap <= delta:
            near += 1
        else:
            failed += 1
    return ParityReport(strict, near, failed, worst)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def vllmx_prompt_logits(llm, token_ids: list[int]) -> np.ndarray:
    """Logits at every prompt position from vllmx's model (one prefill on a private cache)."""
    from vllmx.layers.attention import AttentionMetadata

    engine = llm.llm_engine
    model = engine.model
    bs = engine.config.cache_config.block_size
    n = len(token_ids)
    nblocks = -(-n // bs)
    caches = [(np.zeros((nblocks,) + k.shape[1:], k.dtype), np.zeros((nblocks,) + v.shape[1:], v.dtype))
              for k, v in engine.kv_caches]
    md = AttentionMetadata(
        slot_mapping=np.arange(n, dtype=np.int32),
        block_table=np.arange(nblocks, dtype=np.int32)[None, :],
        query_start_loc=np.array([0, n], dtype=np.int32),
        seq_lens=np.array([n], dtype=np.int32), kv_caches=caches, cache_dtype=engine.cache_dtype)
    if getattr(model, "is_hybrid", False):  # the runner's scratch state slot, started fresh
        scratch = len(engine.model_runner.state_slots.state_indices)
        md.state_indices = np.array([scratch], dtype=np.int32)
        md.has_initial_state = np.zeros(1, dtype=np.int32)
    hidden = model.forward(np.asarray(token_ids, dtype=np.int32),
                           np.arange(n, dtype=np.int32), md)
    return model.compute_logits(hidden)


def prompt_logits_rel_error(llm, prompt: list[int], ref: np.ndarray) -> float:
    """vllmx's prompt logits against ref's rows for the prompt (the oracle's, or llama.cpp's
    rows for prompt + generated tokens): the largest difference over the largest |ref|."""
    ref = ref[: len(prompt)]
    return float(np.abs(vllmx_prompt_logits(llm, prompt) - ref).max() / np.abs(ref).max())


def assert_prompt_logits_match(llm, prompts, oracle, what: str, seed: int) -> None:
    """TESTING.md's prompt-logits rule against a transformers oracle in f32: within 1e-3
    relative, for the first three prompts."""
    import torch

    for prompt in prompts[:3]:
        with torch.no_grad():
            ref = oracle(torch.tensor([prompt])).logits[0].double().numpy()
        rel = prompt_logits_rel_error(llm, prompt, ref)
        assert rel < 1e-3, f"{what} prompt logits rel. error {rel:.3g} (seed {seed})"
