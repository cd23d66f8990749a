"""functiongemma: FunctionGemma's calls,
<start_function_call>call:NAME{key:<escape>text<escape>,n:3,flag:true}<end_function_call>;
strings between <escape> markers, other values bare, objects {k:v} and lists [v, ...] nested.
A stream sends each argument as it ends."""

from __future__ import annotations

import json

from vllmx.server.tool_parsers.abstract_tool_parser import TaggedToolParser, ToolCall
from vllmx.server.tool_parsers.utils import params_json

ESC = "<escape>"


class _Open(Exception):
    """The text ends inside a value."""


def _value(s: str, i: int):
    """(value, end) of the value at s[i]; _Open if the text ends first, ValueError if bad."""
    if s.startswith(ESC, i):
        j = s.find(ESC, i + len(ESC))
        if j < 0:
            raise _Open
        return s[i + len(ESC):j], j + len(ESC)
    if ESC.startswith(s[i:]) and i < len(s):
        raise _Open
    if i < len(s) and s[i] in "{[":
        close = "}" if s[i] == "{" else "]"
        out: dict | list = {} if close == "}" else []
        i += 1
        while True:
            if i >= len(s):
                raise _Open
            if s[i] == close:
                return out, i + 1
            if s[i] == ",":
                i += 1
                continue
            if close == "}":
                k = s.find(":", i)
                if k < 0:
                    raise _Open
                key = s[i:k].strip()
                v, i = _value(s, k + 1)
                out[key] = v
            else:
                v, i = _value(s, i)
                out.append(v)
    j = i
    while j < len(s) and s[j] not in ",}]":
        j += 1
    if j >= len(s):
        raise _Open
    word = s[i:j].strip()
    try:
        return json.loads(word), j
    except ValueError:
        return word, j


class FunctionGemmaToolParser(TaggedToolParser):
    name = "functiongemma"
    keeps_special_tokens = True
    call_start, call_end = "<start_function_call>", "<end_function_call>"

    def parse_call(self, body, request, complete, final):
        if not body.startswith("call:"):
            return None
        b = body.find("{")
        if b < 0:
            return None
        name = body[len("call:"):b].strip()
        params, i = [], b + 1
        try:
            while True:
                if i >= len(body):
                    raise _Open
                if body[i] == "}":
                    if body[i + 1:].strip():
                        return None
                    return [ToolCall(name, params_json(params, True))]
                if body[i] == ",":
                    i += 1
                    continue
                k = body.find(":", i)
                if k < 0:
                    raise _Open
                key = body[i:k].strip()
                value, i = _value(body, k + 1)
                params.append((key, value))
        except _Open:
            return None if complete or not name else [ToolCall(name, params_json(params, False))]
        except (ValueError, IndexError):
            return None
