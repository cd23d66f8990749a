"""pythonic: Llama 3.2 / Llama 4 / ToolACE calls as a Python list of calls,
[get_weather(city='Paris', days=3), f()], optionally between <|python_start|> and
<|python_end|>. Arguments must be literals; a stream sends each call once it is closed."""

from __future__ import annotations

import ast
import json
import re

from vllmx.server.tool_parsers.abstract_tool_parser import ParsedOutput, ToolCall, ToolParser
from vllmx.server.tool_parsers.utils import held_back

START, END = "<|python_start|>", "<|python_end|>"


def _literal(node: ast.AST):
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]  # JSON spellings
    return ast.literal_eval(node)


def _call(node: ast.AST) -> ToolCall:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        raise ValueError("not a call with keyword arguments")
    args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
    return ToolCall(node.func.id, json.dumps(args, ensure_ascii=False))


# Quoted strings (group q set when closed), brackets, and runs of anything else: the scan
# below steps a token at a time, so re-reading a long open call each step stays cheap.
_TOKEN = re.compile(r"""'[^'\\\n]*(?:\\.[^'\\\n]*)*(?P<q>')?|"[^"\\\n]*(?:\\.[^"\\\n]*)*(?P<qq>")?"""
                    r"""|[()\[\]{}]|[^'"()\[\]{}]+""", re.DOTALL)


def _closed_calls(body: str) -> list[str]:
    """The source of each call inside an unfinished list whose closing parenthesis has come."""
    out, depth, start = [], 0, None
    for m in _TOKEN.finditer(body):
        tok = m.group()
        if tok[0] in "'\"":
            if m.group("q") is None and m.group("qq") is None:
                break  # an open string
        elif tok in "([{":
            depth += 1
        elif tok in ")]}":
            depth -= 1
            if depth == 0 and tok == ")" and start is not None:
                out.append(body[start:m.end()].strip())
                start = None
        elif depth == 0 and start is None and tok.strip(", \n\t"):
            start = m.start() + len(tok) - len(tok.lstrip(", \n\t"))
    return out


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def parse(self, text, request, final):
        body = text.strip()
        if body.startswith(START):
            body = body[len(START):].removesuffix(END).strip()
            if not final:
                body = body[:len(body) - held_back(body, (END,))]
                if not body:
                    return ParsedOutput("")
        elif not final and START.startswith(body):  # nothing yet, or maybe <|python_start|>
            return ParsedOutput("")
        if not body.startswith("["):
            return ParsedOutput(text)
        if not final:
            try:
                return ParsedOutput("", [_call(ast.parse(src, mode="eval").body)
                                         for src in _closed_calls(body[1:])])
            except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
                return ParsedOutput("")
        try:
            tree = ast.parse(body, mode="eval").body
            if isinstance(tree, ast.List):
                return ParsedOutput("", [_call(e) for e in tree.elts])
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            pass
        return ParsedOutput(text)  # not a list of calls: the text is the answer


class Llama4PythonicToolParser(PythonicToolParser):
    """Llama 4's pythonic calls, between <|python_start|> and <|python_end|> (read by the
    pythonic parser as well)."""

    name = "llama4_pythonic"
    keeps_special_tokens = True  # <|python_start|> is special
