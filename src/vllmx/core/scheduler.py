"""vLLM V1's scheduling rule: every request has num_computed_tokens and each step tries to
catch it up. Running requests go first, then waiting ones, within a token budget
(max_num_batched_tokens) and a concurrency cap (max_num_seqs). One rule covers prefill,
chunked prefill, decode and prefix caching (a waiting request starts at its prefix hit). When
blocks run out a running request is preempted (its blocks freed but left cached, recomputed
later): the newest under FCFS, the lowest-priority one under the priority policy.

As in vLLM, schedule() advances num_computed_tokens by what it schedules, and a step that will
sample a request's next token leaves a placeholder for it (num_output_placeholders) until
update_from_output appends the token. With asynchronous scheduling the engine schedules step
N + 1 before step N's tokens reach the host: a request whose token is still a placeholder is
scheduled for it all the same (the runner takes the input id from where the GPU sampled it),
unless that token is its last by length (max_tokens, max_model_len)."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from vllmx.config import CacheConfig, SchedulerConfig
from vllmx.core.kv_cache_manager import KVCacheManager, PrefixCacheStats, cdiv
from vllmx.core.request_queue import FCFSRequestQueue, PriorityRequestQueue
from vllmx.core.sched_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from vllmx.engine.request import Request, RequestStatus


@dataclass
class SchedulerStats:
    """The scheduler's state for /metrics and the stats log (vLLM's SchedulerStats; the
    prefix-cache counts and preemptions are cumulative)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # 1.0: every block in use
    prefix_cache_queries: int = 0  # tokens looked up
    prefix_cache_hits: int = 0  # tokens found cached
    num_preemptions: int = 0
    # Speculative decoding (cumulative): verify steps with drafts, drafts, accepted drafts.
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    # vLLM's iteration_tokens_total histogram: per step, the prompt tokens of the requests
    # whose prefill it completed plus the tokens it generated (cumulative counts per bound of
    # ITERATION_TOKEN_BUCKETS, then the sum and the number of steps).
    iteration_tokens_buckets: tuple[int, ...] = ()
    iteration_tokens_sum: int = 0
    iteration_tokens_count: int = 0


ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 use_eagle: bool = False, lora_config=None):
        self.config = scheduler_config
        # vLLM's LoRA rule: a step holds requests of at most max_loras adapters.
        self.max_loras = lora_config.max_loras if lora_config is not None else 0
        if scheduler_config.policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling policy must be 'fcfs' or 'priority', got "
                             f"{scheduler_config.policy!r}")
        self.block_size = cache_config.block_size
        self.num_blocks = cache_config.num_blocks
        # A request can never hold more tokens than the whole pool.
        capacity = cache_config.num_blocks * cache_config.block_size
        self.max_model_len = min(scheduler_config.max_model_len or capacity, capacity)
        self.kv_cache_manager = KVCacheManager(cache_config.num_blocks, cache_config.block_size,
                                               cache_config.enable_prefix_caching,
                                               self.max_model_len, use_eagle)
        self.requests: dict[str, Request] = {}
        self._arrival_order: dict[str, int] = {}  # breaks priority ties between equal times
        self._counter = itertools.count()
        self.waiting = (PriorityRequestQueue(self._priority_key)
                        if scheduler_config.policy == "priority" else FCFSRequestQueue())
        self.running: list[Request] = []
        # Finished and preempted requests the runner has not heard of: it hears through the steps
        # it runs, and a schedule with no tokens is never run, so they wait for the next one
        # (else a hybrid model's state slots of the last step's finishers were lost).
        self.finished_req_ids: set[str] = set()
        self.preempted_req_ids: set[str] = set()
        self.num_preemptions = 0
        # SchedulerStats.spec_decode_*: verify steps with drafts, drafts, accepted drafts.
        self.spec_decode_num_drafts = 0
        self.spec_decode_num_draft_tokens = 0
        self.spec_decode_num_accepted_tokens = 0
        # Steps per bucket of ITERATION_TOKEN_BUCKETS (the last: above them all), their sum.
        self.iteration_tokens_hist = [0] * (len(ITERATION_TOKEN_BUCKETS) + 1)
        self.iteration_tokens_sum = 0
        self.iteration_tokens_count = 0

    def _priority_key(self, req: Request) -> tuple:
        return req.priority, req.metrics.arrival_time, self._arrival_order[req.request_id]

    def add_request(self, request: Request) -> None:
        n = request.num_prompt_tokens
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        if n == 0:
            raise ValueError("the prompt is empty (0 tokens)")
        if self.config.max_model_len and n >= self.config.max_model_len:
            raise ValueError(f"the prompt ({n} tokens) does not fit max_model_len="
                             f"{self.config.max_model_len} with at least one generated token")
        if cdiv(n + 1, self.block_size) > self.num_blocks:
            raise ValueError(
                f"the prompt ({n} tokens) plus one generated token needs "
                f"{cdiv(n + 1, self.block_size)} KV blocks of {self.block_size} tokens, but the "
                f"KV cache has only {self.num_blocks} blocks in all; it could never be scheduled")
        self.requests[request.request_id] = request
        self._arrival_order[request.request_id] = next(self._counter)
        self.waiting.add_request(request)

    def has_unfinished_requests(self) -> bool:
        return bool(len(self.waiting) or self.running)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        kv = self.kv_cache_manager
        budget = self.config.max_num_batched_tokens
        lookahead = self.config.num_lookahead_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        preempted: set[str] = set()

        # Running requests first (decodes and unfinished chunked prefills), in order.
        spec: dict[str, list[int]] = {}
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            # (With speculative decoding a caught-up request also runs its drafts: they are
            # verified in the same forward.)
            num_new = min(req.num_tokens + req.num_output_placeholders
                          + len(req.spec_token_ids) - req.num_computed_tokens, budget)
            if num_new <= 0 or self._last_token_pending(req):
                i += 1
                continue
            new_blocks = kv.allocate_slots(req, num_new, None, lookahead)
            while new_blocks is None:
                victim = self._pick_victim()
                if self.running.index(victim) < i:  # scheduled earlier in this step: undo it
                    budget += num_scheduled.pop(victim.request_id)
                    spec.pop(victim.request_id, None)
                    j = cached.req_ids.index(victim.request_id)
                    del cached.req_ids[j], cached.new_block_ids[j], cached.num_computed_tokens[j]
                    i -= 1
                self.running.remove(victim)
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is req:
                    break
                new_blocks = kv.allocate_slots(req, num_new, None, lookahead)
            if new_blocks is None:
                break
            num_scheduled[req.request_id] = num_new
            num_spec = num_new - (req.num_tokens - req.num_computed_tokens)
            if num_spec > 0:  # (a budget cut takes the last drafts first)
                spec[req.request_id] = req.spec_token_ids[:num_spec]
            budget -= num_new
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append(new_blocks)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            i += 1

        # Then waiting ones (new and preempted), each starting at its prefix-cache hit. A
        # request of one more adapter than max_loras waits (in order) for a step with room.
        scheduled_loras = {r.lora_int_id for r in self.running if r.lora_int_id}
        while (len(self.waiting) and budget > 0 and not preempted
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting.peek_request()
            if req.num_output_placeholders:  # preempted with its last step's token in flight
                break
            if (self.max_loras and req.lora_int_id and req.lora_int_id not in scheduled_loras
                    and len(scheduled_loras) >= self.max_loras):
                break
            hit_blocks, num_hit = kv.get_computed_blocks(req)
            num_new = min(req.num_tokens - num_hit, budget)
            if kv.allocate_slots(req, num_new, hit_blocks, lookahead) is None:
                break
            self.waiting.pop_request()
            if req.status == RequestStatus.WAITING:  # first admission (not a resumption)
                req.num_cached_tokens = num_hit
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_hit
            self.running.append(req)
            if req.lora_int_id:
                scheduled_loras.add(req.lora_int_id)
            num_scheduled[req.request_id] = num_new
            budget -= num_new
            new_reqs.append(NewRequestData(
                req.request_id, list(req.all_token_ids), req.sampling_params,
                list(kv.get_block_ids(req.request_id)), num_hit, req.num_prompt_tokens,
                req.lora_request))

        for req_id, n in num_scheduled.items():
            req = self.requests[req_id]
            req.num_computed_tokens += n
            if req.num_computed_tokens >= req.num_tokens + req.num_output_placeholders:
                req.num_output_placeholders += 1  # caught up: this step samples its next token
        self.preempted_req_ids |= preempted
        out = SchedulerOutput(new_reqs, cached, num_scheduled,
                              sum(num_scheduled.values()), self.finished_req_ids,
                              self.preempted_req_ids, spec)
        if num_scheduled:
            self.finished_req_ids, self.preempted_req_ids = set(), set()
        return out

    def _last_token_pending(self, req: Request) -> bool:
        """Whether the token a step in flight samples for req ends it by length (so that no
        further step is scheduled for it)."""
        if not req.num_output_placeholders:
            return False
        n = req.num_output_placeholders
        max_tokens = req.sampling_params.max_tokens
        return ((max_tokens is not None and req.num_output_tokens + n >= max_tokens)
                or req.num_tokens + n >= self.max_model_len)

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=self._priority_key)
        return self.running[-1]  # the newest running request

    def _preempt(self, req: Request) -> None:
        self.kv_cache_manager.free(req)  # its computed full blocks stay cached for the resume
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0  # (a placeholder in flight stays: its token still comes)
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(req)

    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput) -> list[Request]:
        """Advances the scheduled requests, caches their blocks that became full, and returns
        those that got a new token or failed (finished with FINISHED_ERROR, req.error set)."""
        updated = []
        step_tokens = 0  # for iteration_tokens_total
        for req_id in so.num_scheduled_tokens:
            req = self.requests.get(req_id)
            if req is None or req.is_finished():
                continue
            if req_id in out.failed:  # its KV was not written: none of its blocks is cached
                req.error = out.failed[req_id]
                self.finish_requests([req_id], RequestStatus.FINISHED_ERROR)
                updated.append(req)
                continue
            tokens = out.sampled_token_ids.get(req_id)
            drafts = so.scheduled_spec_decode_tokens.get(req_id, ())
            # Rejected drafts were computed (their KV slots get overwritten later) but not kept.
            num_rejected = len(drafts) + 1 - len(tokens) if tokens and drafts else 0
            if req.status == RequestStatus.RUNNING:  # (a preempted one restarts from 0)
                req.num_computed_tokens -= num_rejected
            if tokens:
                req.num_output_placeholders -= 1
            if drafts and tokens:
                self.spec_decode_num_drafts += 1
                self.spec_decode_num_draft_tokens += len(drafts)
                self.spec_decode_num_accepted_tokens += len(tokens) - 1
            if tokens and req.num_output_tokens == 0:  # its prefill is done: vLLM counts it here
                step_tokens += req.num_prompt_tokens
            for token, logprob in zip(tokens or (), out.sampled_logprobs.get(req_id, ())):
                req.append_output_token(token, logprob)
                step_tokens += 1
                self._check_stop(req, token)
                if req.is_finished():  # the tokens after a stop are dropped
                    break
            # (After the tokens: accepted drafts are computed tokens, hashed once appended;
            # those past a stop are not.)
            self.kv_cache_manager.cache_blocks(req, min(req.num_computed_tokens,
                                                        req.num_tokens))
            if not tokens:
                continue
            updated.append(req)
            if req.is_finished():
                self._free(req)
            elif req_id in out.spec_token_ids:
                req.spec_token_ids = self._fit_drafts(req, out.spec_token_ids[req_id])
            elif req.spec_token_ids:
                req.spec_token_ids = []
        self._observe_iteration(step_tokens)
        return updated

    def _observe_iteration(self, tokens: int) -> None:
        self.iteration_tokens_hist[bisect.bisect_left(ITERATION_TOKEN_BUCKETS, tokens)] += 1
        self.iteration_tokens_sum += tokens
        self.iteration_tokens_count += 1

    def _fit_drafts(self, req: Request, drafts: list[int]) -> list[int]:
        """The drafts the request's next step can verify: a step that accepts every draft
        also samples one more token, within max_model_len (the runner's token rows end there)
        and max_tokens (vLLM caps the step's positions at max_model_len - 1 alike)."""
        k = min(len(drafts), self.max_model_len - req.num_tokens - 1)
        if req.sampling_params.max_tokens is not None:
            k = min(k, req.sampling_params.max_tokens - req.num_output_tokens - 1)
        return drafts[:max(k, 0)]

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached block; False (nothing done) while any request holds blocks."""
        return self.kv_cache_manager.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats:
        pc = self.kv_cache_manager.prefix_cache_stats
        return SchedulerStats(len(self.running), len(self.waiting),
                              float(self.kv_cache_manager.usage), pc.queries, pc.hits,
                              self.num_preemptions, self.spec_decode_num_drafts,
                              self.spec_decode_num_draft_tokens,
                              self.spec_decode_num_accepted_tokens,
                              tuple(itertools.accumulate(self.iteration_tokens_hist)),
                              self.iteration_tokens_sum, self.iteration_tokens_count)

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Prefix-cache queries and hits (tokens) since the last call."""
        return self.kv_cache_manager.make_prefix_cache_stats()

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
                req.num_tokens >= self.max_model_len):
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
                self.waiting.remove_request(req)
            req.status = status
            self._free(req)

    def _free(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:  # preempted while its last step's token was in flight
            self.waiting.remove_request(req)
        self.kv_cache_manager.free(req)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]
        self._arrival_order.pop(req.request_id, None)
