"""Tool call parsers by vLLM's names (--tool-call-parser NAME): each turns one model family's
call format into OpenAI tool calls, streamed or whole."""

from __future__ import annotations

from vllmx.server.tool_parsers.abstract_tool_parser import (
    ExtractedToolCallInformation,
    ParsedOutput,
    ToolCall,
    ToolParser,
)
from vllmx.server.tool_parsers.deepseekv3_tool_parser import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
)
from vllmx.server.tool_parsers.functiongemma_tool_parser import FunctionGemmaToolParser
from vllmx.server.tool_parsers.glm4_moe_tool_parser import Glm4MoeModelToolParser
from vllmx.server.tool_parsers.granite_tool_parser import GraniteToolParser
from vllmx.server.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from vllmx.server.tool_parsers.internlm2_tool_parser import Internlm2ToolParser
from vllmx.server.tool_parsers.kimi_k2_tool_parser import KimiK2ToolParser
from vllmx.server.tool_parsers.llama_tool_parser import (
    Llama3JsonToolParser,
    Llama4JsonToolParser,
)
from vllmx.server.tool_parsers.minimax_m2_tool_parser import MinimaxM2ToolParser
from vllmx.server.tool_parsers.mistral_tool_parser import MistralToolParser
from vllmx.server.tool_parsers.openai_tool_parser import OpenAIToolParser
from vllmx.server.tool_parsers.pythonic_tool_parser import (
    Llama4PythonicToolParser,
    PythonicToolParser,
)
from vllmx.server.tool_parsers.qwen3coder_tool_parser import (
    Qwen3CoderToolParser,
    Qwen3XMLToolParser,
    SeedOssToolParser,
)

TOOL_PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (
    Hermes2ProToolParser, Llama3JsonToolParser, MistralToolParser, PythonicToolParser,
    Qwen3CoderToolParser, Qwen3XMLToolParser, OpenAIToolParser, DeepSeekV3ToolParser,
    DeepSeekV31ToolParser, Glm4MoeModelToolParser, KimiK2ToolParser, GraniteToolParser,
    Internlm2ToolParser, MinimaxM2ToolParser, FunctionGemmaToolParser, Llama4JsonToolParser,
    Llama4PythonicToolParser, SeedOssToolParser,
)}


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class registered under name (vLLM's ToolParserManager.get_tool_parser)."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"invalid tool call parser: {name!r} (choose from "
                         f"{', '.join(sorted(TOOL_PARSERS))})")
    return TOOL_PARSERS[name]


__all__ = ["TOOL_PARSERS", "ExtractedToolCallInformation", "ParsedOutput", "ToolCall",
           "ToolParser", "get_tool_parser"]
