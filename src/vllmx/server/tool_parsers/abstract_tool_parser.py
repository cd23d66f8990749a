"""The tool parser interface (vLLM's ToolParser, extract_tool_calls / ExtractedToolCallInformation).

One method does the work: parse(text, request, final) reads a model's output, or the part of
it generated so far, into content and calls. A streamed answer re-parses the text so far each
step and sends what grew (server/chat_output.py), so a parser holds back what it cannot place
yet (a marker's first characters, a name not closed) and keeps what it returns of an open call
a prefix of what the finished text gives: the streamed deltas then add up to the non-streamed
message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from vllmx.server.tool_parsers.utils import held_back, random_tool_call_id


@dataclass
class ToolCall:
    """One call: the function's name (None until it is read whole) and its arguments' JSON
    text (while streaming, the part read so far)."""

    name: str | None
    arguments: str = ""
    id: str | None = None  # the model's own id (kimi_k2); else the server makes one


@dataclass
class ParsedOutput:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ExtractedToolCallInformation:
    """vLLM's result of a non-streamed parse."""

    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None


class ToolParser:
    """Subclasses register a name (tool_parsers/__init__.py) and implement parse()."""

    name: ClassVar[str]
    # The parser reads markers that are special tokens in its models' vocabularies: the
    # detokenizer must keep them (vLLM's adjust_request sets skip_special_tokens=False).
    keeps_special_tokens: ClassVar[bool] = False
    # The id generator of the model family (mistral's tokenizer takes 9 alphanumerics).
    make_id = staticmethod(random_tool_call_id)

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    def parse(self, text: str, request, final: bool) -> ParsedOutput:
        raise NotImplementedError

    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        out = self.parse(model_output, request, final=True)
        return ExtractedToolCallInformation(bool(out.tool_calls), out.tool_calls,
                                            out.content or None)


class TaggedToolParser(ToolParser):
    """Formats where each call sits between a start and an end marker, with content text
    around the calls: parse_call() reads one call's body. A body that does not read as a call
    stays in the content as the model wrote it (no crash, nothing lost)."""

    call_start: ClassVar[str]
    call_end: ClassVar[str]
    # Markers dropped from the content (a section around the calls: kimi_k2, deepseek).
    section_markers: ClassVar[tuple[str, ...]] = ()

    def parse_call(self, body: str, request, complete: bool, final: bool) -> list[ToolCall] | None:
        """The call(s) in one body (complete: its end marker was seen); None if it is not one.
        While streaming (not final) an open body may give a call whose name is None."""
        raise NotImplementedError

    def parse(self, text: str, request, final: bool) -> ParsedOutput:
        content, calls, pos = [], [], 0
        markers = (self.call_start, *self.section_markers)

        def text_part(part: str) -> None:
            for m in self.section_markers:
                part = part.replace(m, "")
            # Whitespace between and after calls is the format's, not the answer's (vLLM's
            # content is the text before the first call); an open stretch of it is held.
            if not (calls and not part.strip()):
                content.append(part)

        while True:
            i = text.find(self.call_start, pos)
            if i < 0:
                tail = text[pos:]
                if not final:
                    tail = tail[:len(tail) - held_back(tail, markers)]
                text_part(tail)
                break
            text_part(text[pos:i])
            body_at = i + len(self.call_start)
            j = text.find(self.call_end, body_at)
            body = text[body_at:] if j < 0 else text[body_at:j]
            got = self.parse_call(body, request, complete=j >= 0, final=final)
            if got is None:
                if j < 0 and not final:
                    break  # an open body that may still become a call: hold it
                text_part(text[i:] if j < 0 else text[i:j + len(self.call_end)])
            else:
                calls.extend(got)
            if j < 0:
                break
            pos = j + len(self.call_end)
        return ParsedOutput("".join(content), calls)
