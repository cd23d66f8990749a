"""granite: Granite 3.2's reasoning in prose, "Here is my thought process: ... Here is my
response: ..." ("Here's" also)."""

from __future__ import annotations

import re

from vllmx.reasoning.abs_reasoning_parsers import ReasoningParser
from vllmx.server.tool_parsers.utils import held_back

_STARTS = ("Here is my thought process:", "Here's my thought process:")
_ENDS = ("Here is my response:", "Here's my response:")
_END = re.compile(r"Here(?: is|'s) my response:")


class GraniteReasoningParser(ReasoningParser):
    name = "granite"
    reasoning_start, reasoning_end = _STARTS[0], _ENDS[0]

    def parse(self, text, final, in_reasoning):
        start = next((s for s in _STARTS if text.startswith(s)), None)
        if start is None:
            if not final and any(s.startswith(text) for s in _STARTS):
                return None, ""  # maybe the start phrase: hold
            return None, text
        body = text[len(start):]
        m = _END.search(body)
        if m is None:
            return body if final else body[:len(body) - held_back(body, _ENDS)], ""
        return body[:m.start()], body[m.end():]
