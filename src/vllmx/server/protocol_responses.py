"""The request body of POST /v1/responses (vLLM's ResponsesRequest, OpenAI's field names). Input
items, tools and text.format stay plain dicts here: responses_input.py checks them one by one,
so that a bad item is a 400 naming where it is (input[2].content[0].type), not a wall of
pydantic union errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from vllmx.server.protocol import OpenAIBaseModel, Seed


class ResponsesRequest(OpenAIBaseModel):
    # OpenAI's fields, in its documentation's order
    background: bool | None = False
    include: list[str] | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: bool | None = True
    stream: bool | None = False
    temperature: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int | None = 0
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    conversation: str | dict[str, Any] | None = None
    # vLLM's extra parameters
    top_k: int | None = None
    seed: Seed | None = None
    logit_bias: dict[str, float] | None = None
    skip_special_tokens: bool = True
    request_id: str | None = None
    priority: int = 0
