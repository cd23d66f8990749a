"""The reasoning parser interface (vLLM's ReasoningParser): a model's output split into its
reasoning and its answer (content). As with the tool parsers, parse(text, final) reads the
text so far; a stream re-parses each step and sends what grew, so a parser holds back what it
cannot place yet and only ever extends what it returned."""

from __future__ import annotations

from typing import ClassVar


class ReasoningParser:
    name: ClassVar[str]
    keeps_special_tokens: ClassVar[bool] = False  # its markers are special tokens

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

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
