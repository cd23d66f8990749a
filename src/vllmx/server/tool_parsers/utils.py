"""What the tool parsers share: JSON scanning that tolerates a text cut anywhere (streaming
re-parses the text so far), held-back marker prefixes, parameter values typed by the tool's
schema, and call ids."""

from __future__ import annotations

import ast
import json
import random
import re
import string
import uuid
from typing import Any

_WS = " \t\r\n"


def random_tool_call_id() -> str:
    """vLLM's id of a parsed call."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def mistral_tool_call_id() -> str:
    """Mistral's tokenizer accepts 9 alphanumeric characters as a call id (and nothing else),
    so that the id can be sent back in the next turn."""
    return "".join(random.choices(string.ascii_letters + string.digits, k=9))


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of text could be the start of one of the markers: a
    stream holds them back until the next text says whether a marker begins there."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


# A JSON string (group 1 set when it is closed), or one bracket. Scanning by these tokens
# keeps the per-character work in the regex engine: a stream re-reads an open call's
# arguments every step, so a Python loop per character would cost quadratic time on the event
# loop (seconds for a 20 kB argument).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(")?', re.DOTALL)
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(")?|[{}\[\]]', re.DOTALL)
_WORD_END = re.compile(r"[,}\] \t\r\n]")


def json_value_end(s: str, i: int) -> int | None:
    """The end of the JSON value starting at s[i], or None while the text ends inside it (an
    object, array or string not closed yet, or a bare word the text may still extend)."""
    if i >= len(s):
        return None
    c = s[i]
    if c == '"':
        m = _STRING.match(s, i)
        return m.end() if m.group(1) is not None else None
    if c in "{[":
        depth = 0
        for m in _TOKEN.finditer(s, i):
            tok = m.group()
            if tok[0] == '"':
                if m.group(1) is None:
                    return None
            elif tok in "{[":
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    return m.end()
        return None
    m = _WORD_END.search(s, i)
    return m.start() if m else None


class PartialObject:
    """A JSON object read as far as the text goes: its complete string members, the raw text
    of chosen members (whole, or up to the text's end while still open), and where the object
    ends (None while open). Raw text, not re-serialized JSON, so that what a stream sends of an
    open value is always a prefix of the final value."""

    def __init__(self, s: str, i: int, raw_keys: tuple[str, ...] = ()):
        self.strings: dict[str, str] = {}
        self.raw: dict[str, str] = {}  # key -> the value's text (maybe unfinished)
        self.raw_done: dict[str, bool] = {}
        self.end: int | None = None
        self.valid = True  # False once the text cannot be a JSON object
        self._read(s, i, raw_keys)

    def _read(self, s: str, i: int, raw_keys) -> None:
        if i >= len(s) or s[i] != "{":
            self.valid = i >= len(s)
            return
        i += 1
        while True:
            i = skip_ws(s, i)
            if i >= len(s):
                return
            if s[i] == "}":
                self.end = i + 1
                return
            if s[i] == ",":
                i = skip_ws(s, i + 1)
                if i >= len(s):
                    return
            if s[i] != '"':
                self.valid = False
                return
            kend = json_value_end(s, i)
            if kend is None:
                return
            try:
                key = json.loads(s[i:kend])
            except ValueError:
                self.valid = False
                return
            i = skip_ws(s, kend)
            if i >= len(s):
                return
            if s[i] != ":":
                self.valid = False
                return
            i = skip_ws(s, i + 1)
            if i >= len(s):
                return
            vend = json_value_end(s, i)
            if key in raw_keys:
                self.raw[key] = s[i:] if vend is None else s[i:vend]
                self.raw_done[key] = vend is not None
            if vend is None:
                return
            if s[i] == '"':
                try:
                    self.strings[key] = json.loads(s[i:vend])
                except ValueError:
                    self.valid = False
                    return
            i = vend


def call_from_object(s: str, i: int, final: bool,
                     args_keys: tuple[str, ...] = ("arguments", "parameters")):
    """(name, arguments text, arguments complete, end) of a {"name": ..., "arguments": {...}}
    object at s[i]; None when it cannot be one. Arguments given as a JSON string holding an
    object (some models encode them twice) are unwrapped once complete."""
    obj = PartialObject(s, i, args_keys)
    if not obj.valid:
        return None
    name = obj.strings.get("name")
    key = next((k for k in args_keys if k in obj.raw), None)
    args = obj.raw.get(key, "") if key else ""
    done = obj.raw_done.get(key, False) if key else False
    if obj.end is not None:
        try:
            whole = json.loads(s[i:obj.end])
        except ValueError:
            return None
        if not isinstance(whole.get("name"), str):
            return None
        value = whole.get(key) if key else {}
        if isinstance(value, str):  # arguments encoded as a JSON string
            try:
                value = json.loads(value)
            except ValueError:
                return None
            args = json.dumps(value, ensure_ascii=False)
        if not isinstance(value, dict):
            return None
        return name, args or "{}", True, obj.end
    if final:
        return None
    if args.startswith('"'):  # a string-encoded object: sent whole once it is complete
        args, done = "", False
    return name, args, done, None


def closed_items(text: str, start_tag: str, name_end: str, close_tag: str,
                 stops: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(name, value) of each START_TAG name NAME_END value CLOSE_TAG in text, in order; an item
    whose close tag is missing ends where the next item or a stop string begins; the open last
    item is left out. str.find only: a stream re-reads an open call every step, and lazy
    regexes over a long value would cost seconds in all."""
    out, pos = [], 0
    while True:
        i = text.find(start_tag, pos)
        if i < 0:
            return out
        j = text.find(name_end, i + len(start_tag))
        if j < 0:
            return out
        v = j + len(name_end)
        ends = [(k, n) for k, n in ((text.find(close_tag, v), len(close_tag)),
                                    *((text.find(t, v), 0) for t in (start_tag, *stops)))
                if k >= 0]
        if not ends:
            return out
        k, skip = min(ends)
        out.append((text[i + len(start_tag):j], text[v:k]))
        pos = k + skip


def params_json(params: list[tuple[str, Any]], complete: bool) -> str:
    """Arguments built from parsed parameters, as json.dumps writes the dict; open (no closing
    brace) until the call is complete, so that a stream can send each parameter as it ends."""
    body = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                     for k, v in params)
    return "{" + body + ("}" if complete else "")


def tool_parameters(request, name: str) -> dict:
    """The JSON schema's properties of the request's tool `name` ({} if unknown)."""
    for tool in getattr(request, "tools", None) or []:
        fn = tool.get("function") or {}
        if fn.get("name") == name:
            params = fn.get("parameters") or {}
            return params.get("properties") or {} if isinstance(params, dict) else {}
    return {}


def convert_param(value: str, schema: dict | None) -> Any:
    """A parameter's text as its schema's type says (XML-style formats carry no JSON types):
    strings stay text; numbers, booleans, objects and arrays are read as JSON (Python
    literals as a fallback); text that does not read stays a string."""
    types = (schema or {}).get("type", "")
    types = types if isinstance(types, list) else [types]
    if "string" in types and not {"integer", "number", "boolean", "object", "array"} & set(types):
        return value
    if value.strip().lower() == "null":
        return None
    try:
        out = json.loads(value)
    except ValueError:
        try:
            out = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return value
    if "integer" in types and isinstance(out, float) and out.is_integer():
        return int(out)
    return out
