"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), as vLLM 0.26 serves
it: a Messages request is read as the chat request it stands for and run by the chat path (its
template, tool plans, structured outputs, tool and reasoning parsers); the chat answer becomes
an Anthropic message, streamed as Anthropic's events.

Reading the request: `system` (text or text blocks) is the system message; a user message's
text blocks are its content and its tool_result blocks become tool messages before it; an
assistant message's tool_use blocks become its tool_calls (input as JSON arguments) and its
thinking blocks its reasoning; tools become functions (input_schema as parameters);
tool_choice auto / any / tool / none become auto / required / a named function / none;
stop_sequences are stop strings; output_config.format a JSON-schema response_format and its
effort the template's reasoning_effort. Images and documents are a 400 naming the block.

The answer: content blocks thinking (the reasoning, with a signature), text, tool_use (the call's
arguments as input); one empty text block when there is nothing, as Anthropic sends.
stop_reason as Anthropic defines it: end_turn, max_tokens, tool_use, and stop_sequence with
the matched stop_sequence where a stop string ended it (vLLM maps that one to end_turn);
usage input_tokens / output_tokens, and with --enable-prompt-tokens-details the prefix-cache
hit as cache_read_input_tokens (input_tokens the rest, Anthropic's split). Errors, the body's
validation included, come in Anthropic's shape ({"type": "error", "error": {type, message}}).
The server's API key is taken from Anthropic's x-api-key header too (app.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from http import HTTPStatus

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from vllmx.server.chat_output import ChatOutputParser, ChatStreamState
from vllmx.server.errors import OpenAIError, from_exception, pydantic_message
from vllmx.server.protocol import ChatCompletionRequest, ChatMessage
from vllmx.server.protocol_anthropic import (
    ContentBlock,
    CountTokensRequest,
    Message,
    MessagesRequest,
)
from vllmx.server.serving_chat import OpenAIServingChat
from vllmx.server.serving_engine import (
    first_output,
    merge_async_iterators,
    random_uuid,
    stream_outputs,
)

_UNSUPPORTED_BLOCKS = ("image", "document")


def _text_of(content, where: str) -> str:
    """Text content: a string, or text blocks joined (tool results may hold such lists)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for k, b in enumerate(content):
        kind = b.type if isinstance(b, ContentBlock) else b.get("type")
        text = b.text if isinstance(b, ContentBlock) else b.get("text")
        if kind != "text" or not isinstance(text, str):
            raise OpenAIError(f"{where}[{k}]: content of type {kind!r} is not supported here "
                              f"(text only)", param=f"{where}[{k}]")
        parts.append(text)
    return "\n".join(parts)


def _messages(m: Message, where: str) -> list[ChatMessage]:
    """One Anthropic message as chat messages (a user turn's tool results first, as tool
    messages)."""
    if isinstance(m.content, str):
        return [ChatMessage(role=m.role, content=m.content)]
    texts, calls, reasoning, out = [], [], [], []
    for k, b in enumerate(m.content):
        at = f"{where}.content[{k}]"
        if b.type in _UNSUPPORTED_BLOCKS:
            raise OpenAIError(f"{at}: {b.type} content is not supported (text, tool_use, "
                              f"tool_result and thinking blocks)", param=at)
        if b.type == "text":
            texts.append(b.text or "")
        elif b.type == "tool_use":
            if m.role != "assistant" or not b.name:
                raise OpenAIError(f"{at}: a tool_use block belongs to an assistant message "
                                  f"and names its tool", param=at)
            calls.append({"id": b.id or f"toolu_{random_uuid()}", "type": "function",
                          "function": {"name": b.name, "arguments": json.dumps(b.input or {})}})
        elif b.type == "tool_result":
            if m.role != "user":
                raise OpenAIError(f"{at}: a tool_result block belongs to a user message",
                                  param=at)
            out.append(ChatMessage(role="tool", tool_call_id=b.tool_use_id or "",
                                   content=_text_of(b.content, f"{at}.content")))
        elif b.type == "thinking":
            reasoning.append(b.thinking or "")
        # redacted_thinking: nothing the template could show
    if texts or calls or reasoning or not out:
        out.append(ChatMessage(role=m.role, content="\n".join(texts),
                               tool_calls=calls or None,
                               reasoning="".join(reasoning) if reasoning else None))
    return out


def to_chat_request(req: MessagesRequest | CountTokensRequest) -> ChatCompletionRequest:
    """The chat request a Messages (or count_tokens) request stands for."""
    messages = []
    if req.system:
        messages.append(ChatMessage(role="system", content=_text_of(req.system, "system")))
    for i, m in enumerate(req.messages):
        messages.extend(_messages(m, f"messages[{i}]"))
    fields: dict = {"model": req.model, "messages": messages,
                    "chat_template_kwargs": dict(req.chat_template_kwargs or {})}
    if req.tools is not None:
        fields["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description or "",
            "parameters": {"type": "object", **t.input_schema}}} for t in req.tools]
    if req.tool_choice is not None:
        tc = req.tool_choice
        fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
            tc.type, {"type": "function", "function": {"name": tc.name}})
        if tc.disable_parallel_tool_use:
            fields["parallel_tool_calls"] = False
    if isinstance(req, MessagesRequest):
        fields.update(max_tokens=req.max_tokens, stop=req.stop_sequences,
                      temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                      stream=bool(req.stream))
        oc = req.output_config
        if oc is not None and oc.format is not None and oc.format.json_schema is not None:
            fields["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": oc.format.json_schema}}
        if oc is not None and oc.effort is not None:
            fields["chat_template_kwargs"]["reasoning_effort"] = oc.effort
    return ChatCompletionRequest(**fields)


def stop_reason(finish: str | None, stop: int | str | None,
                called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) as Anthropic defines them."""
    if called:
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


def _tool_input(arguments: str) -> dict:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise OpenAIError(f"a tool call's arguments are not a JSON object: {arguments[:200]!r}",
                          param="tools")
    return value


class AnthropicServingMessages:
    def __init__(self, chat: OpenAIServingChat):
        self.chat = chat

    def _prepare(self, request: MessagesRequest):
        """(prompt text, prompt ids, SamplingParams, the chat output reader)."""
        return self.chat.prepare(to_chat_request(request))

    def usage(self, num_prompt: int, num_output: int, cached: int) -> dict:
        if self.chat.enable_prompt_tokens_details:
            return {"input_tokens": num_prompt - cached, "output_tokens": num_output,
                    "cache_read_input_tokens": cached}
        return {"input_tokens": num_prompt, "output_tokens": num_output}

    async def count_tokens(self, request: CountTokensRequest) -> dict:
        self.chat.check_model(request.model)
        chat_request = to_chat_request(request)
        _, ids = await asyncio.to_thread(self.chat.render, chat_request,
                                         chat_request.tools)
        return {"input_tokens": len(ids)}

    async def create_messages(self, request: MessagesRequest, request_id: str | None):
        text, ids, params, reader = await asyncio.to_thread(self._prepare, request)
        msg_id = f"msg_{request_id or random_uuid()}"
        merged = merge_async_iterators(self.chat.generate(
            {"prompt": text, "prompt_token_ids": ids}, params, msg_id, 0, request.model))
        model = request.model
        if request.stream:
            first = await first_output(merged)
            return self._stream(msg_id, model, len(ids), reader, merged, first)
        pieces, num_output, finish, stop, cached = [], 0, None, None, 0
        try:
            async for _, out in merged:
                cached = out.num_cached_tokens
                for c in out.outputs:
                    pieces.append(c.text)
                    num_output += len(c.token_ids)
                    if c.finish_reason is not None:
                        finish, stop = c.finish_reason, c.stop_reason
        except Exception as e:
            raise from_exception(e) from e
        message = reader.message("".join(pieces))
        content = []
        if message["reasoning"]:
            content.append({"type": "thinking", "thinking": message["reasoning"],
                            "signature": uuid.uuid4().hex})
        if message["content"]:
            content.append({"type": "text", "text": message["content"]})
        calls = message.get("tool_calls", [])
        for call in calls:
            content.append({"type": "tool_use", "id": call["id"],
                            "name": call["function"]["name"],
                            "input": _tool_input(call["function"]["arguments"])})
        reason, sequence = stop_reason(finish, stop, bool(calls))
        return {"id": msg_id, "type": "message", "role": "assistant", "model": model,
                "content": content or [{"type": "text", "text": ""}],
                "stop_reason": reason, "stop_sequence": sequence,
                "usage": self.usage(len(ids), num_output, cached)}

    async def _stream(self, msg_id: str, model: str, num_prompt: int,
                      reader: ChatOutputParser, merged, first) -> AsyncIterator[str]:
        """Anthropic's events: message_start, per content block content_block_start /
        _delta (text_delta, thinking_delta then signature_delta, input_json_delta) / _stop,
        message_delta (stop_reason, output tokens), message_stop; an error event if the
        request fails on the way."""
        blocks = _BlockEvents()
        num_output, finish, stop, cached = 0, None, None, 0
        try:
            yield _event("message_start", message={
                "id": msg_id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": num_prompt, "output_tokens": 0}})
            state = ChatStreamState(reader)
            async for _, out in stream_outputs(first, merged):
                cached = out.num_cached_tokens
                for c in out.outputs:
                    num_output += len(c.token_ids)
                    if c.finish_reason is not None:
                        finish, stop = c.finish_reason, c.stop_reason
                    for delta in state.step(c.text, final=c.finish_reason is not None):
                        for e in blocks.delta(delta):
                            yield e
            for e in blocks.finish():
                yield e
            reason, sequence = stop_reason(finish, stop, bool(state.calls))
            yield _event("message_delta",
                         delta={"stop_reason": reason, "stop_sequence": sequence},
                         usage=self.usage(num_prompt, num_output, cached))
            yield _event("message_stop")
        except Exception as e:  # noqa: BLE001 - the stream ends with the error event
            err = from_exception(e)
            yield _event("error", error={"type": anthropic_error_type(err.status),
                                         "message": err.message})
        finally:
            await merged.aclose()


def _event(kind: str, **body) -> str:
    """One server-sent event of Anthropic's stream."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body})}\n\n"


class _BlockEvents:
    """A streamed message's content blocks: the one open (its index and kind), opened and
    closed as the chat deltas change kind."""

    def __init__(self):
        self.index, self.kind = -1, None

    def _close(self) -> list[str]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":  # Anthropic ends a thinking block with its signature
            out.append(_event("content_block_delta", index=self.index, delta={
                "type": "signature_delta", "signature": uuid.uuid4().hex}))
        out.append(_event("content_block_stop", index=self.index))
        self.kind = None
        return out

    def _open(self, content_block: dict) -> list[str]:
        out = self._close()
        self.index += 1
        self.kind = content_block["type"]
        out.append(_event("content_block_start", index=self.index, content_block=content_block))
        return out

    def _add(self, delta: dict) -> str:
        return _event("content_block_delta", index=self.index, delta=delta)

    def delta(self, delta: dict) -> list[str]:
        """The events of one chat delta ({"reasoning"}, {"content"} or {"tool_calls"})."""
        out = []
        if "reasoning" in delta:
            if self.kind != "thinking":
                out += self._open({"type": "thinking", "thinking": ""})
            out.append(self._add({"type": "thinking_delta", "thinking": delta["reasoning"]}))
        if delta.get("content"):
            if self.kind != "text":
                out += self._open({"type": "text", "text": ""})
            out.append(self._add({"type": "text_delta", "text": delta["content"]}))
        for tc in delta.get("tool_calls", []):
            if "id" in tc:  # a call's first delta: its name
                out += self._open({"type": "tool_use", "id": tc["id"],
                                   "name": tc["function"]["name"], "input": {}})
            if tc["function"].get("arguments"):
                out.append(self._add({"type": "input_json_delta",
                                      "partial_json": tc["function"]["arguments"]}))
        return out

    def finish(self) -> list[str]:
        """The last block closed; one empty text block if there was none, as Anthropic sends."""
        out = self._open({"type": "text", "text": ""}) if self.index < 0 else []
        return out + self._close()


def anthropic_error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            503: "overloaded_error"}.get(int(status), "api_error")


def anthropic_error_response(message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                             param: str | None = None, err_type: str | None = None):
    """An error in Anthropic's shape (respond's on_error for /v1/messages)."""
    return JSONResponse({"type": "error", "error": {"type": anthropic_error_type(status),
                                                    "message": message}},
                        status_code=int(status))


def add_messages_routes(v1: APIRouter, messages: AnthropicServingMessages, respond,
                        check_generative) -> None:
    """POST /v1/messages and /v1/messages/count_tokens (respond: the app's runner of a
    handler; check_generative: its refusal on a pooling model). The body is validated here,
    so that its errors too come in Anthropic's shape."""

    async def parse(request: Request, model):
        try:
            return model.model_validate(await request.json())
        except ValidationError as e:
            message, param = pydantic_message(e.errors())
            raise OpenAIError(message, param=param) from None
        except ValueError as e:  # not JSON
            raise OpenAIError(f"Invalid JSON: {e}") from None

    @v1.post("/messages")
    async def create_messages(request: Request):
        async def work():
            check_generative("Messages")
            body = await parse(request, MessagesRequest)
            return await messages.create_messages(body, request.headers.get("X-Request-Id"))

        return await respond(work(), request, on_error=anthropic_error_response)

    @v1.post("/messages/count_tokens")
    async def count_tokens(request: Request):
        async def work():
            check_generative("Messages")
            return await messages.count_tokens(await parse(request, CountTokensRequest))

        return await respond(work(), request, on_error=anthropic_error_response)
