"""Prompt-lookup drafting (vLLM's NgramProposer): the tokens that followed the latest earlier
occurrence of the longest n-gram ending the request's tokens. On the host, O(sequence length)
per request: the candidates are the earlier positions of the last token, narrowed one token
back at a time."""

from __future__ import annotations

import numpy as np

from vllmx.config import SpeculativeConfig


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.k = config.num_speculative_tokens
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose_batch(self, seqs: dict[str, np.ndarray]) -> dict[str, list[int]]:
        """Each request's drafts (those with none left out)."""
        out = {}
        for req_id, tokens in seqs.items():
            drafts = self.propose(tokens)
            if drafts:
                out[req_id] = drafts
        return out

    def remove_requests(self, req_ids) -> None:
        """(Nothing is kept per request.)"""

    def propose(self, tokens: np.ndarray, k: int | None = None) -> list[int]:
        """Up to k (default num_speculative_tokens) draft tokens for the sequence `tokens`
        (1-D), or [] when no n-gram of min_n..max_n tokens that ends it occurred before."""
        k = self.k if k is None else k
        n = len(tokens)
        if k <= 0 or n <= self.min_n:
            return []
        # ends: earlier positions i (i < n - 1) where a match of the suffix would end.
        ends = np.flatnonzero(tokens[:n - 1] == tokens[n - 1])
        matched = 1
        best = None  # where the latest occurrence of the longest match so far ends
        while ends.size:
            if matched >= self.min_n:
                best = ends[-1]
            if matched == self.max_n:
                break
            ends = ends[ends >= matched]  # room for one more token before the match
            ends = ends[tokens[ends - matched] == tokens[n - 1 - matched]]
            matched += 1
        if best is None:
            return []
        return tokens[best + 1:best + 1 + k].tolist()
