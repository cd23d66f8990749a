"""A response's output items (OpenAI's Responses shapes, vLLM's order: reasoning, then the
message, then function calls), whole or as the stream of events that builds them.

The stream is driven by the chat path's deltas (chat_output.ChatStreamState), which add up to
the message the same output gives unstreamed; each item is opened (output_item.added,
content_part.added), grown (…delta) and closed (…done, content_part.done, output_item.done)
as vLLM's simple streaming does, and the items it closed are the response's output."""

from __future__ import annotations

import json

from vllmx.server.serving_engine import random_uuid


def reasoning_item(item_id: str, text: str) -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": text}]}


def output_text(text: str, logprobs: list | None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(item_id: str, text: str, logprobs: list | None, status: str) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [output_text(text, logprobs)]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(message: dict, logprobs: list | None, status: str) -> list[dict]:
    """The items of a chat message (chat_output.ChatOutputParser.message). Whitespace the model
    wrote before its calls is no answer (vLLM's streaming drops it too)."""
    items = []
    if message["reasoning"]:
        items.append(reasoning_item(f"rs_{random_uuid()}", message["reasoning"]))
    content, calls = message["content"] or "", message.get("tool_calls", [])
    if content and not (calls and content.isspace()):
        items.append(message_item(f"msg_{random_uuid()}", content, logprobs, status))
    for c in calls:
        items.append(function_call_item(f"fc_{random_uuid()}", c["id"], c["function"]["name"],
                                        c["function"]["arguments"]))
    return items


class ResponseEventStream:
    """The SSE events of one streamed response, numbered from 0 (sequence_number)."""

    def __init__(self):
        self.sequence_number = 0
        self.output: list[dict] = []  # the items closed so far
        self.item: dict | None = None  # the open item
        self.text = ""  # the open item's text (reasoning, output text or arguments)
        self.logprobs: list = []
        self.pending_space = ""  # content held until it is more than whitespace
        self.pending_logprobs: list = []

    def event(self, kind: str, **fields) -> str:
        body = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def _where(self) -> dict:
        return {"output_index": len(self.output), "item_id": self.item["id"]}

    def _open(self, item: dict, part: dict | None) -> list[str]:
        self.item, self.text, self.logprobs = item, "", []
        out = [self.event("response.output_item.added", output_index=len(self.output),
                          item=item)]
        if part is not None:
            out.append(self.event("response.content_part.added", **self._where(),
                                  content_index=0, part=part))
        return out

    def close(self, status: str = "completed") -> list[str]:
        """Closes the open item (status: the message's, "incomplete" past max_output_tokens)."""
        if self.item is None:
            return []
        item, text, where = self.item, self.text, self._where()
        kind = item["type"]
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            out = [self.event("response.reasoning_text.done", **where, content_index=0,
                              text=text),
                   self.event("response.content_part.done", **where, content_index=0,
                              part=part)]
            done = reasoning_item(item["id"], text)
        elif kind == "message":
            out = [self.event("response.output_text.done", **where, content_index=0, text=text,
                              logprobs=self.logprobs),
                   self.event("response.content_part.done", **where, content_index=0,
                              part=output_text(text, self.logprobs))]
            done = message_item(item["id"], text, self.logprobs, status)
        else:
            out = [self.event("response.function_call_arguments.done", **where,
                              name=item["name"], arguments=text)]
            done = function_call_item(item["id"], item["call_id"], item["name"], text)
        out.append(self.event("response.output_item.done", output_index=len(self.output),
                              item=done))
        self.output.append(done)
        self.item = None
        return out

    def _open_message(self) -> list[str]:
        item = message_item(f"msg_{random_uuid()}", "", None, "in_progress") | {"content": []}
        return self.close() + self._open(item, output_text("", None))

    def _text_delta(self, delta: str, logprobs: list | None) -> str:
        self.text += delta
        self.logprobs += logprobs or []
        return self.event("response.output_text.delta", **self._where(), content_index=0,
                          delta=delta, logprobs=logprobs or [])

    def _content(self, delta: str, logprobs: list | None) -> list[str]:
        out = []
        if self.item is None or self.item["type"] != "message":
            if (self.pending_space + delta).isspace():
                self.pending_space += delta
                self.pending_logprobs += logprobs or []
                return []
            delta, self.pending_space = self.pending_space + delta, ""
            logprobs, self.pending_logprobs = self.pending_logprobs + (logprobs or []), []
            out = self._open_message()
        return [*out, self._text_delta(delta, logprobs)]

    def step(self, deltas: list[dict], logprobs: list | None) -> list[str]:
        """The events of one step's chat deltas; the step's logprobs ride on its text."""
        out = []
        for delta in deltas:
            if "reasoning" in delta:
                if self.item is None or self.item["type"] != "reasoning":
                    out += self.close()
                    out += self._open({"id": f"rs_{random_uuid()}", "type": "reasoning",
                                       "summary": [], "status": "in_progress"},
                                      {"type": "reasoning_text", "text": ""})
                self.text += delta["reasoning"]
                out.append(self.event("response.reasoning_text.delta", **self._where(),
                                      content_index=0, delta=delta["reasoning"]))
            elif "content" in delta:
                out += self._content(delta["content"], logprobs)
                logprobs = None
            else:
                call = delta["tool_calls"][0]
                fn = call["function"]
                if "id" in call:  # a new call: its name comes first, alone
                    self.pending_space, self.pending_logprobs = "", []
                    out += self.close()
                    out += self._open(function_call_item(f"fc_{random_uuid()}", call["id"],
                                                         fn["name"], "", "in_progress"), None)
                elif fn["arguments"]:
                    self.text += fn["arguments"]
                    out.append(self.event("response.function_call_arguments.delta",
                                          **self._where(), delta=fn["arguments"]))
        return out

    def finish(self, status: str) -> list[str]:
        """Closes the last item. Whitespace held back is still the answer when no call came
        (a call drops it), as unstreamed."""
        out = []
        if self.pending_space:
            out = [*self._open_message(), self._text_delta(self.pending_space,
                                                           self.pending_logprobs)]
            self.pending_space, self.pending_logprobs = "", []
        return out + self.close(status)
