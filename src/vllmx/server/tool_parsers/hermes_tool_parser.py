"""hermes: Hermes 2 Pro / Qwen2.5 / Qwen3 calls, one JSON object per call,
<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>."""

from __future__ import annotations

from vllmx.server.tool_parsers.abstract_tool_parser import TaggedToolParser, ToolCall
from vllmx.server.tool_parsers.utils import call_from_object, skip_ws


class Hermes2ProToolParser(TaggedToolParser):
    name = "hermes"
    keeps_special_tokens = True  # <tool_call> is a special token in some Hermes vocabularies
    call_start, call_end = "<tool_call>", "</tool_call>"

    def parse_call(self, body, request, complete, final):
        i = skip_ws(body, 0)
        got = call_from_object(body, i, final=complete or final)
        if got is None:
            return None
        name, args, _, end = got
        if end is not None and body[end:].strip():
            return None  # text after the object: not a call
        if end is None and complete:
            return None
        return [ToolCall(name, args if name is not None else "")]
