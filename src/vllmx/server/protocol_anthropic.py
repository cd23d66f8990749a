"""Request bodies of Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens),
with the fields vLLM 0.26's Anthropic entrypoint reads (same names). Unknown fields are accepted
and ignored, as Anthropic's newer fields would be; the content blocks vllmx cannot honour
(images) are refused by serving_messages.py, naming them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ContentBlock(_Model):
    type: Literal["text", "image", "document", "tool_use", "tool_result", "thinking",
                  "redacted_thinking"]
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    thinking: str | None = None  # thinking
    signature: str | None = None
    data: str | None = None  # redacted_thinking


class Message(_Model):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(_Model):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_for_tool(self):
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when type is 'tool'")
        return self


class JsonOutputFormat(_Model):
    type: Literal["json_schema"] = "json_schema"
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")


class OutputConfig(_Model):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class _Conversation(_Model):
    model: str
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("model")
    @classmethod
    def _model_given(cls, v):
        if not v:
            raise ValueError("model is required")
        return v


class MessagesRequest(_Conversation):
    max_tokens: int = Field(gt=0)
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None


class CountTokensRequest(_Conversation):
    pass
