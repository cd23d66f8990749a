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

    def _marker_end(self, tokens: list[int]) -> tuple[list[int], int | None]:
        """(the last tokens seen and these, where in them the end marker ends first: the
        index after its last token; None: not in them)."""
        n = len(self.end_token_ids)
        seen = self._tail + list(tokens)
        for i in range(max(0, len(self._tail) - n + 1), len(seen) - n + 1):
            if seen[i:i + n] == self.end_token_ids:
                return seen, i + n
        return seen, None

    def draft_prefix(self, drafts: list[int]) -> int:
        """The grammar's, once active; before, the drafts up to the one that would close the
        reasoning (that token is sampled, unconstrained, and the grammar starts after it)."""
        if self.active:
            return self.grammar.draft_prefix(drafts)
        _, end = self._marker_end(drafts)
        return len(drafts) if end is None else end - 1 - len(self._tail)

    def accept_tokens(self, tokens: list[int]) -> bool:
        if self.active:
            return self.grammar.accept_tokens(tokens)
        seen, end = self._marker_end(tokens)
        if end is not None:
            self.active = True
            return self.grammar.accept_tokens(seen[end:])
        n = len(self.end_token_ids)
        self._tail = seen[-(n - 1):] if n > 1 else []
        return True
