"""One chat choice's output read as an assistant message: the reasoning parser splits off
the reasoning, then the answer is read by the tool plan (auto: the --tool-call-parser;
required: the forced JSON list; named: the forced arguments; none: content as it is).

Streaming re-reads the text so far each step and sends what grew since the last step, in
vLLM's delta shapes ({"reasoning"}, {"content"}, {"tool_calls": [{index, id, type,
function: {name, arguments: ""}}]} then {"tool_calls": [{index, function: {arguments}}]}), so
the deltas add up to the message the same output gives unstreamed."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from vllmx.reasoning import ReasoningParser
from vllmx.server.tool_choice import ToolPlan
from vllmx.server.tool_parsers import ParsedOutput, ToolCall, ToolParser
from vllmx.server.tool_parsers.llama_tool_parser import json_call_sequence
from vllmx.server.tool_parsers.utils import random_tool_call_id, skip_ws

logger = logging.getLogger("vllmx")


def _required_calls(text: str, final: bool) -> ParsedOutput:
    """tool_choice "required": the answer is a JSON list of {"name", "parameters"}."""
    i = skip_ws(text, 0)
    if i >= len(text) or text[i] != "[":
        return ParsedOutput(text if final or i < len(text) else "")
    got = json_call_sequence(text, i + 1, final, ",", close="]")
    if got is None or final and got[1] is None:
        return ParsedOutput(text if final else "")
    return ParsedOutput("", got[0])


@dataclass
class Message:
    reasoning: str | None
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


class ChatOutputParser:
    """How one request's choices are read (shared by its choices: parsers keep no state)."""

    def __init__(self, plan: ToolPlan, tool_parser: ToolParser | None,
                 reasoning_parser: ReasoningParser | None, request, prompt: str,
                 constrained: bool = False):
        self.plan, self.tool_parser, self.reasoning_parser = plan, tool_parser, reasoning_parser
        self.request = request
        # constrained: a structured-output constraint holds from the first token (the engine
        # has no reasoning parser to defer it past the reasoning), so the output starts in the
        # answer; only a start marker the constraint itself writes opens reasoning.
        self.in_reasoning = (reasoning_parser.starts_in_reasoning(prompt)
                             if reasoning_parser is not None and not constrained else False)
        if plan.mode == "auto" and tool_parser is not None:
            self.make_id = tool_parser.make_id
        else:
            self.make_id = random_tool_call_id

    @property
    def passthrough(self) -> bool:
        """Nothing to read: content is the text as generated."""
        return self.reasoning_parser is None and self.plan.mode == "none"

    def parse(self, text: str, final: bool) -> Message:
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning, text = self.reasoning_parser.parse(text, final, self.in_reasoning)
        mode = self.plan.mode
        if mode == "auto":
            out = self.tool_parser.parse(text, self.request, final)
        elif mode == "required":
            out = _required_calls(text, final)
        elif mode == "named":
            out = ParsedOutput("", [ToolCall(self.plan.named, text)])
        else:
            out = ParsedOutput(text)
        calls = out.tool_calls if self.plan.parallel else out.tool_calls[:1]
        return Message(reasoning, out.content, calls)

    def finish_reason(self, calls: bool, finish_reason: str | None) -> str | None:
        """vLLM's: "tool_calls" when auto found calls or required ended; a named function's
        call ends with "stop" (as OpenAI's)."""
        if finish_reason == "stop" and calls and self.plan.mode in ("auto", "required"):
            return "tool_calls"
        return finish_reason

    def message(self, text: str) -> dict:
        m = self.parse(text, final=True)
        calls = [{"id": c.id or self.make_id(), "type": "function",
                  "function": {"name": c.name, "arguments": c.arguments}}
                 for c in m.tool_calls if c.name is not None]
        # vLLM's: a forced call (named or required) comes with content "", never null; auto
        # calls with no text besides them with null.
        forced = self.plan.mode in ("named", "required")
        # vLLM's ChatMessage: OpenAI's fields (null where vllmx has no source of them),
        # tool_calls only when there are some, and its `reasoning` (which replaced
        # reasoning_content).
        message = {"role": "assistant",
                   "content": m.content if m.content or forced or not calls else None,
                   "refusal": None, "annotations": None, "audio": None, "function_call": None}
        if calls:
            message["tool_calls"] = calls
        message["reasoning"] = m.reasoning or None
        return message


class ChatStreamState:
    """What one streamed choice has sent so far."""

    def __init__(self, parser: ChatOutputParser):
        self.parser = parser
        self.text = ""
        self.reasoning = ""
        self.content = ""
        self.calls: list[list[str]] = []  # [id, arguments sent]

    def step(self, delta_text: str, final: bool) -> list[dict]:
        """The deltas to send after delta_text (the last step: final)."""
        self.text += delta_text
        if self.parser.passthrough:
            return [{"content": delta_text}] if delta_text else []
        m = self.parser.parse(self.text, final)
        out = []
        for key, now in (("reasoning", m.reasoning or ""), ("content", m.content)):
            sent = getattr(self, key)
            if len(now) > len(sent) and now.startswith(sent):
                out.append({key: now[len(sent):]})
                setattr(self, key, now)
            elif not now.startswith(sent):
                logger.debug("stream: %s no longer extends what was sent", key)
        for i, call in enumerate(m.tool_calls):
            if call.name is None:
                break  # later calls wait for this one's name: indices stay in order
            if i == len(self.calls):
                self.calls.append([call.id or self.parser.make_id(), ""])
                out.append({"tool_calls": [{"index": i, "id": self.calls[i][0],
                                            "type": "function",
                                            "function": {"name": call.name, "arguments": ""}}]})
            sent = self.calls[i][1]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                out.append({"tool_calls": [{"index": i, "function": {
                    "arguments": call.arguments[len(sent):]}}]})
                self.calls[i][1] = call.arguments
        return out
