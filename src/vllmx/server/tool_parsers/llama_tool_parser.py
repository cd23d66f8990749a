"""llama3_json: Llama 3.1 / 3.2 JSON calls, the whole output one or more objects
{"name": "f", "parameters": {...}} separated by "; ", optionally after <|python_tag|>."""

from __future__ import annotations

from vllmx.server.tool_parsers.abstract_tool_parser import ParsedOutput, ToolCall, ToolParser
from vllmx.server.tool_parsers.utils import call_from_object, skip_ws

BOT = "<|python_tag|>"


def json_call_sequence(text: str, i: int, final: bool, sep: str,
                       close: str | None = None) -> tuple[list[ToolCall], int | None] | None:
    """Call objects from text[i:] separated by sep (";" or ","), up to the close character if
    given (then also the index after it, None while open); None if the text is not such a
    sequence. Not final: the last object may be open."""
    calls: list[ToolCall] = []
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return (calls, None) if calls and close is None or not final else None
        if close is not None and text[i] == close and not calls:
            return calls, i + 1
        got = call_from_object(text, i, final)
        if got is None:
            return None
        name, args, _, end = got
        calls.append(ToolCall(name, args if name is not None else ""))
        if end is None:
            return calls, None
        i = skip_ws(text, end)
        if i >= len(text):
            return (calls, None) if close is None or not final else None
        if close is not None and text[i] == close:
            return calls, i + 1
        if text[i] != sep:
            return None
        i += 1


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    keeps_special_tokens = True  # <|python_tag|> is special

    def parse(self, text, request, final):
        i = skip_ws(text, 0)
        rest = text[i:]
        if not final and len(rest) < len(BOT) and BOT.startswith(rest):
            return ParsedOutput("")  # maybe <|python_tag|>: hold
        if rest.startswith(BOT):
            i = skip_ws(text, i + len(BOT))
        elif not rest.startswith("{"):
            return ParsedOutput(text)
        got = json_call_sequence(text, i, final, ";")
        if got is None:
            return ParsedOutput(text if final else "")
        return ParsedOutput("", got[0])


class Llama4JsonToolParser(Llama3JsonToolParser):
    """vLLM registers the same parser for Llama 4's JSON calls."""

    name = "llama4_json"
