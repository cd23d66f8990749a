"""openai: gpt-oss's harmony format. The output is messages, each a header then
<|message|>BODY ended by <|end|>, <|call|> or <|return|> and the next one after <|start|>:
<|channel|>analysis<|message|>(reasoning)<|end|><|start|>assistant<|channel|>commentary
to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>; <|channel|>final<|message|>
carries the answer. Calls are the messages to functions.*; the analysis channel is the
openai_gptoss reasoning parser's (dropped here)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from vllmx.server.tool_parsers.abstract_tool_parser import ParsedOutput, ToolCall, ToolParser
from vllmx.server.tool_parsers.utils import held_back

START, MESSAGE = "<|start|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_MARKERS = (START, "<|channel|>", MESSAGE, *ENDS)


@dataclass
class HarmonyMessage:
    channel: str | None  # None: text outside any message (an answer already read out)
    recipient: str | None
    body: str | None  # None while the header is still open
    closed: bool


def _plain(text: str, final: bool) -> HarmonyMessage:
    """Text outside any message (the answer as the reasoning parser left it)."""
    return HarmonyMessage(None, None, text if final else text[:len(text) - held_back(
        text, _MARKERS)], True)


def harmony_messages(text: str, final: bool) -> list[HarmonyMessage]:
    """The messages in text; the last may be open (its body so far, end markers held)."""
    out = []
    for n, part in enumerate(text.split(START)):
        k = part.find(MESSAGE)
        if k < 0:
            if n > 0 or "<|channel|>" in part:
                out.append(HarmonyMessage(None, None, None, False))  # a header still open
            elif part:
                out.append(_plain(part, final))
            continue
        header, body = part[:k], part[k + len(MESSAGE):]
        ends = [(j, e) for j, e in ((body.find(e), e) for e in ENDS) if j >= 0]
        after = ""
        if ends:
            j, e = min(ends)
            body, after = body[:j], body[j + len(e):]
        elif not final:
            body = body[:len(body) - held_back(body, _MARKERS)]
        channel = re.search(r"<\|channel\|>\s*(\w+)", header)
        recipient = re.search(r"\bto=([^\s<]+)", header)
        out.append(HarmonyMessage(channel.group(1) if channel else "final",
                                  recipient.group(1) if recipient else None, body, bool(ends)))
        if after.strip():
            out.append(_plain(after, final))
    return out


def harmony_call_text(recipient: str, body: str, closed: bool) -> str:
    """A call message written back in harmony (what the openai tool parser reads)."""
    return (f"{START}<|channel|>commentary to={recipient} <|constrain|>json{MESSAGE}{body}"
            + ("<|call|>" if closed else ""))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class OpenAIToolParser(ToolParser):
    name = "openai"
    keeps_special_tokens = True

    def parse(self, text, request, final):
        content, calls = [], []
        for m in harmony_messages(text, final):
            if m.body is None:
                break  # an open header: what follows waits for it
            if m.recipient is not None and m.recipient.startswith("functions."):
                if final and not _is_json(m.body):
                    content.append(m.body)  # not arguments: the model's text as it is
                    continue
                calls.append(ToolCall(m.recipient[len("functions."):], m.body))
            elif m.channel != "analysis":
                content.append(m.body)
        return ParsedOutput("".join(content), calls)
