"""Structured outputs applied to the answer, not the reasoning (vLLM's structured_outputs_config
reasoning_parser, enable_in_reasoning off): a constrained request's matcher waits until the
reasoning parser's end marker has been generated, and constrains the tokens after it."""

from __future__ import annotations

from collections.abc import Collection

from vllmx.structured_output.backend_guidance import GuidanceGrammar


class ReasoningGatedGrammar:
    """A GuidanceGrammar behind the reasoning: inactive (no mask, tokens not matched) until the
    output closes the reasoning, then the grammar from the next token on."""

    def __init__(self, grammar: GuidanceGrammar, end_token_ids: list[int]):
        self.grammar = grammar
        self.end_token_ids = end_token_ids
        self.active = False
        self._tail: list[int] = []  # the last tokens, for an end marker split across steps

    def __getattr__(self, name):  # matcher, error, terminated, fill_bitmask: the grammar's
        return getattr(self.grammar, name)

    def fast_forward(self, limit: int, stop_ids: Collection[int] = ()) -> list[int]:
        return self.grammar.fast_forward(limit, stop_ids) if self.active else []

    def accept_tokens(self, tokens: list[int]) -> bool:
        if self.active:
            return self.grammar.accept_tokens(tokens)
        n = len(self.end_token_ids)
        seen = self._tail + list(tokens)
        for i in range(max(0, len(self._tail) - n + 1), len(seen) - n + 1):
            if seen[i:i + n] == self.end_token_ids:
                self.active = True
                return self.grammar.accept_tokens(seen[i + n:])
        self._tail = seen[-(n - 1):] if n > 1 else []
        return True
