"""vLLM V1's scheduling rule: every request has num_computed_tokens and each step tries to
catch it up. Running requests go first, then waiting ones, within a token budget
(max_num_batched_tokens) and a concurrency cap (max_num_seqs). One rule covers prefill,
chunked prefill and decode. When blocks run out, the newest running request is preempted
(its blocks freed, recomputed later)."""

from __future__ import annotations

from collections import deque

from vllmx.config import CacheConfig, SchedulerConfig
from vllmx.core.kv_cache_manager import KVCacheManager
from vllmx.core.sched_output import (CachedRequestData, ModelRunnerOutput, NewRequestData,
                                     SchedulerOutput)
from vllmx.engine.request import Request, RequestStatus


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig):
        self.config = scheduler_config
        self.kv_cache_manager = KVCacheManager(cache_config.num_blocks, cache_config.block_size)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        preempted: set[str] = set()

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            new_blocks = self.kv_cache_manager.allocate_slots(req, num_new)
            while new_blocks is None:
                victim = self.running.pop()  # the newest running request
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is req:
                    break
                new_blocks = self.kv_cache_manager.allocate_slots(req, num_new)
            if new_blocks is None:
                break
            num_scheduled[req.request_id] = num_new
            budget -= num_new
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append(new_blocks)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            i += 1

        while (self.waiting and budget > 0 and not preempted
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting[0]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if self.kv_cache_manager.allocate_slots(req, num_new) is None:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            num_scheduled[req.request_id] = num_new
            budget -= num_new
            new_reqs.append(NewRequestData(
                req.request_id, list(req.all_token_ids), req.sampling_params,
                list(self.kv_cache_manager.get_block_ids(req.request_id)),
                req.num_computed_tokens, req.num_prompt_tokens))

        out = SchedulerOutput(new_reqs, cached, num_scheduled,
                              sum(num_scheduled.values()), self.finished_req_ids, preempted)
        self.finished_req_ids = set()
        return out

    def _preempt(self, req: Request) -> None:
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput) -> list[Request]:
        """Advances the scheduled requests; returns those that got a new token."""
        updated = []
        for req_id, n in so.num_scheduled_tokens.items():
            req = self.requests.get(req_id)
            if req is None or req.is_finished():
                continue
            req.num_computed_tokens += n
            token = out.sampled_token_ids.get(req_id)
            if token is None:
                continue
            req.append_output_token(token, out.sampled_logprobs[req_id])
            self._check_stop(req, token)
            updated.append(req)
            if req.is_finished():
                self._free(req)
        return updated

    def _check_stop(self, req: Request, token: int) -> None:
        sp = req.sampling_params
        if req.num_output_tokens >= sp.min_tokens:
            if not sp.ignore_eos and token in sp.all_stop_token_ids:
                req.status = RequestStatus.FINISHED_STOPPED
                return
            if token in sp.stop_token_ids:
                req.status = RequestStatus.FINISHED_STOPPED
                req.stop_reason = token
                return
        if (sp.max_tokens is not None and req.num_output_tokens >= sp.max_tokens) or (
                req.num_tokens >= self.config.max_model_len):
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED

    def finish_requests(self, req_ids, status: RequestStatus) -> None:
        """Finishes requests from outside the step (abort, stop string matched)."""
        for req_id in req_ids:
            req = self.requests.get(req_id)
            if req is None or req.is_finished():
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            req.status = status
            self._free(req)

    def _free(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        self.kv_cache_manager.free(req)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]
