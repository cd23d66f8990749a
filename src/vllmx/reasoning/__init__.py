"""Reasoning parsers by vLLM's names (--reasoning-parser NAME): the reasoning apart from the
answer, as `reasoning` in messages and streamed deltas (vLLM's name; it replaced
reasoning_content)."""

from __future__ import annotations

from vllmx.reasoning.abs_reasoning_parsers import ReasoningParser
from vllmx.reasoning.gptoss_reasoning_parser import GptOssReasoningParser
from vllmx.reasoning.granite_reasoning_parser import GraniteReasoningParser
from vllmx.reasoning.think_reasoning_parsers import (
    DeepSeekR1ReasoningParser,
    Glm4MoeModelReasoningParser,
    MiniMaxM2ReasoningParser,
    MistralReasoningParser,
    Qwen3ReasoningParser,
    SeedOSSReasoningParser,
)

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {p.name: p for p in (
    DeepSeekR1ReasoningParser, Qwen3ReasoningParser, Glm4MoeModelReasoningParser,
    MiniMaxM2ReasoningParser, MistralReasoningParser, GraniteReasoningParser,
    GptOssReasoningParser, SeedOSSReasoningParser,
)}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The parser class registered under name (vLLM's ReasoningParserManager)."""
    if name not in REASONING_PARSERS:
        raise ValueError(f"invalid reasoning parser: {name!r} (choose from "
                         f"{', '.join(sorted(REASONING_PARSERS))})")
    return REASONING_PARSERS[name]


__all__ = ["REASONING_PARSERS", "ReasoningParser", "get_reasoning_parser"]
