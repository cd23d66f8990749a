"""LLMEngine: requests in, RequestOutputs out, one scheduler step at a time."""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from dataclasses import dataclass

import numpy as np

from vllmx import _C
from vllmx.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmxConfig,
)
from vllmx.core.scheduler import Scheduler
from vllmx.engine.output_processor import OutputProcessor, ParentRequest
from vllmx.engine.request import Request, RequestStatus
from vllmx.layers.placement import Placement, placement
from vllmx.loader import DEFAULT_MODEL, load_model, resolve_model
from vllmx.ops import F16, F32
from vllmx.outputs import RequestOutput
from vllmx.pages import lazy_zeros
from vllmx.sampling_params import SamplingParams
from vllmx.worker import cuda_worker
from vllmx.worker.model_runner import ModelRunner

logger = logging.getLogger("vllmx")

_KV_DTYPES = {"float16": F16, "half": F16, "float32": F32, "float": F32, "bfloat16": 30}


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

    def create_engine_config(self) -> VllmxConfig:
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in _KV_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of auto, "
                             f"{', '.join(_KV_DTYPES)}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got "
                             f"{self.scheduling_policy!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        return VllmxConfig(
            ModelConfig(self.model, tokenizer=self.tokenizer,
                        skip_tokenizer_init=self.skip_tokenizer_init, seed=self.seed,
                        max_model_len=self.max_model_len,
                        generation_config=self.generation_config, dtype=self.dtype,
                        enforce_eager=self.enforce_eager, max_logprobs=self.max_logprobs),
            CacheConfig(self.block_size, self.kv_cache_dtype, self.kv_cache_memory_bytes,
                        self.num_gpu_blocks_override,
                        enable_prefix_caching=self.enable_prefix_caching,
                        gpu_memory_utilization=self.gpu_memory_utilization),
            SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens,
                            policy=self.scheduling_policy),
            ParallelConfig(self.num_threads), DeviceConfig(self.device))


def _total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


class LLMEngine:
    def __init__(self, config: VllmxConfig):
        self.config = config
        mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
        if config.parallel_config.num_threads:
            _C.set_num_threads(config.parallel_config.num_threads)
        t0 = time.perf_counter()
        self.device = cuda_worker.resolve_device(config.device_config.device)
        if self.device == "cuda":
            self._init_cuda()
        else:
            if mc.dtype not in ("auto", "float32", "float"):
                raise ValueError(f"dtype={mc.dtype!r}: the CPU backend computes in float32 "
                                 f"(weights stay in their stored format); use dtype='auto'")
            self.model, self.tokenizer = load_model(mc)
            self._finish_model_config()
            self.kv_caches, self.cache_dtype = self._allocate_kv_cache()
            self.model_runner = ModelRunner(self.model, self.kv_caches, self.cache_dtype,
                                            cc.block_size, sc.max_num_batched_tokens,
                                            sc.max_num_seqs, mc.max_model_len, mc.seed,
                                            enforce_eager=mc.enforce_eager)
        self.scheduler = Scheduler(sc, cc)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._next_id = 0
        logger.info("loaded %s in %.2fs", mc.path, time.perf_counter() - t0)

    def _finish_model_config(self) -> None:
        mc = self.config.model_config
        self.config.scheduler_config.max_model_len = mc.max_model_len
        mc.vocab_size = self.model.vocab_size
        self.eos_token_ids = mc.eos_token_ids()
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)

    def _init_cuda(self) -> None:
        """Weights to the GPU, a profiled forward, the KV cache in what is left, then the
        decode graphs; one log line says how much went where."""
        mc, cc, sc = self.config.model_config, self.config.cache_config, self.config.scheduler_config
        gc.collect()  # an earlier engine's device arrays go back to the pool, which is emptied
        _C.cuda_empty_cache()
        report = cuda_worker.StartupReport()
        used0 = report.used()
        path = resolve_model(mc.model)
        hf = {}
        if not path.endswith(".gguf"):  # the checkpoint's dtype decides dtype="auto"
            with open(os.path.join(path, "config.json")) as f:
                hf = json.load(f)
        act = cuda_worker.activation_dtype(mc.dtype, hf)
        with placement(Placement("cuda", act)):
            self.model, self.tokenizer = load_model(mc)
        self._finish_model_config()
        used_weights = report.used() - used0
        report.parts.append(f"weights {used_weights / 2**30:.2f} GiB")
        hf = self.model.config
        nkv, hd, layers = hf["num_key_value_heads"], hf["head_dim"], hf["num_hidden_layers"]
        dtype = act if cc.kv_cache_dtype == "auto" else _KV_DTYPES[cc.kv_cache_dtype]
        self.cache_dtype = dtype
        # Profile with a one-block cache (reads of block 0, writes skipped).
        runner = ModelRunner(self.model,
                             cuda_worker.allocate_kv_caches(1, cc.block_size, layers, nkv, hd,
                                                            dtype),
                             dtype, cc.block_size, sc.max_num_batched_tokens, sc.max_num_seqs,
                             mc.max_model_len, mc.seed, device="cuda")
        before = report.used()
        cuda_worker.profile_run(runner, sc.max_num_batched_tokens, sc.max_num_seqs,
                                mc.max_model_len)
        report.parts.append(f"activations {(report.used() - before) / 2**30:.2f} GiB "
                            f"(profiled at {sc.max_num_batched_tokens} tokens)")
        block_bytes = 2 * layers * cc.block_size * nkv * hd * (4 if dtype == F32 else 2)
        if cc.num_gpu_blocks_override:
            num_blocks = cc.num_gpu_blocks_override
        elif cc.kv_cache_memory_bytes:
            num_blocks = cc.kv_cache_memory_bytes // block_bytes
        else:
            budget = int(cc.gpu_memory_utilization * report.total) - report.used()
            num_blocks = max(budget, 0) // block_bytes
        if num_blocks * cc.block_size < mc.max_model_len:
            raise ValueError(
                f"the model does not fit: after {used_weights / 2**30:.2f} GiB of weights and "
                f"the activations of a {sc.max_num_batched_tokens}-token step, "
                f"gpu_memory_utilization={cc.gpu_memory_utilization} of "
                f"{report.total / 2**30:.1f} GiB leaves {num_blocks} KV blocks "
                f"({num_blocks * cc.block_size} tokens), fewer than max_model_len="
                f"{mc.max_model_len}; lower max_model_len or max_num_batched_tokens, or raise "
                f"gpu_memory_utilization")
        cc.num_blocks = num_blocks
        self.kv_caches = cuda_worker.allocate_kv_caches(num_blocks, cc.block_size, layers, nkv,
                                                        hd, dtype)
        runner.kv_caches = self.kv_caches
        report.parts.append(f"KV cache {num_blocks * block_bytes / 2**30:.2f} GiB = "
                            f"{num_blocks} blocks x {cc.block_size} tokens "
                            f"({ {F16: 'f16', F32: 'f32', 30: 'bf16'}[dtype]})")
        if mc.enforce_eager:
            report.parts.append("CUDA graphs off (enforce_eager)")
        else:
            before, t0 = report.used(), time.perf_counter()
            sizes = runner.decode_buckets
            runner.capture_cudagraphs(sizes)
            report.parts.append(f"CUDA graphs for {len(sizes)} decode batch sizes up to "
                                f"{sizes[-1]} ({(report.used() - before) / 2**20:.0f} MiB, "
                                f"{time.perf_counter() - t0:.1f}s)")
        self.model_runner = runner
        report.log(_C.cuda_device_info()[0])

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args.create_engine_config())

    def _allocate_kv_cache(self):
        mc, cc, sc = self.config.model_config, self.config.cache_config, self.config.scheduler_config
        hf = self.model.config
        if cc.kv_cache_dtype == "auto":  # f16 by default; an f32 checkpoint keeps f32
            f32_model = mc.hf_config.get("torch_dtype", mc.hf_config.get("dtype")) == "float32"
            dtype = F32 if (f32_model and not mc.is_gguf) else F16
        else:
            dtype = _KV_DTYPES[cc.kv_cache_dtype]
        itemsize = 4 if dtype == F32 else 2
        nkv, hd, layers = hf["num_key_value_heads"], hf["head_dim"], hf["num_hidden_layers"]
        block_bytes = 2 * layers * cc.block_size * nkv * hd * itemsize
        if cc.num_gpu_blocks_override:
            num_blocks = cc.num_gpu_blocks_override
        elif cc.kv_cache_memory_bytes:
            num_blocks = cc.kv_cache_memory_bytes // block_bytes
        else:
            budget = min(4 << 30, int(_total_memory_bytes() * cc.cpu_kv_cache_fraction))
            per_seq = -(-mc.max_model_len // cc.block_size)
            num_blocks = min(budget // block_bytes, per_seq * sc.max_num_seqs)
        if num_blocks * cc.block_size < mc.max_model_len:
            raise ValueError(
                f"the KV cache holds {num_blocks} blocks of {cc.block_size} tokens "
                f"({num_blocks * cc.block_size} tokens), fewer than max_model_len="
                f"{mc.max_model_len}; raise kv_cache_memory_bytes or lower max_model_len")
        cc.num_blocks = num_blocks
        np_dtype = np.float32 if dtype == F32 else np.uint16
        shape = (num_blocks, cc.block_size, nkv, hd)
        # Pages are committed as blocks are first written (and the block pool reuses freed
        # blocks first), so an idle or lightly used cache costs little resident memory.
        caches = [(lazy_zeros(shape, np_dtype), lazy_zeros(shape, np_dtype))
                  for _ in range(layers)]
        logger.info("KV cache: %d blocks x %d tokens (%s, %.1f MiB), max_model_len %d",
                    num_blocks, cc.block_size, {F16: "f16", F32: "f32", 30: "bf16"}[dtype],
                    num_blocks * block_bytes / 2**20, mc.max_model_len)
        return caches, dtype

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
                    cache_salt: str | None = None) -> str:
        """Queues a request (n > 1 fans out into n child requests); returns its id."""
        params = params or SamplingParams()
        text, ids = self._tokenize(prompt)
        ids = self._truncate(ids, params)
        self._validate(ids, params)
        if request_id is None:
            request_id = str(self._next_id)
            self._next_id += 1
        if request_id in self.scheduler.requests or request_id in self.output_processor.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        params.all_stop_token_ids = set(self.eos_token_ids)
        if params.n == 1:
            self._add(Request(request_id, ids, params, text, arrival_time, priority, cache_salt))
            return request_id
        parent = ParentRequest(request_id, params)
        for i in range(params.n):
            child = Request(f"{i}_{request_id}", ids, parent.child_params(i), text, arrival_time,
                            priority, cache_salt)
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
        # vLLM's --max-logprobs (-1: no limit); logprobs=-1 asks for the whole vocabulary.
        limit = vocab if mc.max_logprobs == -1 else mc.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and (vocab if k == -1 else k) > limit:
                what = "sample logprobs" if name == "logprobs" else "prompt logprobs"
                raise ValueError(f"Requested {what} of {vocab if k == -1 else k}, which is "
                                 f"greater than max allowed: {limit}")

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
        so = self.scheduler.schedule()
        if so.total_num_scheduled_tokens == 0:
            if self.scheduler.has_unfinished_requests() and not self.scheduler.running:
                raise RuntimeError("scheduler made no progress with requests waiting")
            return []
        now = time.time()
        for req_id in so.num_scheduled_tokens:
            r = self.scheduler.requests[req_id]
            r.metrics.first_scheduled_time = r.metrics.first_scheduled_time or now
        runner_out = self.model_runner.execute_model(so)
        updated = self.scheduler.update_from_output(so, runner_out)
        outputs = []
        now = time.time()
        for req in updated:
            req.metrics.first_token_time = req.metrics.first_token_time or now
            req.metrics.last_token_time = now
            if req.status == RequestStatus.FINISHED_ERROR:  # failed inside the step
                out = self._fail_request(req, req.error)
            else:
                try:
                    out, stop_str = self.output_processor.process(
                        req, runner_out.logprobs.get(req.request_id),
                        runner_out.sampled_logprobs.get(req.request_id, 0.0),
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
