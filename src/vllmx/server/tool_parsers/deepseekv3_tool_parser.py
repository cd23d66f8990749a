"""deepseek_v3 and deepseek_v31: DeepSeek's calls inside <｜tool▁calls▁begin｜> ...
<｜tool▁calls▁end｜>, each <｜tool▁call▁begin｜>...<｜tool▁call▁end｜>. V3 / R1-0528 write
function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```; V3.1 writes NAME<｜tool▁sep｜>ARGS."""

from __future__ import annotations

from vllmx.server.tool_parsers.abstract_tool_parser import TaggedToolParser, ToolCall
from vllmx.server.tool_parsers.utils import json_value_end, skip_ws

SEP = "<｜tool▁sep｜>"


def raw_json_args(body: str, i: int, complete: bool, tail: str = "") -> tuple[str, bool] | None:
    """The arguments object at body[i] as written: (text, closed); None if malformed. After
    the object only `tail` (and whitespace) may follow once the call is complete."""
    i = skip_ws(body, i)
    if i >= len(body):
        return None if complete else ("", False)
    if body[i] != "{":
        return None
    end = json_value_end(body, i)
    if end is None:
        return None if complete else (body[i:], False)
    rest = body[end:].strip()
    if complete and rest != tail.strip() or not tail.strip().startswith(rest):
        return None
    return body[i:end], True


class DeepSeekV3ToolParser(TaggedToolParser):
    name = "deepseek_v3"
    keeps_special_tokens = True
    call_start, call_end = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
    section_markers = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")

    def parse_call(self, body, request, complete, final):
        k = body.find(SEP)
        if k < 0:
            return None
        nl = body.find("\n", k)
        if nl < 0:
            return None  # the name is not closed yet (or, complete, no arguments)
        name = body[k + len(SEP):nl].strip()
        fence = "```json\n"
        rest = body[nl + 1:]
        if not rest.startswith(fence):
            return None if complete or not fence.startswith(rest) else [ToolCall(name)]
        got = raw_json_args(rest, len(fence), complete, "\n```")
        return None if got is None or not name else [ToolCall(name, got[0])]


class DeepSeekV31ToolParser(DeepSeekV3ToolParser):
    name = "deepseek_v31"

    def parse_call(self, body, request, complete, final):
        k = body.find(SEP)
        if k < 0:
            return None
        name = body[:k].strip()
        got = raw_json_args(body, k + len(SEP), complete)
        return None if got is None or not name else [ToolCall(name, got[0])]
