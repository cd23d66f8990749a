"""openai_gptoss: gpt-oss's reasoning, the harmony analysis channel. The answer keeps the
final channel's text and the call messages (written back in harmony for the openai tool
parser)."""

from __future__ import annotations

from vllmx.reasoning.abs_reasoning_parsers import ReasoningParser
from vllmx.server.tool_parsers.openai_tool_parser import harmony_call_text, harmony_messages


class GptOssReasoningParser(ReasoningParser):
    name = "openai_gptoss"
    keeps_special_tokens = True  # the harmony markers are special tokens
    reasoning_start = "<|channel|>analysis<|message|>"
    reasoning_end = "<|channel|>final<|message|>"

    def parse(self, text, final, in_reasoning):
        reasoning, content = [], []
        for m in harmony_messages(text, final):
            if m.body is None:
                break
            if m.channel == "analysis":
                reasoning.append(m.body)
            elif m.recipient is not None:
                content.append(harmony_call_text(m.recipient, m.body, m.closed or final))
            else:
                content.append(m.body)
        return ("".join(reasoning) if reasoning else None), "".join(content)
