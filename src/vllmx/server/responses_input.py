"""A Responses request read as the chat completion request it stands for (vLLM's
construct_input_messages and construct_tool_dicts): instructions become the system message,
input items become chat messages (function_call items an assistant's tool_calls,
function_call_output items tool messages, reasoning items the next assistant message's
reasoning), function tools move under "function", tool_choice and text.format take
chat's shapes. The chat path then renders, plans tools and parses the output as it does for
chat, so nothing here repeats it. What cannot be honoured is a 400 naming the field."""

from __future__ import annotations

import json

from vllmx.server.errors import OpenAIError
from vllmx.server.protocol import ChatCompletionRequest, ChatMessage, ResponseFormat
from vllmx.server.protocol_responses import ResponsesRequest

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")
_TOOL_CHOICES = ("auto", "none", "required")
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def check_unsupported(request: ResponsesRequest) -> None:
    """The fields vllmx's Responses API cannot honour (vLLM's subset)."""
    if request.background:
        raise OpenAIError("background mode is not supported by this server; send the request "
                          "without `background` (or stream it)", param="background")
    if request.prompt is not None:
        raise OpenAIError("prompt template is not supported", param="prompt")
    if request.conversation is not None:
        raise OpenAIError("conversations are not supported; continue a response with "
                          "previous_response_id", param="conversation")
    if request.truncation == "auto":
        raise OpenAIError("truncation 'auto' is not supported (the input must fit the "
                          "context)", param="truncation")
    for i, item in enumerate(request.include or []):
        if item != LOGPROBS_INCLUDE:
            raise OpenAIError(f"include[{i}]: {item!r} is not supported (only "
                              f"{LOGPROBS_INCLUDE!r})", param=f"include[{i}]")


def _text(content, where: str) -> str:
    """A content string, or a list of text parts joined (as chat joins its text parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(f"{where} must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise OpenAIError(f"{where}[{j}]: content part of type {kind!r} is not supported "
                              f"(input_text and output_text only)", param=f"{where}[{j}]")
        texts.append(part["text"])
    return "\n".join(texts)


def _reasoning_text(item: dict, where: str) -> str:
    if item.get("encrypted_content"):
        raise OpenAIError(f"{where}: encrypted reasoning content is not supported",
                          param=f"{where}.encrypted_content")
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(
            p.get("text"), str) for p in parts):
        raise OpenAIError(f"{where}.content must be a list of reasoning_text parts",
                          param=f"{where}.content")
    return "\n".join(p["text"] for p in parts)


def _last_assistant(messages: list[ChatMessage]) -> ChatMessage | None:
    return messages[-1] if messages and messages[-1].role == "assistant" else None


def items_to_messages(items: list[dict], call_ids: set[str], what: str = "input",
                      messages: list[ChatMessage] | None = None) -> list[ChatMessage]:
    """Input (or an earlier response's output) items appended to messages as chat messages.
    call_ids collects the function calls seen, so that each function_call_output answers one
    (OpenAI's check)."""
    messages = [] if messages is None else messages
    for i, item in enumerate(items):
        where = f"{what}[{i}]"
        kind = item.get("type", "message")
        last = _last_assistant(messages)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise OpenAIError(f"{where}.role must be one of {', '.join(_ROLES)}, got "
                                  f"{role!r}", param=f"{where}.role")
            text = _text(item.get("content"), f"{where}.content")
            if role == "assistant" and last is not None and not last.content \
                    and not last.tool_calls:  # the reasoning item before it
                last.content = text
            else:
                messages.append(ChatMessage(role=role, content=text))
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            for key, value in (("call_id", call_id), ("name", name), ("arguments", args)):
                if not isinstance(value, str) or not value and key != "arguments":
                    raise OpenAIError(f"{where}.{key} must be a non-empty string",
                                      param=f"{where}.{key}")
            try:
                json.loads(args or "{}")
            except ValueError as e:
                raise OpenAIError(f"{where}.arguments is not JSON ({e})",
                                  param=f"{where}.arguments") from e
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": args}}
            if last is None:  # the calls of one turn are one assistant message
                last = ChatMessage(role="assistant", content="")
                messages.append(last)
            last.tool_calls = [*(last.tool_calls or []), call]
            call_ids.add(call_id)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in call_ids:
                raise OpenAIError(f"{where}: no function_call found for call_id {call_id!r}",
                                  param=f"{where}.call_id")
            messages.append(ChatMessage(role="tool", tool_call_id=call_id,
                                        content=_text(item.get("output"), f"{where}.output")))
        elif kind == "reasoning":
            messages.append(ChatMessage(role="assistant", content="",
                                        reasoning=_reasoning_text(item, where)))
        else:
            raise OpenAIError(f"{where}.type {kind!r} is not supported (message, function_call, "
                              f"function_call_output and reasoning items only)",
                              param=f"{where}.type")
    return messages


def chat_tools(tools: list[dict]) -> list[dict] | None:
    """Function tools in chat's shape; built-in tools (web_search, file_search, mcp, ...) are
    not run by this server."""
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise OpenAIError(f"tools[{i}].type {tool.get('type')!r} is not supported (function "
                              f"tools only)", param=f"tools[{i}].type")
        out.append({"type": "function", "function": {
            k: v for k, v in tool.items() if k not in ("type", "strict")}})
    return out or None


def chat_tool_choice(choice, has_tools: bool):
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise OpenAIError(f"tool_choice must be one of {', '.join(_TOOL_CHOICES)} or "
                              f"{{\"type\": \"function\", \"name\": ...}}, got {choice!r}",
                              param="tool_choice")
        # "auto" is the Responses default: without tools it asks for nothing.
        return None if choice == "auto" and not has_tools else choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise OpenAIError(f"tool_choice {json.dumps(choice)[:200]} is not supported (a function "
                          f'tool only: {{"type": "function", "name": "my_function"}})',
                          param="tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def response_format(text: dict | None) -> ResponseFormat | None:
    """text.format as chat's response_format (json_schema: name, schema, strict at its top)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        return ResponseFormat(type=kind)
    if kind != "json_schema":
        raise OpenAIError(f"text.format.type must be text, json_object or json_schema, got "
                          f"{kind!r}", param="text.format.type")
    if not isinstance(fmt.get("schema"), (dict, bool)):
        raise OpenAIError("text.format of type json_schema needs schema, a JSON schema object",
                          param="text.format.schema")
    return ResponseFormat(type="json_schema", json_schema={
        k: v for k, v in fmt.items() if k != "type"})


def to_chat_request(request: ResponsesRequest, messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request over messages (the conversation so far, this input included)."""
    if not messages:
        raise OpenAIError("input must not be empty", param="input")
    if request.instructions:
        messages = [ChatMessage(role="system", content=request.instructions), *messages]
    tools = chat_tools(request.tools)
    effort = (request.reasoning or {}).get("effort")
    logprobs = LOGPROBS_INCLUDE in (request.include or [])
    return ChatCompletionRequest(
        messages=messages, model=request.model, max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
        seed=request.seed, logit_bias=request.logit_bias, tools=tools,
        tool_choice=chat_tool_choice(request.tool_choice, tools is not None),
        parallel_tool_calls=request.parallel_tool_calls,
        response_format=response_format(request.text), priority=request.priority,
        skip_special_tokens=request.skip_special_tokens, logprobs=logprobs,
        top_logprobs=request.top_logprobs if logprobs else 0,
        # vLLM's chat path hands reasoning_effort to the template (gpt-oss, qwen3 read it).
        chat_template_kwargs={"reasoning_effort": effort} if effort else None)
