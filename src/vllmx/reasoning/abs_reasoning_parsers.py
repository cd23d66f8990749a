"""The reasoning parser interface (vLLM's ReasoningParser): a model's output split into its
reasoning and its answer (content). As with the tool parsers, parse(text, final) reads the
text so far; a stream re-parses each step and sends what grew, so a parser holds back what it
cannot place yet and only ever extends what it returned."""

from __future__ import annotations

from typing import ClassVar


def _last_index(ids: list[int], seq: list[int]) -> int:
    """Where seq last occurs in ids (-1: nowhere)."""
    n = len(seq)
    for i in range(len(ids) - n, -1, -1):
        if ids[i:i + n] == seq:
            return i
    return -1


class ReasoningParser:
    name: ClassVar[str]
    keeps_special_tokens: ClassVar[bool] = False  # its markers are special tokens
    # The texts that open and close the reasoning, as the engine finds them in token ids.
    reasoning_start: ClassVar[str]
    reasoning_end: ClassVar[str]

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        if tokenizer is not None:
            self.start_token_ids = tokenizer.encode(self.reasoning_start,
                                                    add_special_tokens=False)
            self.end_token_ids = tokenizer.encode(self.reasoning_end, add_special_tokens=False)

    def is_reasoning_end(self, input_ids: list[int]) -> bool:
        """vLLM's: whether the reasoning has ended in these ids (prompt and output so far): the
        last end marker comes after the last start marker. The engine's structured outputs
        start constraining then (needs the parser built over the tokenizer)."""
        end = _last_index(input_ids, self.end_token_ids)
        return end >= 0 and end > _last_index(input_ids, self.start_token_ids)

    def starts_in_reasoning(self, prompt: str) -> bool:
        """Whether the output begins inside the reasoning (the chat template opened it)."""
        return False

    def parse(self, text: str, final: bool, in_reasoning: bool) -> tuple[str | None, str]:
        """(reasoning or None, content) of the output so far."""
        raise NotImplementedError

    def extract_reasoning_content(self, model_output: str, request=None,
                                  prompt: str = "") -> tuple[str | None, str | None]:
        """vLLM's non-streamed split: (reasoning, content), None where empty."""
        reasoning, content = self.parse(model_output, True, self.starts_in_reasoning(prompt))
        return reasoning or None, content or None
