"""kimi_k2: Kimi K2's calls inside <|tool_calls_section_begin|> ... <|tool_calls_section_end|>,
each <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>;
the call's id is the model's functions.NAME:IDX (sent back to it in the next turn)."""

from __future__ import annotations

from vllmx.server.tool_parsers.abstract_tool_parser import TaggedToolParser, ToolCall
from vllmx.server.tool_parsers.deepseekv3_tool_parser import raw_json_args

ARG = "<|tool_call_argument_begin|>"


class KimiK2ToolParser(TaggedToolParser):
    name = "kimi_k2"
    keeps_special_tokens = True
    call_start, call_end = "<|tool_call_begin|>", "<|tool_call_end|>"
    section_markers = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")

    def parse_call(self, body, request, complete, final):
        k = body.find(ARG)
        if k < 0:
            return None
        call_id = body[:k].strip()
        name = call_id.split(":")[0].split(".")[-1]
        got = raw_json_args(body, k + len(ARG), complete)
        return None if got is None or not name else [ToolCall(name, got[0], id=call_id)]
