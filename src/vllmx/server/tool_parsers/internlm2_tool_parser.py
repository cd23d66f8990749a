"""internlm: InternLM2 / 2.5 calls, <|action_start|><|plugin|>\\n{"name": "f",
"parameters": {...}}<|action_end|>."""

from __future__ import annotations

from vllmx.server.tool_parsers.hermes_tool_parser import Hermes2ProToolParser


class Internlm2ToolParser(Hermes2ProToolParser):
    name = "internlm"
    call_start, call_end = "<|action_start|><|plugin|>", "<|action_end|>"
