"""qwen3_coder / qwen3_xml: Qwen3-Coder's (and Qwen3.5's) XML calls,
<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>;
values are typed by the tool's JSON schema (strings stay text). A stream sends each parameter
as it closes."""

from __future__ import annotations

import re

from vllmx.server.tool_parsers.abstract_tool_parser import TaggedToolParser, ToolCall
from vllmx.server.tool_parsers.utils import (
    closed_items,
    convert_param,
    params_json,
    tool_parameters,
)


def xml_value(raw: str) -> str:
    """A value without the newline the format puts on each side of it."""
    raw = raw.removeprefix("\n")
    return raw.removesuffix("\n")


class Qwen3CoderToolParser(TaggedToolParser):
    name = "qwen3_coder"
    call_start, call_end = "<tool_call>", "</tool_call>"

    def parse_call(self, body, request, complete, final):
        m = re.match(r"\s*<function=([^>\n]+)>", body)
        if m is None:
            return None  # not a call, or (open) its name is not closed yet
        name = m.group(1).strip()
        rest = body[m.end():]
        fn_end = rest.find("</function>")
        closed = fn_end >= 0 or complete
        if fn_end >= 0:
            if rest[fn_end + len("</function>"):].strip():
                return None
            rest = rest[:fn_end] + "</function>"
        elif complete:
            rest += "</function>"  # vLLM reads a call whose </function> is missing
        elif final:
            return None  # cut off inside the call
        schema = tool_parameters(request, name)
        params = [(k.strip(), convert_param(xml_value(v), schema.get(k.strip()))
                   if k.strip() in schema else xml_value(v))
                  for k, v in closed_items(rest, "<parameter=", ">", "</parameter>",
                                           ("</function>",))]
        return [ToolCall(name, params_json(params, closed))]


class Qwen3XMLToolParser(Qwen3CoderToolParser):
    """vLLM's qwen3_xml reads the same format with a streaming XML parser."""

    name = "qwen3_xml"


class SeedOssToolParser(Qwen3CoderToolParser):
    """seed_oss: Seed-OSS writes the same calls inside <seed:tool_call> ... </seed:tool_call>."""

    name = "seed_oss"
    keeps_special_tokens = True
    call_start, call_end = "<seed:tool_call>", "</seed:tool_call>"
