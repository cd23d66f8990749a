"""LLMEngine: requests in, RequestOutputs out, one scheduler step at a time."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from vllmx import _C
from vllmx.config import (
    LOAD_FORMATS,
    CacheConfig,
    DeviceConfig,
    LoRAConfig,
    ModelConfig,
    ObservabilityConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    StructuredOutputsConfig,
    VllmxConfig,
    parse_hf_overrides,
)
from vllmx.core.scheduler import Scheduler
from vllmx.engine.output_processor import OutputProcessor, ParentRequest
from vllmx.engine.request import Request, RequestStatus
from vllmx.loader import DEFAULT_MODEL
from vllmx.outputs import RequestOutput
from vllmx.sampling_params import SamplingParams
from vllmx.structured_output import StructuredOutputManager
from vllmx.worker.worker_base import DTYPE_BY_NAME, create_worker

logger = logging.getLogger("vllmx")


@dataclass
class EngineArgs:
    model: str = DEFAULT_MODEL
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False
    seed: int = 0
    max_model_len: int | None = None
    generation_config: str = "auto"
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"  # or "priority"
    num_threads: int | None = None
    device: str = "auto"  # auto | cuda | cpu
    dtype: str = "auto"  # GPU activations; the CPU computes in float32
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    max_logprobs: int = 20  # vLLM's: most logprobs / prompt_logprobs a request may ask; -1 all
    max_logprob_entries: int = 1 << 22  # ModelConfig's: logprob entries one request may hold
    load_format: str = "auto"  # auto | safetensors | gguf | dummy (random weights, vLLM's)
    # vLLM's speculative_config: a dict or its JSON, e.g. {"method": "ngram",
    # "num_speculative_tokens": 4}; None: no speculation (config.SpeculativeConfig)
    speculative_config: dict | str | None = None
    # vLLM's async_scheduling (SchedulerConfig): None = on for the GPU without speculation
    async_scheduling: bool | None = None
    # vLLM's structured_outputs_config: a dict or its JSON, e.g. {"disable_any_whitespace":
    # true}; the engine's defaults for constrained requests (config.StructuredOutputsConfig)
    structured_outputs_config: dict | str | None = None
    # vLLM's --runner (auto | generate | pooling) and --convert (auto | none | embed |
    # classify): auto picks by the checkpoint's architecture (pooler_config.resolve_runner)
    runner: str = "auto"
    convert: str = "auto"
    # vLLM's pooler_config: {"pooling_type": "CLS" | "MEAN" | "LAST", "normalize": bool}, over
    # the model's and its sentence-transformers config's defaults
    pooler_config: dict | str | None = None
    # vLLM's hf_overrides: a dict (or its JSON) merged over config.json, e.g. a Qwen3-Reranker's
    # {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no",
    # "yes"], "is_original_qwen3_reranker": true}
    hf_overrides: dict | str | None = None
    # vLLM's LoRA arguments: adapters per request (LoRARequest); at most max_loras of them in
    # one step, each of rank <= max_lora_rank; max_cpu_loras kept loaded (default max_loras)
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    lora_dtype: str = "auto"  # the adapters' weights: the model's dtype, or float32/16, bfloat16
    # vLLM's show_hidden_metrics_for_version (ObservabilityConfig): e.g. "0.10" shows the
    # deprecated metrics vLLM hid after that version (server/metrics.py HIDDEN_METRICS)
    show_hidden_metrics_for_version: str | None = None

    def _check_sizes(self) -> None:
        """Counts and sizes a user gives, checked before anything is built from them: a zero or
        negative one would otherwise surface later as a KV cache of no blocks, an array of
        negative size or a scheduler that cannot make progress."""
        at_least_1 = {"block_size": self.block_size, "max_num_seqs": self.max_num_seqs,
                      "max_num_batched_tokens": self.max_num_batched_tokens,
                      "max_model_len": self.max_model_len, "num_threads": self.num_threads,
                      "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
                      "num_gpu_blocks_override": self.num_gpu_blocks_override}
        for name, value in at_least_1.items():
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be >= 0, or -1 for no limit, got "
                             f"{self.max_logprobs}")
        if self.max_logprob_entries < 1:
            raise ValueError(f"max_logprob_entries must be >= 1, got {self.max_logprob_entries}")

    def create_engine_config(self) -> VllmxConfig:
        self._check_sizes()
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in DTYPE_BY_NAME:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of auto, "
                             f"{', '.join(DTYPE_BY_NAME)}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got "
                             f"{self.scheduling_policy!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format {self.load_format!r} is not supported; vllmx reads "
                             f"{', '.join(LOAD_FORMATS)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        return VllmxConfig(
            ModelConfig(self.model, tokenizer=self.tokenizer,
                        skip_tokenizer_init=self.skip_tokenizer_init, seed=self.seed,
                        max_model_len=self.max_model_len,
                        generation_config=self.generation_config, dtype=self.dtype,
                        enforce_eager=self.enforce_eager, max_logprobs=self.max_logprobs,
                        max_logprob_entries=self.max_logprob_entries,
                        load_format=self.load_format, runner=self.runner,
                        convert=self.convert, hf_overrides=parse_hf_overrides(self.hf_overrides)),
            CacheConfig(self.block_size, self.kv_cache_dtype, self.kv_cache_memory_bytes,
                        self.num_gpu_blocks_override,
                        enable_prefix_caching=self.enable_prefix_caching,
                        gpu_memory_utilization=self.gpu_memory_utilization),
            SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens,
                            policy=self.scheduling_policy,
                            async_scheduling=self.async_scheduling),
            ParallelConfig(self.num_threads), DeviceConfig(self.device),
            None if self.speculative_config is None
            else SpeculativeConfig.from_dict(self.speculative_config),
            StructuredOutputsConfig.from_dict(self.structured_outputs_config),
            self._lora_config(),
            ObservabilityConfig(self.show_hidden_metrics_for_version))

    def _lora_config(self) -> LoRAConfig | None:
        if not self.enable_lora:
            return None
        # (With speculative decoding the target verifies each row under its request's adapter;
        # a drafter runs without adapters, which costs acceptance, never tokens.)
        return LoRAConfig(self.max_lora_rank, self.max_loras, self.max_cpu_loras,
                          self.lora_dtype)


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
            sc.async_scheduling = self.device == "cuda" and config.speculative_config is None
        elif sc.async_scheduling and config.speculative_config is not None:
            raise ValueError("async_scheduling does not support speculative decoding yet "
                             "(the drafts of step N + 1 need step N's tokens on the host)")
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
            if self.config.speculative_config is not None:
                raise ValueError("speculative decoding does not support hybrid (linear "
                                 "attention / state-space) models yet")
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
        so = self.scheduler.schedule()
        if so.total_num_scheduled_tokens == 0:
            if self._in_flight is not None:
                return self._finish_in_flight()
            if self.scheduler.has_unfinished_requests() and not self.scheduler.running:
                raise RuntimeError("scheduler made no progress with requests waiting")
            return []
        now = time.time()
        for req_id in so.num_scheduled_tokens:
            r = self.scheduler.requests[req_id]
            r.metrics.first_scheduled_time = r.metrics.first_scheduled_time or now
        if not self.config.scheduler_config.async_scheduling:
            return self._process(so, self.model_runner.execute_model(so))
        # Launched before the host has the tokens of the step in flight (the runner takes
        # them where they were sampled), which then finishes while this one runs.
        launched = (so, self.model_runner.execute_model(so, non_block=True))
        outputs = self._finish_in_flight() if self._in_flight is not None else []
        self._in_flight = launched
        return outputs

    def _finish_in_flight(self) -> list[RequestOutput]:
        so, pending = self._in_flight
        self._in_flight = None
        return self._process(so, pending.get_output())

    def _process(self, so, runner_out) -> list[RequestOutput]:
        """A finished step's tokens into the scheduler (stops, blocks) and the outputs."""
        updated = self.scheduler.update_from_output(so, runner_out)
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
