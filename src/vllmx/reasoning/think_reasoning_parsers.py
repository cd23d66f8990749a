"""Reasoning between a start and an end marker (vLLM's BaseThinkingReasoningParser):
<think>...</think> for deepseek_r1, qwen3, glm45 and minimax_m2, [THINK]...[/THINK] for
mistral (Magistral). Where the chat template has opened the reasoning in the prompt (or the
model never writes the start marker: DeepSeek-R1, MiniMax-M2) the output starts inside it."""

from __future__ import annotations

from typing import ClassVar

from vllmx.reasoning.abs_reasoning_parsers import ReasoningParser
from vllmx.server.tool_parsers.utils import held_back


class BaseThinkingReasoningParser(ReasoningParser):
    start_token: ClassVar[str] = "<think>"
    end_token: ClassVar[str] = "</think>"
    reasoning_start, reasoning_end = start_token, end_token

    def starts_in_reasoning(self, prompt: str) -> bool:
        # The template's generation prompt ends with an open <think> (Qwen3-Thinking-2507,
        # GLM with thinking on); a closed <think></think> there means thinking is off.
        return prompt.rstrip().endswith(self.start_token)

    def parse(self, text, final, in_reasoning):
        lead = text.lstrip()
        if lead.startswith(self.start_token):
            text, in_reasoning = lead[len(self.start_token):], True
        elif not final and self.start_token.startswith(lead):
            return None, ""  # nothing but the start marker's first characters yet: hold
        if not in_reasoning:
            return None, text
        e = text.find(self.end_token)
        if e < 0:  # still reasoning (or cut off while reasoning)
            return text if final else text[:len(text) - held_back(text, (self.end_token,))], ""
        return text[:e], text[e + len(self.end_token):]


class DeepSeekR1ReasoningParser(BaseThinkingReasoningParser):
    name = "deepseek_r1"

    def starts_in_reasoning(self, prompt):
        return True  # R1's template ends the prompt in <think>; the output may repeat it


class Qwen3ReasoningParser(BaseThinkingReasoningParser):
    name = "qwen3"


class Glm4MoeModelReasoningParser(BaseThinkingReasoningParser):
    name = "glm45"


class MiniMaxM2ReasoningParser(BaseThinkingReasoningParser):
    name = "minimax_m2"

    def starts_in_reasoning(self, prompt):
        return True  # MiniMax-M2 writes the reasoning first and only its closing </think>


class MistralReasoningParser(BaseThinkingReasoningParser):
    name = "mistral"
    keeps_special_tokens = True  # [THINK] / [/THINK] are control tokens
    start_token, end_token = "[THINK]", "[/THINK]"
    reasoning_start, reasoning_end = start_token, end_token


class SeedOSSReasoningParser(BaseThinkingReasoningParser):
    name = "seed_oss"
    start_token, end_token = "<seed:think>", "</seed:think>"
    reasoning_start, reasoning_end = start_token, end_token
