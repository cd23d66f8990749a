"""What the scheduler tells the model runner each step (vLLM V1's SchedulerOutput)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllmx.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the runner has not seen (or is resuming after preemption): all its tokens."""

    req_id: str
    token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    num_prompt_tokens: int
    lora_request: object | None = None  # its LoRARequest; None: the base model


@dataclass
class CachedRequestData:
    """Requests the runner already holds: their new blocks and progress."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    preempted_req_ids: set[str] = field(default_factory=set)
    # Speculative decoding: each request's draft tokens this step verifies (its scheduled
    # tokens end with them).
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class TokenLogprobs:
    """Logprobs at one position: the chosen token first, then the top-k (vLLM's order), each
    with its log-prob under the model's raw distribution; `rank` is the chosen token's rank
    (1 = most likely)."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    # The tokens each request that reached the end of its tokens got this step: one, or with
    # speculative decoding its accepted drafts and the token after them.
    sampled_token_ids: dict[str, list[int]]
    sampled_logprobs: dict[str, list[float]]  # each sampled token's log-prob (raw distribution)
    # For requests with SamplingParams.logprobs set: each sampled position's TokenLogprobs.
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    # For requests with prompt_logprobs set, once their prefill completes: one entry per prompt
    # token (None for the first, which has no prediction).
    prompt_logprobs: dict[str, list[TokenLogprobs | None]] = field(default_factory=dict)
    # Requests that failed in this step on their own (req_id -> error): they were left out
    # of the batch, or their results dropped; the scheduler finishes them with an error.
    failed: dict[str, str] = field(default_factory=dict)
    # Speculative decoding: the drafts proposed for each request's next step.
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
