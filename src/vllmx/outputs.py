"""vLLM-shaped outputs of a request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass
class Logprob:
    """vLLM's Logprob: the log-prob of a token, its rank (1 = most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position: token id -> Logprob (the sampled/prompt token first, then the top-k).
SampleLogprobs = list[dict[int, Logprob]]
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    # vLLM's inter-token latency, measured where the tokens are made: one gap (seconds) per
    # step that gave this request tokens after its first, so that outputs merged on their way
    # to a slow consumer (engine/output_collector.py) still count every step.
    inter_token_latencies: list[float] = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    kv_transfer_params: dict | None = field(default=None, repr=False)
    # With finish_reason "error": what made this request fail (the engine went on without it).
    error: str | None = None

    def add(self, next_output: RequestOutput, aggregate: bool) -> None:
        """vLLM's RequestOutput.add: folds a later output of the same request into this one,
        sample by sample (`index`). aggregate (DELTA outputs): text, token ids and logprobs
        appended; otherwise (CUMULATIVE) the later sample replaces the earlier."""
        self.finished |= next_output.finished
        self.num_cached_tokens = next_output.num_cached_tokens
        self.metrics = next_output.metrics
        self.error = next_output.error if next_output.error is not None else self.error
        if self.prompt_logprobs is None:  # DELTA sends them once, with the first output
            self.prompt_logprobs = next_output.prompt_logprobs
        for nxt in next_output.outputs:
            for i, cur in enumerate(self.outputs):
                if cur.index != nxt.index:
                    continue
                if aggregate:  # (the engine makes fresh lists for every DELTA output)
                    cur.text += nxt.text
                    cur.token_ids.extend(nxt.token_ids)
                    if nxt.logprobs:
                        if cur.logprobs is None:
                            cur.logprobs = []
                        cur.logprobs.extend(nxt.logprobs)
                    cur.cumulative_logprob = nxt.cumulative_logprob
                    cur.finish_reason, cur.stop_reason = nxt.finish_reason, nxt.stop_reason
                else:
                    self.outputs[i] = nxt
                break
            else:
                self.outputs.append(nxt)


# -- pooling models (vLLM's classes; PoolingOutput.data is a numpy array here, not a tensor) ----
@dataclass
class PoolingOutput:
    data: np.ndarray  # f32: [hidden] (or [dimensions]), [num_labels], or [T, hidden] per token


@dataclass
class PoolingRequestOutput:
    request_id: str
    outputs: Any  # PoolingOutput, or the task's own output class below
    prompt_token_ids: list[int]
    finished: bool = True

    output_cls: ClassVar[Any] = None  # a task's subclass: its output class (from_base)

    @classmethod
    def from_base(cls, out: PoolingRequestOutput):
        """vLLM's from_base: a raw PoolingRequestOutput as this task's output."""
        return cls(out.request_id, cls.output_cls.from_base(out.outputs), out.prompt_token_ids,
                   out.finished)


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @classmethod
    def from_base(cls, out: PoolingOutput) -> EmbeddingOutput:
        return cls(np.asarray(out.data).tolist())

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]

    @classmethod
    def from_base(cls, out: PoolingOutput) -> ClassificationOutput:
        return cls(np.asarray(out.data).tolist())

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float

    @classmethod
    def from_base(cls, out: PoolingOutput) -> ScoringOutput:
        return cls(float(np.asarray(out.data).reshape(-1)[0]))


@dataclass
class EmbeddingRequestOutput(PoolingRequestOutput):
    output_cls: ClassVar[Any] = EmbeddingOutput


@dataclass
class ClassificationRequestOutput(PoolingRequestOutput):
    output_cls: ClassVar[Any] = ClassificationOutput


@dataclass
class ScoringRequestOutput(PoolingRequestOutput):
    output_cls: ClassVar[Any] = ScoringOutput
