"""minimax_m2: MiniMax-M2's calls, <minimax:tool_call> holding one or more
<invoke name="NAME"><parameter name="K">V</parameter>...</invoke>; values typed by the tool's
schema. A stream sends each parameter as it closes."""

from __future__ import annotations

import re

from vllmx.server.tool_parsers.abstract_tool_parser import TaggedToolParser, ToolCall
from vllmx.server.tool_parsers.utils import convert_param, params_json, tool_parameters

_INVOKE = re.compile(r'<invoke name="([^"]*)">(.*?)(</invoke>|$)', re.DOTALL)
_PARAM = re.compile(r'<parameter name="([^"]*)">(.*?)</parameter>', re.DOTALL)


class MinimaxM2ToolParser(TaggedToolParser):
    name = "minimax_m2"
    keeps_special_tokens = True
    call_start, call_end = "<minimax:tool_call>", "</minimax:tool_call>"

    def parse_call(self, body, request, complete, final):
        calls, pos = [], 0
        for m in _INVOKE.finditer(body):
            if body[pos:m.start()].strip():
                return None  # text between invokes
            name, inner, closed = m.group(1), m.group(2), bool(m.group(3))
            if not closed and complete:
                return None
            schema = tool_parameters(request, name)
            params = [(k, convert_param(v.strip("\n"), schema.get(k)) if k in schema
                       else v.strip("\n")) for k, v in _PARAM.findall(inner)]
            if closed and _PARAM.sub("", inner).strip():
                return None
            calls.append(ToolCall(name, params_json(params, closed)))
            pos = m.end()
        if not calls or complete and body[pos:].strip():
            return None
        return calls
