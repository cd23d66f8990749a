"""A worker per device (vLLM's Worker shape): load the model, size and allocate the KV cache,
warm up / capture, then hand the engine a ModelRunner. LLMEngine has no device branches: it
asks create_worker for the device's worker and drives the same four steps on any of them.

KV cache sizing is one rule for every device (num_kv_blocks): an explicit block count, else
kv_cache_memory_bytes, else what the device's budget leaves; never fewer blocks than one
max_model_len sequence needs."""

from __future__ import annotations

from abc import ABC, abstractmethod

from vllmx.config import VllmxConfig
from vllmx.device import BF16, F16, F32

# vLLM's dtype names (dtype=, kv_cache_dtype=) -> dtype ids, and the ids' short names for logs.
DTYPE_BY_NAME = {"float16": F16, "half": F16, "float32": F32, "float": F32, "bfloat16": BF16}
DTYPE_NAMES = {F16: "f16", F32: "f32", BF16: "bf16"}


class WorkerBase(ABC):
    def __init__(self, config: VllmxConfig):
        self.config = config
        self.model = None
        self.tokenizer = None
        self.model_runner = None
        self.kv_caches: list = []
        self.cache_dtype: int = F32

    @abstractmethod
    def load_model(self) -> None:
        """Sets self.model and self.tokenizer."""

    @abstractmethod
    def initialize_kv_cache(self) -> None:
        """Sizes the KV cache (cache_config.num_blocks), allocates it and builds
        self.model_runner over it."""

    def compile_or_warm_up_model(self) -> None:
        """Captures the decode buckets this device captures at start-up (the GPU's graphs; the
        CPU's tapes are recorded as buckets first run)."""
        self.model_runner.capture_model()


def num_draft_kv_layers(config: VllmxConfig) -> int:
    """KV layers a drafter adds to the target's cache, in the target's blocks (mtp: its MTP
    layer's, at index num_hidden_layers; eagle / eagle3: one per draft layer, from there);
    ValueError where the model has none."""
    spec = config.speculative_config
    if spec is not None and spec.method in ("eagle", "eagle3"):
        from vllmx.spec_decode.eagle import eagle_layer_count

        return eagle_layer_count(spec)
    if spec is None or spec.method != "mtp":
        return 0
    from vllmx.spec_decode.mtp_proposer import mtp_layer_count

    return mtp_layer_count(config.model_config)


def kv_cache_layers(hf_config: dict, draft_layers: int = 0) -> list[bool]:
    """Whether each layer writes KV, the model's then its drafter's: every one, or a hybrid's
    attention layers (num_kv_cache_layers of them, as kv_block_bytes counts)."""
    n = hf_config["num_hidden_layers"]
    types = hf_config.get("layer_types") if hf_config.get("num_kv_cache_layers") else None
    own = [True] * n if types is None else [t == "full_attention" for t in types[:n]]
    return own + [True] * draft_layers


def kv_block_bytes(hf_config: dict, block_size: int, itemsize: int,
                   draft_layers: int = 0) -> int:
    """Bytes of one KV block across all layers (K and V; MLA's one latent row a token), the
    drafter's too."""
    caches = 1 if hf_config.get("use_mla") else 2
    # Hybrid models: only the attention layers write KV (the others' pages stay uncommitted).
    layers = (hf_config.get("num_kv_cache_layers") or hf_config["num_hidden_layers"]) \
        + draft_layers
    return (caches * layers * block_size
            * hf_config["num_key_value_heads"] * hf_config["head_dim"] * itemsize)


def num_kv_blocks(config: VllmxConfig, block_bytes: int, budget_bytes: int,
                  too_small: str) -> int:
    """The KV cache's block count (also stored in cache_config.num_blocks); ValueError with
    too_small's advice when it cannot hold one max_model_len sequence."""
    cc, mc = config.cache_config, config.model_config
    if cc.num_gpu_blocks_override:
        num_blocks = cc.num_gpu_blocks_override
    elif cc.kv_cache_memory_bytes:
        num_blocks = cc.kv_cache_memory_bytes // block_bytes
    else:
        num_blocks = max(budget_bytes, 0) // block_bytes
    if num_blocks * cc.block_size < mc.max_model_len:
        raise ValueError(
            f"the KV cache holds {num_blocks} blocks of {cc.block_size} tokens "
            f"({num_blocks * cc.block_size} tokens), fewer than max_model_len="
            f"{mc.max_model_len}; {too_small}")
    cc.num_blocks = num_blocks
    return num_blocks


def create_worker(config: VllmxConfig) -> tuple[str, WorkerBase]:
    """The resolved device ('cpu' / 'cuda') and its worker."""
    from vllmx.worker import cuda_worker

    device = cuda_worker.resolve_device(config.device_config.device)
    if device == "cuda" and config.parallel_config.world_size > 1:
        raise ValueError("several ranks (tensor / pipeline parallelism) run on the CPU so far "
                         "(device='cpu'); the GPU's need NCCL, not built yet")
    if device == "cuda":
        return device, cuda_worker.CudaWorker(config)
    from vllmx.worker.cpu_worker import CpuWorker

    return device, CpuWorker(config)
