"""POST /v1/chat/completions (vLLM's OpenAIServingChat): messages rendered with the chat
template, one engine request with n choices, streamed as SSE or returned whole."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from vllmx.outputs import Logprob
from vllmx.server.chat_output import ChatOutputParser, ChatStreamState
from vllmx.server.errors import OpenAIError, from_exception, sse_error
from vllmx.server.protocol import ChatCompletionRequest, ChatMessage
from vllmx.server.serving_engine import (
    OpenAIServing,
    drop_nulls,
    first_output,
    merge_async_iterators,
    prompt_logprobs_json,
    random_uuid,
    sse_chunks,
    stream_outputs,
)
from vllmx.server.tool_choice import plan_tools


def conversation(messages: list[ChatMessage]) -> list[dict]:
    """Messages as the chat template sees them (text parts joined), with their roles checked."""
    if not messages:
        raise OpenAIError("messages must contain at least one message", param="messages")
    out = []
    for i, m in enumerate(messages):
        # Any role reaches the chat template, as in vLLM (custom roles are its
        # CustomChatCompletionMessageParam); only an empty one is refused.
        if not m.role:
            raise OpenAIError(f"messages[{i}].role must not be empty",
                              param=f"messages[{i}].role")
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise OpenAIError(f"messages[{i}]: content part of type {part.get('type')!r} "
                                      f"is not supported (text only)",
                                      param=f"messages[{i}].content")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif content is None:
            content = ""  # vLLM's: no content is empty text (an assistant's tool-call turn)
        msg = {"role": m.role, "content": content}
        for key in ("name", "tool_call_id"):
            if getattr(m, key) is not None:
                msg[key] = getattr(m, key)
        # vLLM's `reasoning`, or its older `reasoning_content`; the template sees both names
        # (and `thinking`: tokenizer/chat_template.py)
        reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
        if reasoning is not None:
            msg["reasoning"] = reasoning
        if m.tool_calls is not None:
            msg["tool_calls"] = [_template_tool_call(c, f"messages[{i}].tool_calls[{j}]")
                                 for j, c in enumerate(m.tool_calls)]
        out.append(msg)
    return out


def _template_tool_call(call: dict, where: str) -> dict:
    """An assistant's earlier call as chat templates read it: arguments as a mapping (vLLM
    decodes the JSON text, as transformers' templates iterate or tojson them)."""
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise OpenAIError(f"{where}.function must be an object with a name", param=where)
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise OpenAIError(f"{where}.function.arguments is not JSON ({e})",
                              param=f"{where}.function.arguments") from e
    return {**call, "function": {**fn, "arguments": args}}


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


class OpenAIServingChat(OpenAIServing):
    def __init__(self, *args, chat_template: str | None = None,
                 enable_auto_tools: bool = False, tool_parser=None, reasoning_parser=None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.chat_template = chat_template
        # vLLM's --enable-auto-tool-choice / --tool-call-parser / --reasoning-parser: parser
        # classes, instantiated over the tokenizer once (they keep no per-request state).
        self.enable_auto_tools = enable_auto_tools
        self.tool_parser = tool_parser(None) if tool_parser is not None else None
        self.reasoning_parser = reasoning_parser(None) if reasoning_parser is not None else None
        # Whether the engine holds constraints back until this parser's reasoning has ended
        # (vLLM's structured_outputs_config reasoning_parser; `vllmx serve --reasoning-parser`
        # sets it): else a constrained output starts in its answer.
        soc = getattr(getattr(self.engine_client, "vllm_config", None),
                      "structured_outputs_config", None)
        self.grammar_after_reasoning = bool(
            reasoning_parser is not None and soc is not None and not soc.enable_in_reasoning
            and soc.reasoning_parser == reasoning_parser.name)

    def render(self, request, tools=None, for_generation: bool = False) -> tuple[str, list[int]]:
        """The prompt text and ids of a chat request (also used by /tokenize, which tokenizes
        any length; for_generation refuses a text that cannot fit before tokenizing it)."""
        conv = conversation(request.messages)
        if request.add_generation_prompt and request.continue_final_message:
            raise OpenAIError("Cannot set both `continue_final_message` and "
                              "`add_generation_prompt` to True.")
        if request.continue_final_message and conv[-1]["role"] != "assistant":
            raise OpenAIError("continue_final_message needs the last message to be the "
                              "assistant's", param="continue_final_message")
        if request.chat_template is not None:
            raise OpenAIError("chat_template in the request is not allowed; start the server "
                              "with --chat-template", param="chat_template")
        try:
            text = self.tokenizer.apply_chat_template(
                conv, add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message, tokenize=False,
                chat_template=self.chat_template, tools=tools,
                documents=getattr(request, "documents", None),
                **(request.chat_template_kwargs or {}))
        except (ValueError, TypeError) as e:
            raise OpenAIError(f"chat template error: {e}") from e
        if for_generation:
            return text, self.encode_prompt(text, request.add_special_tokens,
                                            request.truncate_prompt_tokens, "messages")
        return text, self.tokenizer.encode(text, add_special_tokens=request.add_special_tokens)

    async def create_chat_completion(self, request: ChatCompletionRequest,
                                     request_id: str | None):
        # Rendering, tokenizing and checking run in a worker thread: never on the event loop.
        text, ids, params, reader = await asyncio.to_thread(self.prepare, request)
        request_id = f"chatcmpl-{request.request_id or request_id or random_uuid()}"
        merged = merge_async_iterators(self.generate(
            {"prompt": text, "prompt_token_ids": ids}, params, request_id, request.priority,
            request.model))
        created = int(time.time())
        model = request.model or self.served_model_names[0]
        echo = ""
        if request.echo and request.messages and request.messages[-1].role == "assistant":
            echo = conversation(request.messages[-1:])[0]["content"] or ""
        prompt = (text, ids)
        if request.stream:
            first = await first_output(merged)
            return self._stream(request, prompt, merged, first, request_id, created, model,
                                echo, reader)
        return await self._full(request, prompt, merged, request_id, created, model, echo,
                                reader)

    def prepare(self, request: ChatCompletionRequest):
        """(prompt text, prompt ids, SamplingParams, the ChatOutputParser that reads its
        output) of a chat request."""
        self.check_model(request.model)
        self.check_unsupported(request)
        plan = plan_tools(request, self.enable_auto_tools and self.tool_parser is not None)
        if plan.schema is not None:  # required / named: forced through structured outputs
            request.structured_outputs = {"json": plan.schema}
        # Parsers that read special tokens need them in the text (vLLM's adjust_request).
        if (plan.mode == "auto" and self.tool_parser.keeps_special_tokens
                or self.reasoning_parser is not None
                and self.reasoning_parser.keeps_special_tokens):
            request.skip_special_tokens = False
        top = request.top_logprobs
        limit = self.max_logprobs
        # -1 (vLLM's): the whole vocabulary, which the engine checks against --max-logprobs.
        if top is not None and top != -1 and not (0 <= top <= limit or limit == -1 and top >= 0):
            raise OpenAIError(f"top_logprobs must be in [0, {limit}], got {top}",
                              param="top_logprobs")
        if top and not request.logprobs:
            raise OpenAIError("when using `top_logprobs`, `logprobs` must be set to true.",
                              param="top_logprobs")
        text, ids = self.render(request, plan.tools, for_generation=True)
        ids = self.truncate(ids, request.truncate_prompt_tokens)
        # max_completion_tokens replaces max_tokens; 0 is a value (rejected), not "unset".
        max_tokens = (request.max_completion_tokens if request.max_completion_tokens is not None
                      else request.max_tokens)
        max_tokens = self.max_tokens_for(len(ids), max_tokens, "messages")
        params = self.sampling_params(request, max_tokens,
                                      (top or 0) if request.logprobs else None,
                                      request.prompt_logprobs)
        reader = ChatOutputParser(plan, self.tool_parser, self.reasoning_parser, request, text,
                                  getattr(params, "structured_outputs", None) is not None
                                  and not self.grammar_after_reasoning)
        return text, ids, params, reader

    def logprobs(self, request, token_ids: list[int],
                  logprobs: list[dict[int, Logprob]] | None) -> dict | None:
        if not request.logprobs:
            return None
        k = request.top_logprobs or 0
        if k == -1:  # the whole vocabulary
            k = float("inf")
        name = self.token_namer(request)
        content = []
        for tok_id, step in zip(token_ids, logprobs or []):
            lp = step.get(tok_id)
            token = name(tok_id, lp)
            top = sorted((p.rank, t, p) for t, p in step.items()
                         if p.rank is not None and p.rank <= k)
            content.append({
                "token": token, "logprob": max(lp.logprob, -9999.0) if lp else -9999.0,
                "bytes": _token_bytes(token),
                "top_logprobs": [{"token": name(t, p), "logprob": max(p.logprob, -9999.0),
                                  "bytes": _token_bytes(name(t, p))}
                                 for _, t, p in top]})
        return {"content": content}

    async def _full(self, request, prompt, merged, request_id, created, model,
                    echo, reader: ChatOutputParser) -> dict:
        choices: dict[int, dict] = {}
        prompt_logprobs = None
        cached, timestamps = 0, None
        try:
            async for _, out in merged:
                cached, timestamps = out.num_cached_tokens, out.metrics
                if out.prompt_logprobs is not None:
                    prompt_logprobs = out.prompt_logprobs
                for c in out.outputs:
                    ch = choices.setdefault(c.index, {"text": [], "token_ids": [],
                                                      "logprobs": [], "finish_reason": None,
                                                      "stop_reason": None})
                    ch["text"].append(c.text)
                    ch["token_ids"].extend(c.token_ids)
                    ch["logprobs"].extend(c.logprobs or [])
                    if c.finish_reason is not None:
                        ch["finish_reason"], ch["stop_reason"] = c.finish_reason, c.stop_reason
        except Exception as e:
            raise from_exception(e) from e
        # The answer's logprobs decode tokens (CPU work that grows with the output): off the
        # event loop.
        return await asyncio.to_thread(self._response, request, prompt, choices,
                                       request_id, created, model, echo, reader,
                                       prompt_logprobs, cached, timestamps)

    def _response(self, request, prompt, choices, request_id, created, model,
                  echo, reader: ChatOutputParser, prompt_logprobs=None, cached=0,
                  timestamps=None) -> dict:
        """vLLM's ChatCompletionResponse, every key (its model_dump): the ids with
        return_token_ids, the templated prompt with return_prompt_text, null for what vllmx
        has no source of (routed experts, transfer params, per-request timing metrics)."""
        text, ids = prompt
        result, completion_tokens = [], 0
        for idx in sorted(choices):
            ch = choices[idx]
            completion_tokens += len(ch["token_ids"])
            message = reader.message("".join(ch["text"]))
            if echo:
                message["content"] = echo + (message["content"] or "")
            result.append({
                "index": idx, "message": message,
                "logprobs": self.logprobs(request, ch["token_ids"], ch["logprobs"]),
                "finish_reason": reader.finish_reason(bool(message.get("tool_calls")),
                                                      ch["finish_reason"]),
                "stop_reason": ch["stop_reason"],
                "token_ids": ch["token_ids"] if request.return_token_ids else None,
                "routed_experts": None})
        return {"id": request_id, "object": "chat.completion", "created": created,
                "model": model, "choices": result, "service_tier": None,
                "system_fingerprint": self.system_fingerprint,
                "usage": self.usage(len(ids), completion_tokens, cached),
                "prompt_logprobs": prompt_logprobs_json(prompt_logprobs),
                "prompt_token_ids": list(ids) if request.return_token_ids else None,
                "prompt_text": text if request.return_prompt_text else None,
                "kv_transfer_params": None, "ec_transfer_params": None,
                "metrics": self.timing(timestamps, completion_tokens, request.n == 1)}

    async def _stream(self, request, prompt, merged, first, request_id, created, model,
                      echo, reader: ChatOutputParser) -> AsyncIterator[str]:
        text, ids = prompt
        num_prompt = len(ids)
        include_usage, continuous = self.include_usage(request)
        with_ids = bool(request.return_token_ids)
        num_tokens = [0] * request.n
        cached, timestamps = 0, None

        def usage():  # continuous_usage_stats: the counts alone, as vLLM's chunks have them
            return self.usage(num_prompt, sum(num_tokens), stream=True) if continuous else None

        write = sse_chunks(request_id, "chat.completion.chunk", created, model)

        try:
            # The first chunk (vLLM's) carries the prompt's ids and text where asked for.
            extra = {}
            if with_ids:
                extra["prompt_token_ids"] = list(ids)
            if request.return_prompt_text:
                extra["prompt_text"] = text
            for i in range(request.n):
                yield write([{"index": i, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}],
                            usage(), extra if i == 0 else None)
                if echo:
                    yield write([{"index": i, "delta": {"content": echo}, "logprobs": None,
                                  "finish_reason": None}], usage())

            states = [ChatStreamState(reader) for _ in range(request.n)]
            async for _, out in stream_outputs(first, merged):
                cached, timestamps = out.num_cached_tokens, out.metrics
                for c in out.outputs:
                    num_tokens[c.index] += len(c.token_ids)
                    logprobs = self.logprobs(request, c.token_ids, c.logprobs)
                    state = states[c.index]
                    deltas = state.step(c.text, final=c.finish_reason is not None)
                    # (with return_token_ids a step's tokens are sent even without text)
                    if (not deltas and c.finish_reason is None and not logprobs
                            and not (with_ids and c.token_ids)):
                        continue
                    # The step's logprobs and token ids ride on its first chunk, the finish
                    # on its last.
                    deltas = deltas or [{}]
                    finish = reader.finish_reason(bool(state.calls), c.finish_reason)
                    for k, delta in enumerate(deltas):
                        last = k == len(deltas) - 1
                        # vLLM's: the fingerprint on a choice's last chunk, unless a usage
                        # chunk follows (it is the stream's last then).
                        stamp = (last and finish is not None and not include_usage
                                 and self.system_fingerprint is not None)
                        yield write([{"index": c.index, "delta": delta,
                                      "logprobs": logprobs if k == 0 else None,
                                      "finish_reason": finish if last else None,
                                      "stop_reason": c.stop_reason if last else None,
                                      "token_ids": list(c.token_ids) if with_ids and k == 0
                                      else None}],
                                    usage(),
                                    {"system_fingerprint": self.system_fingerprint}
                                    if stamp else None)
            if include_usage:
                g = sum(num_tokens)
                extra = {"system_fingerprint": self.system_fingerprint,
                         "metrics": drop_nulls(self.timing(timestamps, g, request.n == 1))}
                yield write([], self.usage(num_prompt, g, cached, stream=True), drop_nulls(extra))
        except Exception as e:  # noqa: BLE001 - the stream ends with the error event
            yield sse_error(e)
        finally:
            await merged.aclose()
        yield "data: [DONE]\n\n"
