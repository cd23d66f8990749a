"""EngineArgs: an engine's arguments as vLLM names them (LLM(...)'s keywords, `vllmx serve`'s
flags), checked and turned into the VllmxConfig an engine is built from (vLLM's
vllm/engine/arg_utils.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from vllmx.config import (
    LOAD_FORMATS,
    MAMBA_SSM_CACHE_DTYPES,
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
from vllmx.loader import DEFAULT_MODEL
from vllmx.worker.worker_base import DTYPE_BY_NAME

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
    mamba_ssm_cache_dtype: str = "float32"  # config.CacheConfig's
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"  # or "priority"
    num_threads: int | None = None
    # vLLM's tensor_parallel_size, pipeline_parallel_size and distributed_executor_backend
    # (config.ParallelConfig)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    enable_expert_parallel: bool = False
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
    # vLLM's quantization (--quantization / -q): the method the checkpoint holds, checked against
    # its quantization_config (awq, gptq, fp8, compressed-tensors, gguf ...); None: as it says;
    # fp8 of an unquantized checkpoint: vLLM's online fp8 (Hopper GPUs)
    quantization: str | None = None
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
        if self.mamba_ssm_cache_dtype not in MAMBA_SSM_CACHE_DTYPES:
            raise ValueError(f"mamba_ssm_cache_dtype {self.mamba_ssm_cache_dtype!r} is not one "
                             f"of {', '.join(MAMBA_SSM_CACHE_DTYPES)}")
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
                        convert=self.convert, hf_overrides=parse_hf_overrides(self.hf_overrides),
                        quantization=self.quantization),
            CacheConfig(self.block_size, self.kv_cache_dtype, self.kv_cache_memory_bytes,
                        self.num_gpu_blocks_override,
                        enable_prefix_caching=self.enable_prefix_caching,
                        gpu_memory_utilization=self.gpu_memory_utilization,
                        mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype),
            SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens,
                            policy=self.scheduling_policy,
                            async_scheduling=self.async_scheduling),
            ParallelConfig(self.num_threads, self.tensor_parallel_size,
                           self.distributed_executor_backend, self.pipeline_parallel_size,
                           self.enable_expert_parallel),
            DeviceConfig(self.device),
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
