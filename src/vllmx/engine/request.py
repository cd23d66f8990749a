"""A request inside the engine: its tokens, progress (num_computed_tokens) and status."""

from __future__ import annotations

import enum
import time

from vllmx.outputs import RequestMetrics
from vllmx.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6  # failed on its own (Request.error says why); the others go on

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status >= RequestStatus.FINISHED_STOPPED


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, prompt: str | None = None,
                 arrival_time: float | None = None, priority: int = 0,
                 cache_salt: str | None = None, lora_request=None):
        self.request_id = request_id
        self.priority = priority  # lower is scheduled first (SchedulerConfig.policy="priority")
        self.cache_salt = cache_salt  # extra key of the first block's hash (prefix caching)
        self.lora_request = lora_request  # the adapter it runs with (LoRARequest); None: base
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[float] = []
        self.all_token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # Tokens a scheduled step samples that update_from_output has not appended yet (vLLM's
        # name; more than 0 between schedule and update, and across one step with asynchronous
        # scheduling).
        self.num_output_placeholders = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.error: str | None = None  # why it failed (status FINISHED_ERROR)
        self.num_preemptions = 0
        self.num_cached_tokens = 0  # prefix-cache hit at first admission (RequestOutput's)
        self.block_hashes: list[bytes] = []  # of its full blocks, extended as tokens grow
        # Draft tokens to verify in its next step (speculative decoding; vLLM's name).
        self.spec_token_ids: list[int] = []
        self.metrics = RequestMetrics(arrival_time=arrival_time or time.time())

    @property
    def lora_int_id(self) -> int:
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token(self, token_id: int, logprob: float) -> None:
        self.output_token_ids.append(token_id)
        self.output_logprobs.append(logprob)
        self.all_token_ids.append(token_id)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)
