"""POST /v1/responses, GET / DELETE /v1/responses/{id} and POST /v1/responses/{id}/cancel
(vLLM's OpenAIServingResponses, without harmony, built-in tools or background mode).

A Responses request is read as a chat request (responses_input.py) and run by the chat path,
whose template rendering, tool plans, structured outputs and tool / reasoning parsers it shares;
its output becomes Responses items (responses_output.py). Responses with store=true are kept
in memory for GET and previous_response_id, at most max_stored_responses of them (the oldest
go first): vLLM's store, bounded."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http import HTTPStatus

from vllmx.server.chat_output import ChatOutputParser, ChatStreamState
from vllmx.server.errors import OpenAIError, from_exception
from vllmx.server.protocol import ChatCompletionRequest, ChatMessage
from vllmx.server.protocol_responses import ResponsesRequest
from vllmx.server.responses_input import check_unsupported, items_to_messages, to_chat_request
from vllmx.server.responses_output import ResponseEventStream, output_items
from vllmx.server.serving_chat import OpenAIServingChat
from vllmx.server.serving_engine import (
    first_output,
    merge_async_iterators,
    random_uuid,
    stream_outputs,
)

DEFAULT_MAX_STORED_RESPONSES = 1024
# Chat's tool errors name tools[i].function.x; a Responses tool keeps x at its top.
_CHAT_TOOL_PATH = re.compile(r"(tools\[\d+\])\.function\b")


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


@dataclass
class ResponseRun:
    """What reading one response's output needs."""

    chat_request: ChatCompletionRequest
    reader: ChatOutputParser
    base: dict  # the response's fields besides output, status and usage
    num_prompt: int
    messages: list[ChatMessage]  # the conversation, kept with the response


class StoredResponse:
    def __init__(self, response: dict, messages: list[ChatMessage]):
        self.response = response
        self.messages = messages  # the conversation it answered, without its instructions


class OpenAIServingResponses:
    def __init__(self, chat: OpenAIServingChat,
                 max_stored_responses: int = DEFAULT_MAX_STORED_RESPONSES):
        if max_stored_responses < 0:
            raise ValueError(f"max_stored_responses must be >= 0, got {max_stored_responses}")
        self.chat = chat
        self.max_stored_responses = max_stored_responses
        self.store: OrderedDict[str, StoredResponse] = OrderedDict()
        # Finished responses are kept from worker threads while the loop reads and deletes.
        self.store_lock = threading.Lock()

    # -- the store ------------------------------------------------------------------------------
    def _stored(self, response_id: str, pop: bool = False) -> StoredResponse:
        with self.store_lock:
            got = self.store.pop(response_id, None) if pop else self.store.get(response_id)
        if got is None:
            raise OpenAIError(f"Response with id '{response_id}' not found.",
                              HTTPStatus.NOT_FOUND, param="response_id")
        return got

    def _keep(self, response: dict, messages: list[ChatMessage]) -> None:
        with self.store_lock:
            self.store[response["id"]] = StoredResponse(response, messages)
            while len(self.store) > self.max_stored_responses:
                self.store.popitem(last=False)

    def retrieve(self, response_id: str) -> dict:
        return self._stored(response_id).response

    def delete(self, response_id: str) -> dict:
        self._stored(response_id, pop=True)
        return {"id": response_id, "object": "response", "deleted": True}

    def cancel(self, response_id: str) -> dict:
        """vLLM's: only a background response can be cancelled, and this server runs none."""
        self._stored(response_id)
        raise OpenAIError("Cannot cancel a synchronous response.")

    # -- creating a response ----------------------------------------------------------------------
    def _prepare(self, request: ResponsesRequest):
        """(conversation, chat request, prompt text and ids, SamplingParams, output reader)."""
        self.chat.check_model(request.model)
        check_unsupported(request)
        messages, call_ids = [], set()
        if request.previous_response_id is not None:
            prev = self._stored(request.previous_response_id)
            messages = [m.model_copy(deep=True) for m in prev.messages]
            items_to_messages(prev.response["output"], call_ids, "previous output", messages)
        if isinstance(request.input, str):
            messages.append(ChatMessage(role="user", content=request.input))
        else:
            items_to_messages(request.input, call_ids, "input", messages)
        chat_request = to_chat_request(request, messages)
        try:
            text, ids, params, reader = self.chat.prepare(chat_request)
        except OpenAIError as e:
            e.message = _CHAT_TOOL_PATH.sub(r"\1", e.message)
            e.param = e.param and _CHAT_TOOL_PATH.sub(r"\1", e.param)
            if e.param == "max_tokens":
                e.param = "max_output_tokens"
            raise
        return messages, chat_request, text, ids, params, reader

    async def create_responses(self, request: ResponsesRequest, request_id: str | None):
        messages, chat_request, text, ids, params, reader = await asyncio.to_thread(
            self._prepare, request)
        response_id = f"resp_{request.request_id or request_id or random_uuid()}"
        merged = merge_async_iterators(self.chat.generate(
            {"prompt": text, "prompt_token_ids": ids}, params, response_id, request.priority))
        run = ResponseRun(chat_request, reader, self._base(request, response_id, params),
                          len(ids), messages)
        if request.stream:
            return self._stream(run, merged, await first_output(merged))
        pieces, token_ids, logprobs, finish, cached = [], [], [], None, 0
        try:
            async for _, out in merged:
                cached = out.num_cached_tokens
                for c in out.outputs:
                    pieces.append(c.text)
                    token_ids.extend(c.token_ids)
                    logprobs.extend(c.logprobs or [])
                    finish = c.finish_reason or finish
        except Exception as e:
            raise from_exception(e) from e
        return await asyncio.to_thread(self._full, run, "".join(pieces), token_ids, logprobs,
                                       finish, cached)

    def _base(self, request: ResponsesRequest, response_id: str, params) -> dict:
        """The response's fields besides its output, status and usage (the request's echoed,
        with the sampling values that were used)."""
        return {
            "id": response_id, "object": "response", "created_at": int(time.time()),
            "model": request.model or self.chat.served_model_names[0],
            "instructions": request.instructions, "error": None, "incomplete_details": None,
            "max_output_tokens": request.max_output_tokens,
            "max_tool_calls": request.max_tool_calls, "metadata": request.metadata,
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": request.previous_response_id,
            "reasoning": request.reasoning, "service_tier": request.service_tier,
            "store": bool(request.store) and self.max_stored_responses > 0,
            "temperature": getattr(params, "temperature", request.temperature),
            "text": request.text or {"format": {"type": "text"}},
            "tool_choice": request.tool_choice, "tools": request.tools,
            "top_logprobs": request.top_logprobs, "top_p": getattr(params, "top_p", None),
            "truncation": request.truncation, "user": request.user, "background": False,
        }

    def _finish(self, run: ResponseRun, output: list[dict], finish: str | None,
                num_output: int, cached: int) -> dict:
        """The finished response (kept when store is set)."""
        reasoning = "".join(c["text"] for item in output if item["type"] == "reasoning"
                            for c in item["content"])
        # The reasoning's share of the output, counted by the tokenizer (the parser reads
        # text, not token ids).
        num_reasoning = (len(self.chat.tokenizer.encode(reasoning, add_special_tokens=False))
                         if reasoning else 0)
        status, num_prompt = status_of(finish), run.num_prompt
        response = {**run.base, "status": status, "output": output, "usage": {
            "input_tokens": num_prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": num_output,
            "output_tokens_details": {"reasoning_tokens": num_reasoning},
            "total_tokens": num_prompt + num_output}}
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        if run.base["store"]:
            self._keep(response, run.messages)
        return response

    def _full(self, run: ResponseRun, text: str, token_ids: list[int], logprobs: list,
              finish: str | None, cached: int) -> dict:
        lps = self.chat.logprobs(run.chat_request, token_ids, logprobs)
        output = output_items(run.reader.message(text), lps and lps["content"],
                              status_of(finish))
        return self._finish(run, output, finish, len(token_ids), cached)

    async def _stream(self, run: ResponseRun, merged, first) -> AsyncIterator[str]:
        events = ResponseEventStream()
        num_output, cached, finish = 0, 0, None
        try:
            started = {**run.base, "status": "in_progress", "output": [], "usage": None}
            yield events.event("response.created", response=started)
            yield events.event("response.in_progress", response=started)

            state = ChatStreamState(run.reader)
            async for _, out in stream_outputs(first, merged):
                cached = out.num_cached_tokens
                for c in out.outputs:
                    num_output += len(c.token_ids)
                    finish = c.finish_reason or finish
                    lps = self.chat.logprobs(run.chat_request, c.token_ids, c.logprobs)
                    deltas = state.step(c.text, final=c.finish_reason is not None)
                    for e in events.step(deltas, lps and lps["content"]):
                        yield e
            for e in events.finish(status_of(finish)):
                yield e
            response = await asyncio.to_thread(self._finish, run, events.output, finish,
                                               num_output, cached)
            yield events.event("response.completed", response=response)
        except Exception as e:  # noqa: BLE001 - the stream ends with the error event
            err = from_exception(e)
            yield events.event("error", code=str(int(err.status)), message=err.message,
                               param=err.param)
        finally:
            await merged.aclose()
