"""Engine configuration: vLLM's config names and defaults."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any


# vLLM's load_format values vllmx reads (dummy: random weights from config.json alone).
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
# vLLM's --fingerprint-mode values (server/fingerprint.py)
FINGERPRINT_MODES = ("full", "hash", "custom", "none")


@dataclass
class ModelConfig:
    model: str  # as given by the user
    path: str = ""  # resolved local directory or .gguf file
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False
    seed: int = 0
    max_model_len: int | None = None
    generation_config: str = "auto"  # "auto": the model's generation_config.json; "vllm": none
    dtype: str = "auto"  # GPU activations: auto (checkpoint's bf16/f16, else bf16) | bfloat16 | float16
    enforce_eager: bool = False  # no decode step capture (CUDA graphs / CPU step tapes)
    max_logprobs: int = 20  # most logprobs / prompt_logprobs per request (vLLM's); -1: all
    # Most logprob entries one request may hold (positions x (k + 1), times n): each is a Python
    # object of ~340 bytes kept until the request ends, so 4M is ~1.4 GB; vLLM's default 20
    # logprobs fit 190K tokens. A request over it is refused before it runs.
    max_logprob_entries: int = 1 << 22
    # vLLM's load_format: auto (by the path), safetensors, gguf, or dummy (random weights from
    # config.json alone, for benchmarking shapes without their files)
    load_format: str = "auto"
    runner: str = "auto"  # vLLM's --runner as given; runner_type: what it resolved to
    convert: str = "auto"  # vLLM's --convert as given; convert_type: what it resolved to
    runner_type: str = "generate"
    convert_type: str = "none"
    hf_overrides: dict[str, Any] = field(default_factory=dict)  # merged over config.json
    # vLLM's quantization: the method the checkpoint must hold (None: whatever its
    # quantization_config says); of an unquantized checkpoint only "fp8", vLLM's online fp8,
    # which a Hopper GPU runs (loader/quantization.py check_requested)
    quantization: str | None = None
    vocab_size: int = 0  # the model's, set once it is loaded
    hf_config: dict[str, Any] = field(default_factory=dict)
    gen_config: dict[str, Any] = field(default_factory=dict)

    def get_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def is_gguf(self) -> bool:
        return self.path.endswith(".gguf")

    @property
    def architectures(self) -> list[str]:
        return list(self.hf_config.get("architectures") or [])

    def load_hf_config(self) -> None:
        cfg_path = os.path.join(self.path, "config.json")
        with open(cfg_path) as f:
            self.hf_config = {**json.load(f), **self.hf_overrides}
        gen_path = os.path.join(self.path, "generation_config.json")
        if self.generation_config == "auto" and os.path.exists(gen_path):
            with open(gen_path) as f:
                self.gen_config = json.load(f)

    def finalize_max_model_len(self) -> None:
        # GPT-2's config.json names its context n_positions (the rows of its position table).
        key = next((k for k in ("max_position_embeddings", "n_positions") if self.hf_config.get(k)),
                   "max_position_embeddings")
        limit = int(self.hf_config.get(key) or 2048)
        if self.max_model_len is None:
            self.max_model_len = limit
        elif self.max_model_len > limit:
            raise ValueError(
                f"max_model_len={self.max_model_len} is greater than the model's context length "
                f"({key}={limit})"
            )

    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (self.gen_config.get("eos_token_id"), self.hf_config.get("eos_token_id")):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, list):
                ids.update(int(i) for i in src)
        return ids


def json_dict(value: dict | str, name: str) -> dict[str, Any]:
    """A config flag's value as a dict: given as one, or as its JSON (vLLM's flags take both);
    ValueError naming the flag otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(  # noqa: TRY004 - a bad flag value, as vLLM reports it
            f"{name} must be a dict, got {type(value).__name__}")
    return dict(value)


def parse_hf_overrides(value: dict | str | None) -> dict[str, Any]:
    """vLLM's hf_overrides (config.json keys over the checkpoint's) as a dict."""
    return {} if value is None else json_dict(value, "hf_overrides")


MAMBA_SSM_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class CacheConfig:
    block_size: int = 16
    kv_cache_dtype: str = "auto"  # auto | float16 | bfloat16 | float32 (auto: f16, f32 models f32)
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    # CPU default when neither of the above is set: this fraction of RAM, at most 4 GiB
    # (vLLM's CPU default KV space), and never more than max_num_seqs full-length sequences.
    cpu_kv_cache_fraction: float = 0.25
    # GPU default: the KV cache takes what this fraction of the GPU's memory leaves after the
    # weights and the profiled activations (vLLM's default 0.9).
    gpu_memory_utilization: float = 0.9
    num_blocks: int = 0  # decided at start-up
    enable_prefix_caching: bool = True  # reuse the KV of full blocks shared by prompts (APC)
    # vLLM's mamba_ssm_cache_dtype: the Gated DeltaNet and Mamba2 layers' recurrent states
    # (Qwen3-Next, Qwen3.5, Granite-4, Nemotron-H, Falcon-H1) in float32, or on the GPU in the
    # activations' dtype ("auto", or its name: half the state's bytes a decode step reads and
    # writes). float32 by default, where vLLM's is "auto", until measured on a GPU.
    mamba_ssm_cache_dtype: str = "float32"  # one of MAMBA_SSM_CACHE_DTYPES


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 0
    policy: str = "fcfs"  # "fcfs" | "priority" (Request.priority, lower first; ties by arrival)
    # vLLM's async_scheduling: schedule and launch step N + 1 before step N's tokens reach the
    # host, so that the host's per-step work overlaps the GPU's. None: on for the GPU without
    # speculative decoding (the engine resolves it); the CPU gains nothing from it.
    async_scheduling: bool | None = None
    # vLLM's num_lookahead_tokens: KV slots allocated past a request's scheduled tokens, where
    # a drafter that shares the target's blocks (mtp: its own layer's KV) writes its chained
    # drafts; set by the engine.
    num_lookahead_tokens: int = 0


# vLLM's distributed_executor_backend values vllmx runs: "mp" (one process per further rank,
# multiprocessing; the default with several ranks), "ray" (Ray actors on this host launch
# them), "uni" (one rank, in the engine's process).
EXECUTOR_BACKENDS = ("mp", "ray", "uni")


@dataclass
class ParallelConfig:
    num_threads: int | None = None  # OpenMP threads a rank; None: the cores shared by the ranks
    # vLLM's tensor_parallel_size: ranks each holding a share of every layer (CPU so far:
    # distributed/, executor/); the engine's process is rank 0
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # None: "mp" with several ranks, else "uni"
    # vLLM's pipeline_parallel_size: stages each holding a run of layers (ranks = tp * pp)
    pipeline_parallel_size: int = 1
    # vLLM's enable_expert_parallel: a MoE's experts split whole across the tensor-parallel
    # ranks (E / tp each) instead of each expert's intermediate rows
    enable_expert_parallel: bool = False
    rank: int = 0  # this process's rank (set in the processes of the further ranks)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def __post_init__(self):
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend {backend!r} is not one of "
                             f"{', '.join(EXECUTOR_BACKENDS)}")
        if backend == "uni" and self.world_size > 1:
            raise ValueError("distributed_executor_backend='uni' runs one rank; "
                             "tensor_parallel_size * pipeline_parallel_size > 1 needs 'mp' "
                             "or 'ray'")
        if backend is None:
            self.distributed_executor_backend = "mp" if self.world_size > 1 else "uni"


@dataclass
class DeviceConfig:
    device: str = "auto"  # auto (cuda when a usable GPU is present) | cuda | cpu


# vLLM's speculative methods; the ones vllmx runs so far, and the keys each takes.
SPECULATIVE_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa",
                       "mlp_speculator", "suffix")
_SPEC_KEYS = {"ngram": {"method", "num_speculative_tokens", "prompt_lookup_min",
                        "prompt_lookup_max"},
              "draft_model": {"method", "num_speculative_tokens", "model"},
              "eagle": {"method", "num_speculative_tokens", "model"},
              "eagle3": {"method", "num_speculative_tokens", "model"},
              "mtp": {"method", "num_speculative_tokens"}}


@dataclass
class SpeculativeConfig:
    """vLLM's speculative_config (`--speculative-config '{"method": "ngram", ...}'`).

    ngram (prompt lookup): the proposer finds the longest n-gram, prompt_lookup_max down to
    prompt_lookup_min tokens, that ends the request's tokens and occurred before, and proposes
    the num_speculative_tokens tokens that followed its latest earlier occurrence. Both lookup
    bounds default to 5 when neither is given, else to each other (vLLM's defaults).

    draft_model: `model` (a checkpoint directory or GGUF file, as for the target) with the
    target's vocabulary drafts num_speculative_tokens tokens greedily.

    mtp: the target checkpoint's own multi-token-prediction layer (DeepSeek-V3's and GLM-4.5's
    num_nextn_predict_layers, stored after its last layer) drafts num_speculative_tokens tokens
    greedily from the target's hidden states (spec_decode/mtp_proposer.py).

    eagle / eagle3: `model` (an EAGLE-1/2 or EAGLE-3 head's checkpoint directory, safetensors)
    drafts num_speculative_tokens tokens greedily from the target's final hidden states (eagle)
    or the residual streams entering three of its layers (eagle3; spec_decode/eagle.py)."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None

    @classmethod
    def from_dict(cls, cfg: dict[str, Any] | str) -> SpeculativeConfig:
        cfg = json_dict(cfg, "speculative_config")
        method = cfg.get("method")
        if method is None:
            raise ValueError("speculative_config needs a 'method' (vllmx runs: "
                             f"{', '.join(_SPEC_KEYS)})")
        if method not in _SPEC_KEYS:
            known = "a vLLM method vllmx does not run yet" if method in SPECULATIVE_METHODS \
                else "not a speculative method"
            raise ValueError(f"speculative_config method {method!r} is {known}; vllmx runs: "
                             f"{', '.join(_SPEC_KEYS)}")
        unknown = sorted(set(cfg) - _SPEC_KEYS[method])
        if unknown:
            raise ValueError(f"speculative_config keys {unknown} are not supported for method "
                             f"{method!r} (supported: {', '.join(sorted(_SPEC_KEYS[method]))})")
        out = cls(**cfg)
        out._check()
        return out

    def _check(self) -> None:
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative_config num_speculative_tokens must be an integer "
                             f">= 1, got {k!r}")
        if self.method in ("draft_model", "eagle", "eagle3"):
            if not isinstance(self.model, str) or not self.model:
                raise ValueError(f"speculative_config method {self.method!r} needs 'model': "
                                 f"the draft model's path")
            return
        if self.method == "mtp":
            return
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = 5
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative_config {name} must be an integer >= 1, "
                                 f"got {v!r}")
        if lo > hi:
            raise ValueError(f"speculative_config prompt_lookup_min ({lo}) is above "
                             f"prompt_lookup_max ({hi})")
        self.prompt_lookup_min, self.prompt_lookup_max = lo, hi


# vLLM's structured-output backends; llguidance ("guidance") is the one vllmx runs ("auto").
STRUCTURED_OUTPUT_BACKENDS = ("auto", "guidance", "xgrammar", "outlines", "lm-format-enforcer")


@dataclass
class StructuredOutputsConfig:
    """vLLM's structured_outputs_config (`--structured-outputs-config '{...}'`): the engine's
    defaults for every constrained request. disable_any_whitespace / _additional_properties
    apply to requests that do not ask for them themselves; backend auto means guidance
    (llguidance); disable_fallback is accepted (there is no other backend to fall back to).
    reasoning_parser (set by `vllmx serve --reasoning-parser`, as vLLM's): constraints apply
    after the reasoning's end marker, unless enable_in_reasoning."""

    backend: str = "auto"
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    reasoning_parser: str = ""
    enable_in_reasoning: bool = False

    @classmethod
    def from_dict(cls, cfg: dict | str | None) -> StructuredOutputsConfig:
        if cfg is None:
            return cls()
        cfg = json_dict(cfg, "structured_outputs_config")
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(cfg) - known):
            raise ValueError(f"structured_outputs_config keys {unknown} are not supported "
                             f"(supported: {', '.join(sorted(known))})")
        out = cls(**cfg)
        if out.backend not in STRUCTURED_OUTPUT_BACKENDS[:2]:
            what = ("a vLLM backend vllmx does not run" if out.backend in
                    STRUCTURED_OUTPUT_BACKENDS else "not a structured-output backend")
            raise ValueError(f"structured_outputs_config backend {out.backend!r} is {what}; "
                             f"vllmx runs 'auto' / 'guidance' (llguidance)")
        for name in ("disable_fallback", "disable_any_whitespace",
                     "disable_additional_properties", "enable_in_reasoning"):
            if not isinstance(getattr(out, name), bool):
                raise ValueError(  # noqa: TRY004 - a bad flag value, as vLLM reports it
                    f"structured_outputs_config {name} must be true or false, got "
                    f"{getattr(out, name)!r}")
        if out.reasoning_parser:
            from vllmx.reasoning import get_reasoning_parser

            get_reasoning_parser(out.reasoning_parser)  # a clear error listing the names
        return out


LORA_DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass
class LoRAConfig:
    """vLLM's LoRAConfig (--enable-lora): at most max_loras adapters in one step, each of rank
    at most max_lora_rank; max_cpu_loras adapters kept loaded (default max_loras); lora_dtype
    the adapters' weights as applied: "auto" the model's (on the CPU the checkpoint's dense
    weight dtype, float32 for a GGUF; on the GPU the activation dtype), or float32 / float16 /
    bfloat16."""

    max_lora_rank: int = 16
    max_loras: int = 1
    max_cpu_loras: int | None = None
    lora_dtype: str = "auto"

    def __post_init__(self):
        if self.lora_dtype not in LORA_DTYPES:
            raise ValueError(f"lora_dtype must be one of {LORA_DTYPES}, got {self.lora_dtype!r}")
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError(f"max_loras ({self.max_loras}) and max_lora_rank "
                             f"({self.max_lora_rank}) must be positive")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                             f"({self.max_loras})")


# A version as PEP 440 spells it (what vLLM's packaging.version.parse accepts): epoch, release,
# pre / post / dev segments in their long and short spellings, a local label; any case.
_PEP440 = re.compile(
    r"\s*v?(?:\d+!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?"
    r"(?:-\d+|[-_.]?(?:post|rev|r)[-_.]?\d*)?"
    r"(?:[-_.]?dev[-_.]?\d*)?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*", re.IGNORECASE)


@dataclass
class ObservabilityConfig:
    """vLLM's ObservabilityConfig (metrics). show_hidden_metrics_for_version
    (`--show-hidden-metrics-for-version 0.10`): vLLM's escape hatch for the deprecated metrics
    it has hidden; which of them a version shows is server/metrics.py's HIDDEN_METRICS. As in
    vLLM, a value that is not a version is refused."""

    show_hidden_metrics_for_version: str | None = None

    def __post_init__(self):
        v = self.show_hidden_metrics_for_version
        if v is not None and (not isinstance(v, str) or not _PEP440.fullmatch(v)):
            raise ValueError(f"show_hidden_metrics_for_version: Invalid version: {v!r} (a "
                             f"version such as '0.10', as vLLM's flag takes)")

    @property
    def show_hidden_metrics_minor(self) -> tuple[int, int] | None:
        """(major, minor) of show_hidden_metrics_for_version ("0.10.2": (0, 10)); None: unset."""
        v = self.show_hidden_metrics_for_version
        if v is None:
            return None
        release = [int(x) for x in _PEP440.fullmatch(v)["release"].split(".")]
        return release[0], (release[1:] or [0])[0]


@dataclass
class VllmxConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    speculative_config: SpeculativeConfig | None = None
    structured_outputs_config: StructuredOutputsConfig = field(
        default_factory=StructuredOutputsConfig)
    lora_config: LoRAConfig | None = None  # None: LoRA off (vLLM's enable_lora=False)
    observability_config: ObservabilityConfig = field(default_factory=ObservabilityConfig)
