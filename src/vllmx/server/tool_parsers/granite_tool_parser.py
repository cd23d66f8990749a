"""granite: Granite 3.0 / 3.1 calls, the answer a JSON list [{"name": "f", "arguments":
{...}}, ...] after <|tool_call|> (3.0) or <tool_call> (3.1)."""

from __future__ import annotations

from vllmx.server.tool_parsers.abstract_tool_parser import ParsedOutput, ToolParser
from vllmx.server.tool_parsers.llama_tool_parser import json_call_sequence
from vllmx.server.tool_parsers.utils import skip_ws

_MARKERS = ("<|tool_call|>", "<tool_call>")


class GraniteToolParser(ToolParser):
    name = "granite"
    keeps_special_tokens = True  # <|tool_call|> is special in Granite 3.0

    def parse(self, text, request, final):
        i = skip_ws(text, 0)
        rest = text[i:]
        if not final and any(m.startswith(rest) for m in _MARKERS):
            return ParsedOutput("")  # nothing yet, or maybe a marker: hold
        marker = next((m for m in _MARKERS if rest.startswith(m)), "")
        i = skip_ws(text, i + len(marker))
        if i >= len(text):
            return ParsedOutput(text if final else "")
        if text[i] != "[":
            return ParsedOutput(text)
        got = json_call_sequence(text, i + 1, final, ",", close="]")
        if got is None or final and (got[1] is None or text[got[1]:].strip()):
            return ParsedOutput(text if final else "")
        return ParsedOutput("", got[0])
