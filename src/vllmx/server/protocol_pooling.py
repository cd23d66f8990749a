"""Request bodies of the pooling endpoints, with vLLM's names (vllm/entrypoints/pooling/):
/v1/embeddings, /pooling, /score, /rerank, /classify."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, StrictStr, model_validator

from vllmx.server.protocol import ChatMessage, OpenAIBaseModel

MAX_INPUTS = 2048  # OpenAI's limit of inputs in one embeddings request

# OpenAI's embeddings input: a text, texts, a token id list, or token id lists.
TokenIds = Annotated[list[StrictInt], Field(min_length=1)]
EmbeddingInput = (StrictStr | Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_INPUTS)]
                  | TokenIds | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)])


class _PoolingFields(OpenAIBaseModel):
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    request_id: str | None = None
    priority: int = 0


class EmbeddingCompletionRequest(_PoolingFields):
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    normalize: bool | None = None  # vLLM's extra parameter


class EmbeddingChatRequest(_PoolingFields):
    """vLLM's chat form of /v1/embeddings: the messages rendered by the chat template, then
    embedded (add_generation_prompt off by default, the template adding special tokens)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    normalize: bool | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


EmbeddingRequest = EmbeddingCompletionRequest | EmbeddingChatRequest


class PoolingCompletionRequest(EmbeddingCompletionRequest):
    """vLLM's /pooling: the raw pooled output of `task` (the model's first task by default)."""

    task: Literal["embed", "classify", "score", "token_embed"] | None = None
    use_activation: bool | None = None


class ClassificationRequest(_PoolingFields):
    input: EmbeddingInput
    use_activation: bool | None = None


ScoreInputs = StrictStr | Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_INPUTS)]
# vLLM's four spellings of the two sides of a score request, in the order it tries them.
SCORE_FORMS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
               ("text_1", "text_2"))


class ScoreRequest(_PoolingFields):
    """The first side against the second: one against many (1:N) or pairwise (N:N)."""

    queries: ScoreInputs | None = None
    documents: ScoreInputs | None = None
    items: ScoreInputs | None = None
    data_1: ScoreInputs | None = None
    data_2: ScoreInputs | None = None
    text_1: ScoreInputs | None = None
    text_2: ScoreInputs | None = None
    use_activation: bool | None = None

    @model_validator(mode="after")
    def _one_form(self):
        if self.sides is None:
            raise ValueError("a score request needs its two sides: queries and documents (or "
                             "queries and items, data_1 and data_2, text_1 and text_2)")
        return self

    @property
    def sides(self) -> tuple | None:
        """(first side, second side, the second's field name), or None."""
        for a, b in SCORE_FORMS:
            if getattr(self, a) is not None and getattr(self, b) is not None:
                return getattr(self, a), getattr(self, b), b
        return None


class RerankRequest(_PoolingFields):
    """documents ranked by relevance to query; top_n <= 0: all of them."""

    query: StrictStr
    documents: Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_INPUTS)]
    top_n: int = 0
    use_activation: bool | None = None
