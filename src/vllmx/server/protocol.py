"""Request bodies of the OpenAI API with vLLM's extra parameters (same names as
vllm/entrypoints/openai/protocol.py). Responses are plain dicts built by the serving classes.

Unknown fields are accepted and ignored with a warning, as vLLM does, so that clients sending
newer OpenAI fields keep working; fields that are known but cannot be honoured yet (tools,
beam search, ...) are rejected by the serving code."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

logger = logging.getLogger("vllmx")

# Limits of one request, beyond what SamplingParams checks (the native sampler's ranges):
MAX_N = 128  # OpenAI's maximum for n
MAX_STOP = 64  # stop strings are searched after every token of the request
MAX_BAD_WORDS = 1024  # bad words are matched in every step of the request
_INT64 = 2**63
Seed = Annotated[int, Field(ge=-_INT64, le=_INT64 - 1)]  # vLLM's range for seed


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _warn_extra(self):
        if self.model_extra:
            logger.warning("The following fields were present in the request but ignored: %s",
                           sorted(self.model_extra))
        return self


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False  # vLLM's default: `stream_options: {}` sends no usage
    continuous_usage_stats: bool | None = False


class ResponseFormat(OpenAIBaseModel):
    """OpenAI's response_format (text, json_object, json_schema: {name, schema, strict, ...})
    and vLLM's structural_tag format (structures [{begin, schema, end}], triggers)."""

    type: str
    json_schema: dict[str, Any] | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


class _SamplingFields(OpenAIBaseModel):
    """Fields shared by completions and chat (OpenAI's, then vLLM's extra parameters)."""

    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    seed: Seed | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    best_of: int | None = None
    # vLLM's extra sampling parameters
    use_beam_search: bool = False
    length_penalty: float = 1.0  # beam search's (vLLM's)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = None
    # vLLM's: logprobs name their tokens "token_id:<id>" (None: the server's
    # --return-tokens-as-token-ids)
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: the prompt's and each choice's token ids beside the text (streamed: the prompt's
    # on a choice's first chunk, each chunk its new tokens)
    return_token_ids: bool | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: Annotated[list[str], Field(max_length=MAX_BAD_WORDS)] | None = None
    # vLLM's extra request parameters
    priority: int = 0
    request_id: str | None = None
    # structured output: vLLM's object (json, regex, choice, grammar, json_object,
    # structural_tag and options), and its older names for the first four
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    suffix: str | None = None
    add_special_tokens: bool = True

    @model_validator(mode="before")
    @classmethod
    def _prompt_or_embeds(cls, data):
        """vLLM's checks, in its words: a prompt that is missing or "" needs embeddings; and
        vLLM's prompt_embeds (its --enable-prompt-embeds), which vllmx refuses by name."""
        if isinstance(data, dict):
            prompt, embeds = data.get("prompt"), data.get("prompt_embeds")
            if embeds:
                raise ValueError("prompt_embeds is not supported: vllmx takes a prompt as text or "
                                 "token ids (vLLM takes embeddings with --enable-prompt-embeds)")
            if prompt is None or prompt == "":
                raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
        return data


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # vLLM's older name for reasoning, still read


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = 0
    max_tokens: int | None = Field(default=None, description="deprecated by OpenAI")
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's extra chat parameters
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_prompt_text: bool | None = None  # vLLM's: the templated prompt as prompt_text


class TokenizeCompletionRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIBaseModel):
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # vLLM's: rendered as the chat would render them


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


FinishReason = Literal["stop", "length", "abort"]
