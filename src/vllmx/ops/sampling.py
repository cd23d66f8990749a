"""Sampling ops: the sampler's draw, the logits processors and grammar masks applied in place,
log-probs and top lists, argmax (on the logits' device; the GPU sampler never brings logits to
the host)."""

from __future__ import annotations

import numpy as np

from vllmx import _C
from vllmx.device import DeviceArray
from vllmx.ops._base import _empty, _on_device


def sample(logits, temperature, top_k, top_p, min_p, rng_state, with_logprobs: bool = True,
           out: tuple | None = None):
    """Token ids (int32 [B]) and their log-probs under the given logits (float32 [B]; None
    without with_logprobs), on logits' device. rng_state (uint64 [B, 2]) is advanced in place.
    out: (ids, logprobs or None) to write instead (the GPU sampler's staging buffer)."""
    if out is None:
        b = logits.shape[0]
        out = (_empty(logits, (b,), np.int32),
               _empty(logits, (b,), np.float32) if with_logprobs else None)
    _C.ops.sample(*out, logits, temperature, top_k, top_p, min_p, rng_state)
    return out


def apply_logits_processors(logits, **groups: np.ndarray) -> None:
    """In place over logits (float32 [B, V], host or GPU): allowed_token_ids, bad words, logit
    bias (and min_tokens bans), penalties; each group as CSR int32 host arrays (csrc/ops.def),
    uploaded when the logits are on the GPU."""
    if isinstance(logits, DeviceArray):
        groups = {k: _on_device(v) for k, v in groups.items()}
    _C.ops.apply_logits_processors(logits, **groups)


def apply_token_bitmask(logits, bitmask: np.ndarray, indices: np.ndarray | None = None) -> None:
    """In place over logits (float32 [B, V], host or GPU): -inf for every token whose bit is 0
    in its row's packed grammar mask (bitmask int32 [R, ceil(V / 32)], host; indices int32 [R]:
    the logits row of each mask row, None: R == B). Uploaded when the logits are on the GPU
    (unless they are there already: the sampler stages them)."""
    if isinstance(logits, DeviceArray):
        bitmask = _on_device(bitmask)
        if indices is not None:
            indices = _on_device(indices)
    _C.ops.apply_token_bitmask(logits, bitmask, indices)


def num_top_logprobs(num_logprobs: np.ndarray, vocab: int) -> int:
    """K of compute_logprobs' top lists: the largest count, at most the vocabulary (0: none)."""
    return max(0, min(int(num_logprobs.max(initial=0)), vocab))


def compute_logprobs(logits, token_ids: np.ndarray, num_logprobs: np.ndarray, out=None,
                     counts=None):
    """Per row of log_softmax(logits): the log-prob of token_ids[n] (float32 [N]), its rank
    (int32 [N]; 0 where num_logprobs[n] < 0) and the num_logprobs[n] most probable tokens
    (int32 / float32 [N, K], K = num_top_logprobs; padded with -1 / -inf). num_logprobs is a
    host array; with device logits it and token_ids (host or device) go to the GPU and the
    results are DeviceArrays: the logits never leave it. out: the four arrays to write instead
    (top ones None when K = 0), counts: num_logprobs already on the GPU (the sampler's
    staging buffer)."""
    n, vocab = logits.shape
    k = num_top_logprobs(num_logprobs, vocab) if n else 0
    if out is None:
        out = (_empty(logits, (n,), np.float32), _empty(logits, (n,), np.int32),
               _empty(logits, (n, k), np.int32) if k > 0 else None,
               _empty(logits, (n, k), np.float32) if k > 0 else None)
    token_logprob, rank, top_ids, top_logprobs = out
    if counts is None:
        counts = num_logprobs
    if isinstance(logits, DeviceArray):
        token_ids = _on_device(token_ids if isinstance(token_ids, DeviceArray)
                               else np.asarray(token_ids, dtype=np.int32))
        counts = _on_device(counts if isinstance(counts, DeviceArray)
                            else np.asarray(counts, dtype=np.int32))
    _C.ops.compute_logprobs(token_logprob, rank, top_ids, top_logprobs, logits, token_ids,
                            counts)
    if top_ids is None:  # callers index [N, 0] arrays
        top_ids, top_logprobs = np.zeros((n, 0), np.int32), np.zeros((n, 0), np.float32)
    return token_logprob, rank, top_ids, top_logprobs


def argmax(x):
    """Each row's argmax (i32 [B], on x's device; ties to the lowest index)."""
    out = _empty(x, (x.shape[0],), np.int32)
    _C.ops.argmax(out, x)
    return out
