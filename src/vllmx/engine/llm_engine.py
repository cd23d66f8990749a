"""LLMEngine: requests in, RequestOutputs out, one scheduler step at a time."""

from __future__ import annotations

import logging
import time

import numpy as np

from vllmx import _C
from vllmx.config import (
    VllmxConfig,
)
from vllmx.core.scheduler import Scheduler
from vllmx.engine.arg_utils import EngineArgs
from vllmx.engine.output_processor import OutputProcessor, ParentRequest
from vllmx.engine.request import Request, RequestStatus
from vllmx.outputs import RequestOutput
from vllmx.sampling_params import SamplingParams
from vllmx.structured_output import StructuredOutputManager
from vllmx.worker.worker_base import create_worker

logger = logging.getLogger("vllmx")


def _check_tensor_parallel(config: VllmxConfig) -> None:
    """What several ranks do not run yet, refused before anything starts: the other ranks
    follow the model's forward and LoRA's slots only (executor/tp_worker.py), so the drafters
    built over the target's layers (eagle, eagle3, mtp) would run on rank 0's share alone. (A
    draft_model runs whole on rank 0, as vLLM's draft_tensor_parallel_size=1.)"""
    if config.parallel_config.world_size == 1:
        return
    spec = config.speculative_config
    what = "tensor_parallel_size * pipeline_parallel_size > 1"
    if spec is not None and spec.method not in ("ngram", "draft_model"):
        raise ValueError(f"{what} supports speculative decoding by ngram and draft_model only "
                         f"so far, not {spec.method!r}")


class LLMEngine:
    def __init__(self, config: VllmxConfig):
        self.config = config
        mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
        if mc.runner == "pooling" or mc.convert not in ("auto", "none"):
            raise ValueError(f"runner={mc.runner!r} convert={mc.convert!r}: LLMEngine generates; "
                             f"a pooling model runs on a PoolingEngine (LLM(...) and "
                             f"engine.factory.create_engine pick it)")
        if config.parallel_config.num_threads:
            _C.set_num_threads(config.parallel_config.num_threads)
        _check_tensor_parallel(config)
        t0 = time.perf_counter()
        self.device, self.worker = create_worker(config)
        self.worker.load_model()
        self.model, self.tokenizer = self.worker.model, self.worker.tokenizer
        self._finish_model_config()
        self.lora_manager = None
        if config.lora_config is not None:
            from vllmx.lora.model_manager import create_lora_manager

            self.lora_manager = create_lora_manager(self.model, config, self.device,
                                                    getattr(self.worker, "act_dtype", None))
            executor = getattr(self.worker, "executor", None)
            if executor is not None:  # the other ranks' managers follow each step's slots
                self.lora_manager.followers = executor.call
        spec = config.speculative_config
        draft_model = None
        if spec is not None and spec.method not in ("ngram", "mtp", "eagle", "eagle3"):
            from vllmx.spec_decode.draft_model_proposer import DraftModelProposer

            # Its weights before the target's cache, which sets its cache's share aside.
            draft_model = DraftModelProposer(config, spec, self.model.vocab_size, self.device)
            self.worker.kv_reserve = draft_model.kv_reserve()
        self.worker.initialize_kv_cache()
        self.model_runner = self.worker.model_runner
        if spec is not None and spec.method in ("mtp", "eagle", "eagle3"):
            from vllmx.spec_decode.eagle import EagleProposer
            from vllmx.spec_decode.mtp_proposer import MTPProposer

            cls = MTPProposer if spec.method == "mtp" else EagleProposer
            act_dtype = getattr(self.worker, "act_dtype", None)
            drafter = cls(config, spec, self.model, self.worker.kv_caches,
                          self.worker.cache_dtype, self.device, act_dtype)
            self.model_runner.drafter = drafter
            # Before the decode graphs are captured: captured steps copy their hidden states.
            self.model_runner.keep_hidden_states(drafter.model.aux_hidden_state_layers,
                                                 act_dtype)
            # The chained drafts write the draft layers' KV past the scheduled tokens.
            sc.num_lookahead_tokens = spec.num_speculative_tokens
        self.worker.compile_or_warm_up_model()
        self.model_runner.lora_manager = self.lora_manager
        if spec is not None and spec.method == "ngram":
            from vllmx.spec_decode.ngram_proposer import NgramProposer

            self.model_runner.drafter = NgramProposer(spec)
        elif draft_model is not None:
            draft_model.start(config.cache_config.num_blocks)
            self.model_runner.drafter = draft_model
        if sc.async_scheduling is None:
            sc.async_scheduling = self.device == "cuda"
        # (With speculation a step whose finish may propose drafts finishes before the next is
        # scheduled, since the drafts need its tokens on the host; PendingStep.may_draft.)
        self.model_runner.async_scheduling = sc.async_scheduling
        # With asynchronous scheduling: the step launched and not yet finished (its
        # SchedulerOutput and the runner's PendingStep).
        self._in_flight = None
        self.kv_caches, self.cache_dtype = self.worker.kv_caches, self.worker.cache_dtype
        self.scheduler = Scheduler(sc, cc, use_eagle=spec is not None and spec.method in (
            "mtp", "eagle", "eagle3"), lora_config=config.lora_config)
        # Structured outputs: requests are checked here, matched in the model runner.
        self.structured_output_manager = None
        if self.tokenizer is not None:
            self.structured_output_manager = StructuredOutputManager(
                self.tokenizer, self.model.vocab_size, self.eos_token_ids,
                config.structured_outputs_config)
        self.model_runner.structured_output_manager = self.structured_output_manager
        self.output_processor = OutputProcessor(self.tokenizer)
        self._next_id = 0
        logger.info("loaded %s in %.2fs", mc.path, time.perf_counter() - t0)

    def _finish_model_config(self) -> None:
        mc = self.config.model_config
        self.config.scheduler_config.max_model_len = mc.max_model_len
        mc.vocab_size = self.model.vocab_size
        if getattr(self.model, "is_hybrid", False):
            # A prefix-cache hit would skip tokens whose recurrent state no slot holds (vLLM
            # too turns it off for such models unless states are snapshotted per block).
            if self.config.cache_config.enable_prefix_caching:
                logger.info("prefix caching is off: %s keeps recurrent state per request",
                            mc.hf_config.get("architectures"))
            self.config.cache_config.enable_prefix_caching = False
        spec = self.config.speculative_config
        if spec is not None and spec.method == "mtp":
            from vllmx.spec_decode.mtp_proposer import mtp_layer_count

            mtp_layer_count(mc)  # a model without MTP layers: the error names it
        elif spec is not None and spec.method in ("eagle", "eagle3"):
            from vllmx.spec_decode.eagle import check_eagle_draft

            check_eagle_draft(spec, self.model)  # before the KV cache holds its layers
        self.eos_token_ids = mc.eos_token_ids()
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)

    # -- LoRA adapters (vLLM's add_lora / remove_lora / list_loras) ---------------------------
    def add_lora(self, lora_request) -> bool:
        """Loads an adapter now (checked: a bad one raises ValueError naming it)."""
        self._lora("add_lora").add_adapter(lora_request)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        return self._lora("remove_lora").remove_adapter(lora_id)

    def list_loras(self) -> set[int]:
        return set(self._lora("list_loras").list_adapters())

    def _lora(self, api: str):
        if self.lora_manager is None:
            raise ValueError(f"{api}: LoRA is not enabled (start with enable_lora=True)")
        return self.lora_manager

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args.create_engine_config())

    # -- requests -------------------------------------------------------------------------
    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a str or a dict, got {type(prompt).__name__}")
        if self.tokenizer is None:
            raise ValueError("text prompts need a tokenizer; with skip_tokenizer_init=True pass "
                             "{'prompt_token_ids': [...]}")
        return prompt, self.tokenizer.encode(prompt)

    def add_request(self, request_id: str | None, prompt, params: SamplingParams | None = None,
                    arrival_time: float | None = None, priority: int = 0,
                    cache_salt: str | None = None, lora_request=None) -> str:
        """Queues a request (n > 1 fans out into n child requests); returns its id."""
        params = params or SamplingParams()
        text, ids = self.process_inputs(prompt, params)
        return self.add_processed_request(request_id, text, ids, params, arrival_time,
                                          priority, cache_salt, lora_request)

    def process_inputs(self, prompt, params: SamplingParams) -> tuple[str | None, list[int]]:
        """The prompt's text and token ids, tokenized, truncated and checked (vLLM's
        Processor.process_inputs): bad input raises here. AsyncLLM runs it in a worker thread,
        so that the engine thread only queues what is already checked."""
        text, ids = self._tokenize(prompt)
        ids = self._truncate(ids, params)
        self._validate(ids, params)
        return text, ids

    def add_processed_request(self, request_id: str | None, text: str | None, ids: list[int],
                              params: SamplingParams, arrival_time: float | None = None,
                              priority: int = 0, cache_salt: str | None = None,
                              lora_request=None) -> str:
        """Queues a request whose inputs process_inputs returned; returns its id. Its LoRA
        adapter is loaded (and checked) here, on the thread that steps the engine."""
        if request_id is None:
            request_id = str(self._next_id)
            self._next_id += 1
        if request_id in self.scheduler.requests or request_id in self.output_processor.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        if lora_request is not None:
            self.add_lora(lora_request)
        params.all_stop_token_ids = set(self.eos_token_ids)
        if params.n == 1:
            self._add(Request(request_id, ids, params, text, arrival_time, priority, cache_salt,
                              lora_request))
            return request_id
        parent = ParentRequest(request_id, params)
        for i in range(params.n):
            child = Request(f"{i}_{request_id}", ids, parent.child_params(i), text, arrival_time,
                            priority, cache_salt, lora_request)
            self._add(child, i, parent)
        return request_id

    def _add(self, req: Request, index: int = 0, parent=None) -> None:
        self.scheduler.add_request(req)
        self.output_processor.add_request(req, index, parent)

    def _truncate(self, ids: list[int], params: SamplingParams) -> list[int]:
        """vLLM's truncate_prompt_tokens: keep the last k prompt tokens (-1: max_model_len)."""
        k = params.truncate_prompt_tokens
        if k is None:
            return ids
        if k == -1:
            k = self.config.model_config.max_model_len - 1
        return ids[-k:]

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        """Checks a request before it is queued (also used by AsyncLLM in the caller's thread);
        tokenizes bad_words once, before n > 1 copies the params."""
        mc = self.config.model_config
        if not ids:
            raise ValueError("the prompt is empty (0 tokens)")
        vocab = self.model.vocab_size
        bad = [i for i in ids if not (isinstance(i, (int, np.integer)) and 0 <= i < vocab)]
        if bad:
            raise ValueError(f"prompt token id {bad[0]!r} is out of vocabulary (size {vocab})")
        if len(ids) >= mc.max_model_len:
            raise ValueError(
                f"the prompt ({len(ids)} tokens) is longer than the model's context: "
                f"max_model_len is {mc.max_model_len}, which must also hold at least one "
                f"generated token")
        if params.stop and (self.tokenizer is None or not params.detokenize):
            raise ValueError("stop strings need a tokenizer and detokenize=True")
        if params.bad_words:
            if self.tokenizer is None:
                raise ValueError("bad_words need a tokenizer (skip_tokenizer_init=True was "
                                 "given); pass token ids through logit_bias instead")
            params.update_from_tokenizer(self.tokenizer)
        params.verify_token_ids(vocab)
        if params.structured_outputs is not None:
            if self.structured_output_manager is None:
                raise ValueError("structured outputs need a tokenizer (skip_tokenizer_init=True "
                                 "was given)")
            self.structured_output_manager.validate(params.structured_outputs)
        # vLLM's --max-logprobs (-1: no limit); logprobs=-1 asks for the whole vocabulary.
        limit = vocab if mc.max_logprobs == -1 else mc.max_logprobs
        asked = {}  # entries a position: the top k (as counts) and the chosen token
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is None:
                continue
            k = vocab if k == -1 else k
            if k > limit:
                what = "sample logprobs" if name == "logprobs" else "prompt logprobs"
                raise ValueError(f"Requested {what} of {k}, which is greater than max allowed: "
                                 f"{limit}")
            asked[name] = k + 1
        # What they add up to: each entry is kept until the request ends, the whole vocabulary at
        # every position of a long answer would take the process down (24 GB by 1,500 tokens).
        new = min(params.max_tokens or mc.max_model_len, mc.max_model_len - len(ids))
        entries = params.n * (asked.get("logprobs", 0) * new
                              + asked.get("prompt_logprobs", 0) * len(ids))
        if entries > mc.max_logprob_entries:
            raise ValueError(
                f"the logprobs asked for add up to {entries} entries ({new} tokens x "
                f"(logprobs + 1), prompt logprobs, n = {params.n}), more than one request may "
                f"hold (max_logprob_entries = {mc.max_logprob_entries}): ask for fewer logprobs "
                f"or set max_tokens")

    def _child_ids(self, request_id: str) -> list[str]:
        parent = self.output_processor.parents.get(request_id)
        return sorted(parent.unfinished) if parent is not None else [request_id]

    def abort_request(self, request_ids) -> list[RequestOutput]:
        """Aborts requests (by the ids add_request returned); returns their final outputs."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        outputs = []
        for rid in request_ids:
            for cid in self._child_ids(rid):
                req = self.scheduler.requests.get(cid)
                if req is None:
                    continue
                self.scheduler.finish_requests([cid], RequestStatus.FINISHED_ABORTED)
                out = self.output_processor.abort(req)
                if out is not None:
                    outputs.append(out)
        return outputs

    def reset_prefix_cache(self) -> bool:
        """Drops every cached prefix block; False (nothing dropped) while requests hold blocks."""
        return self.scheduler.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """Schedules and runs one step; returns the outputs of the requests it advanced. With
        asynchronous scheduling it launches the step, then finishes the one launched before
        (whose outputs it returns), so the GPU runs this step while the host takes the last
        one's tokens, checks stops and forms outputs."""
        taken = None
        if self._in_flight is not None and self._in_flight[1].may_draft():
            # Its tokens and drafts go into the scheduler before the step it drafts for is
            # scheduled; its outputs (detokenizing, stop strings) are formed once that step
            # runs, as for a step finished behind the next one.
            taken = self._take(*self._pop_in_flight())
        so = self.scheduler.schedule()
        if so.total_num_scheduled_tokens == 0:
            outputs = self._outputs(*taken) if taken else []
            if self._in_flight is not None:
                return outputs + self._finish_in_flight()
            if (not outputs and self.scheduler.has_unfinished_requests()
                    and not self.scheduler.running):
                raise RuntimeError("scheduler made no progress with requests waiting")
            return outputs
        now = time.time()
        for req_id in so.num_scheduled_tokens:
            r = self.scheduler.requests[req_id]
            r.metrics.first_scheduled_time = r.metrics.first_scheduled_time or now
        if not self.config.scheduler_config.async_scheduling:
            return self._process(so, self.model_runner.execute_model(so))
        # Launched before the host has the tokens of the step in flight (the runner takes
        # them where they were sampled), which then finishes while this one runs.
        launched = (so, self.model_runner.execute_model(so, non_block=True))
        outputs = self._outputs(*taken) if taken else []
        if self._in_flight is not None:
            outputs += self._finish_in_flight()
        self._in_flight = launched
        return outputs

    def _pop_in_flight(self):
        so, pending = self._in_flight
        self._in_flight = None
        return so, pending.get_output()

    def _finish_in_flight(self) -> list[RequestOutput]:
        return self._process(*self._pop_in_flight())

    def _process(self, so, runner_out) -> list[RequestOutput]:
        """A finished step's tokens into the scheduler (stops, blocks) and the outputs."""
        return self._outputs(*self._take(so, runner_out))

    def _take(self, so, runner_out) -> tuple[list[Request], object]:
        """A finished step's tokens into the scheduler: the requests it advanced."""
        return self.scheduler.update_from_output(so, runner_out), runner_out

    def _outputs(self, updated: list[Request], runner_out) -> list[RequestOutput]:
        """The advanced requests' outputs: detokenized, stop strings checked (a stop finishes
        its request), metrics."""
        outputs = []
        now = time.time()
        for req in updated:
            m = req.metrics
            if m.last_token_time is not None:
                m.inter_token_latencies.append(now - m.last_token_time)
            m.first_token_time = m.first_token_time or now
            m.last_token_time = now
            if req.status == RequestStatus.FINISHED_ERROR:  # failed inside the step
                out = self._fail_request(req, req.error)
            else:
                try:
                    out, stop_str = self.output_processor.process(
                        req, runner_out.logprobs.get(req.request_id),
                        runner_out.sampled_logprobs.get(req.request_id),
                        runner_out.prompt_logprobs.get(req.request_id))
                except Exception as e:
                    logger.exception("request %s failed in the output path", req.request_id)
                    out = self._fail_request(req, f"{type(e).__name__}: {e}")
                else:
                    if stop_str is not None and not req.is_finished():
                        self.scheduler.finish_requests([req.request_id],
                                                       RequestStatus.FINISHED_STOPPED)
            if req.is_finished() or (out is not None and out.finished):
                req.metrics.finished_time = now
            if out is not None:
                outputs.append(out)
        return outputs

    def _fail_request(self, req: Request, message: str | None) -> RequestOutput | None:
        """Finishes one request with an error (its blocks freed, the others untouched) and
        returns its final output (finish_reason "error")."""
        req.error = message or "the request failed"
        logger.error("request %s failed: %s", req.request_id, req.error)
        self.scheduler.finish_requests([req.request_id], RequestStatus.FINISHED_ERROR)
        req.status = RequestStatus.FINISHED_ERROR  # also when it had just finished otherwise
        return self.output_processor.fail(req)
