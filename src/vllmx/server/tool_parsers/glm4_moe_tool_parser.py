"""glm45: GLM-4.5 / 4.6 calls, <tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>
...</tool_call>; values are JSON unless the tool's schema says string. A stream sends each
argument as its </arg_value> comes."""

from __future__ import annotations

import re

from vllmx.server.tool_parsers.abstract_tool_parser import TaggedToolParser, ToolCall
from vllmx.server.tool_parsers.utils import (
    closed_items,
    convert_param,
    params_json,
    tool_parameters,
)

_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class Glm4MoeModelToolParser(TaggedToolParser):
    name = "glm45"
    keeps_special_tokens = True  # <tool_call>, <arg_key>, ... are special in GLM's vocabulary
    call_start, call_end = "<tool_call>", "</tool_call>"

    def parse_call(self, body, request, complete, final):
        m = re.match(r"\s*([^\s<]+)\s*(?=<arg_key>|$)", body) if complete else \
            re.match(r"\s*([^\s<]+)(?:\s+|(?=<))", body)
        if m is None:
            return None
        name = m.group(1)
        schema = tool_parameters(request, name)
        rest = body[m.end():]
        params = []
        for k, v in closed_items(rest, "<arg_key>", "</arg_key>", "</arg_value>"):
            v = v.lstrip()
            if not v.startswith("<arg_value>"):
                return None
            k = k.strip()
            params.append((k, convert_param(v[len("<arg_value>"):], schema.get(k))))
        if complete and _ARG.sub("", rest).strip():
            return None  # text that is no argument
        return [ToolCall(name, params_json(params, complete))]
