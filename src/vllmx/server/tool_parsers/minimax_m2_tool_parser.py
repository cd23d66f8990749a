"""minimax_m2: MiniMax-M2's calls, <minimax:tool_call> holding one or more
<invoke name="NAME"><parameter name="K">V</parameter>...</invoke>; values typed by the tool's
schema. A stream sends each parameter as it closes."""

from __future__ import annotations

from vllmx.server.tool_parsers.abstract_tool_parser import TaggedToolParser, ToolCall
from vllmx.server.tool_parsers.utils import (
    closed_items,
    convert_param,
    params_json,
    tool_parameters,
)

_INVOKE, _END = '<invoke name="', "</invoke>"


class MinimaxM2ToolParser(TaggedToolParser):
    name = "minimax_m2"
    keeps_special_tokens = True
    call_start, call_end = "<minimax:tool_call>", "</minimax:tool_call>"

    def parse_call(self, body, request, complete, final):
        calls, pos = [], 0
        while (i := body.find(_INVOKE, pos)) >= 0:
            if body[pos:i].strip():
                return None  # text between invokes
            j = body.find('">', i)
            if j < 0:
                break  # the name is not closed yet
            name = body[i + len(_INVOKE):j]
            e = body.find(_END, j)
            inner = body[j + 2:] if e < 0 else body[j + 2:e]
            if e < 0 and complete:
                return None
            schema = tool_parameters(request, name)
            items = closed_items(inner, '<parameter name="', '">', "</parameter>")
            params = [(k, convert_param(v.strip("\n"), schema.get(k)) if k in schema
                       else v.strip("\n")) for k, v in items]
            if e >= 0 and inner.count("</parameter>") != len(items):
                return None
            calls.append(ToolCall(name, params_json(params, e >= 0)))
            if e < 0:
                return calls
            pos = e + len(_END)
        if not calls or complete and body[pos:].strip():
            return None
        return calls
