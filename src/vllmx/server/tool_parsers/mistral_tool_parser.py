"""mistral: [TOOL_CALLS] then either a JSON list [{"name": "f", "arguments": {...}}, ...]
(tokenizers before v11) or one f[ARGS]{...} per call, each after its own [TOOL_CALLS] (v11 and
later, Magistral / Devstral / Mistral Small 3.2; an optional [CALL_ID]id before [ARGS])."""

from __future__ import annotations

from vllmx.server.tool_parsers.abstract_tool_parser import ParsedOutput, ToolCall, ToolParser
from vllmx.server.tool_parsers.llama_tool_parser import json_call_sequence
from vllmx.server.tool_parsers.utils import (
    held_back,
    json_value_end,
    mistral_tool_call_id,
    skip_ws,
)

BOT, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def _named_call(seg: str, final: bool) -> ToolCall | None:
    """One v11 call, name[CALL_ID]id[ARGS]{...}; None if malformed."""
    k = seg.find(ARGS)
    if k < 0:
        if final or "{" in seg:
            return None
        return ToolCall(None)  # the name may still be coming
    name = seg[:k].split(CALL_ID)[0].strip()
    if not name or any(c in name for c in " \n{}[]"):
        return None
    i = skip_ws(seg, k + len(ARGS))
    if i >= len(seg):
        return None if final else ToolCall(name, "")
    if seg[i] != "{":
        return None
    end = json_value_end(seg, i)
    if end is None:
        return None if final else ToolCall(name, seg[i:])
    if seg[end:].strip():
        return None
    return ToolCall(name, seg[i:end])


class MistralToolParser(ToolParser):
    name = "mistral"
    keeps_special_tokens = True  # [TOOL_CALLS] / [ARGS] are control tokens
    make_id = staticmethod(mistral_tool_call_id)

    def parse(self, text, request, final):
        i = text.find(BOT)
        if i < 0:
            return ParsedOutput(text if final else text[:len(text) - held_back(text, (BOT,))])
        content, rest = text[:i], text[i + len(BOT):]
        j = skip_ws(rest, 0)
        if j >= len(rest):
            return ParsedOutput(text if final else content)
        if rest[j] == "[":
            got = json_call_sequence(rest, j + 1, final, ",", close="]")
            if got is None or final and got[1] is not None and rest[got[1]:].strip():
                return ParsedOutput(text if final else content)
            return ParsedOutput(content, got[0])
        calls = []
        segs = rest.split(BOT)
        for n, seg in enumerate(segs):
            last = n == len(segs) - 1
            if last and not final:
                seg = seg[:len(seg) - held_back(seg, (BOT,))]
            call = _named_call(seg, final or not last)
            if call is None:
                return ParsedOutput(text if final else content)
            calls.append(call)
        return ParsedOutput(content, calls)
