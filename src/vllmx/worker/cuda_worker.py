"""The CUDA worker (vLLM's Worker: determine_available_memory + initialize_cache): choose the
device and activation dtype, profile a forward of max_num_batched_tokens tokens to see what the
activations take, size the KV cache by gpu_memory_utilization (or kv_cache_memory_bytes),
capture the decode graphs, and say in one line how much went where."""

from __future__ import annotations

import gc
import json
import logging
import os
import time

from vllmx import _C
from vllmx.device import BF16, F16, F32, DeviceArray
from vllmx.layers.placement import Placement, placement
from vllmx.loader import load_model, resolve_model
from vllmx.worker.model_runner import ModelRunner
from vllmx.worker.worker_base import (
    DTYPE_BY_NAME,
    DTYPE_NAMES,
    WorkerBase,
    kv_block_bytes,
    kv_cache_layers,
    num_draft_kv_layers,
    num_kv_blocks,
)

logger = logging.getLogger("vllmx")

# Compute capabilities the CUDA kernels are built for: sm_80 and sm_90 code, and PTX that newer
# GPUs compile at load. Older GPUs lack the bf16 tensor-core instructions the kernels use.
MIN_CAPABILITY = 80


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a usable GPU is present, else 'cpu'; 'cuda' without one is a clear
    error naming why."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "cpu":
        return "cpu"
    if not _C.cuda_built():
        if device == "cuda":
            raise ValueError("device='cuda': this vllmx was built without CUDA (reinstall with "
                             "nvcc on the PATH, or VLLMX_CUDA=1); use device='cpu'")
        return "cpu"
    if not _C.cuda_available():
        if device == "cuda":
            raise ValueError("device='cuda': no CUDA GPU is available (no driver, or no device "
                             "visible); use device='cpu'")
        return "cpu"
    name, cap = _C.cuda_device_info()
    if cap < MIN_CAPABILITY:
        msg = (f"{name} has compute capability {cap // 10}.{cap % 10}; vllmx's CUDA kernels need "
               f"{MIN_CAPABILITY // 10}.{MIN_CAPABILITY % 10} or newer (Ampere, Hopper, ...)")
        if device == "cuda":
            raise ValueError(msg + "; use device='cpu'")
        logger.info("%s: running on the CPU", msg)
        return "cpu"
    return "cuda"


def activation_dtype(dtype: str, hf_config: dict) -> int:
    """vLLM's dtype='auto' on the GPU: the checkpoint's bf16 / f16, else bf16 (f32 and GGUF
    checkpoints compute in bf16). dtype='float32' runs the kernels' f32 paths: exact and batch
    invariant, but without tensor cores (a reference, not for speed)."""
    if dtype == "auto":
        stored = hf_config.get("torch_dtype", hf_config.get("dtype"))
        return F16 if stored in ("float16", "half") else BF16
    if dtype not in DTYPE_BY_NAME:
        raise ValueError(f"dtype must be auto, {', '.join(DTYPE_BY_NAME)}; got {dtype!r}")
    return DTYPE_BY_NAME[dtype]


def model_activation_dtype(model_config) -> int:
    """activation_dtype for a ModelConfig's checkpoint (its config.json read for its dtype)."""
    path = resolve_model(model_config.model, weights=model_config.load_format != "dummy")
    hf = {}
    if not path.endswith(".gguf"):  # the checkpoint's dtype decides dtype="auto"
        with open(os.path.join(path, "config.json")) as f:
            hf = json.load(f)
    return activation_dtype(model_config.dtype, hf)


def allocate_kv_caches(num_blocks: int, block_size: int, layers: list[bool], nkv: int,
                       head_dim: int, dtype: int, mla: bool = False
                       ) -> list[tuple[DeviceArray, DeviceArray]]:
    """Each layer's (key_cache, value_cache); MLA's latent rows are both, one buffer (as
    kv_block_bytes counts them). layers: whether each writes KV (kv_cache_layers); the others
    (a hybrid's recurrent mixers) share one block, since cudaMalloc commits what it is asked
    for where the CPU's untouched pages stay uncommitted."""
    # Zeroed: the padded rows of a decode bucket read slot 0 of block 0 (and discard the result),
    # which must not hold NaN bit patterns from whatever used the memory before.
    def cache(blocks):
        k = DeviceArray.zeros((blocks, block_size, nkv, head_dim), dtype)
        return k, k if mla else DeviceArray.zeros((blocks, block_size, nkv, head_dim), dtype)

    unused = cache(1) if not all(layers) else None
    return [cache(num_blocks) if writes else unused for writes in layers]


class StartupReport:
    """Collects what went where for the start-up line."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.total = _C.cuda_mem_get_info()[1]
        self.parts: list[str] = []

    def used(self) -> int:
        free, total = _C.cuda_mem_get_info()
        return total - free

    def log(self, name: str) -> None:
        gib = 2**30
        logger.info("CUDA %s (%.1f GiB): %s; %.1fs", name, self.total / gib,
                    ", ".join(self.parts), time.perf_counter() - self.t0)


class CudaWorker(WorkerBase):
    """Weights to the GPU, a profiled forward, the KV cache in what is left, then the decode
    graphs; one log line says how much went where."""

    def load_model(self) -> None:
        mc = self.config.model_config
        gc.collect()  # an earlier engine's device arrays go back to the pool, which is emptied
        _C.cuda_empty_cache()
        self.report = StartupReport()
        used0 = self.report.used()
        self.act_dtype = model_activation_dtype(mc)
        # quantization="fp8": an fp8 checkpoint's weights come as fp8 already; a dense one's
        # projections are quantized at upload (vLLM's online fp8; the loader checks the GPU).
        with placement(Placement("cuda", self.act_dtype, self.ssm_state_dtype(),
                                 fp8_weights=mc.quantization == "fp8")):
            self.model, self.tokenizer = load_model(mc)
        self.weight_bytes = self.report.used() - used0
        self.report.parts.append(f"weights {self.weight_bytes / 2**30:.2f} GiB")

    def ssm_state_dtype(self) -> int:
        """The hybrid mixers' recurrent states' dtype: mamba_ssm_cache_dtype's (auto: the
        activations'; placement.recurrent_state_dtype checks that the kernels keep it)."""
        v = self.config.cache_config.mamba_ssm_cache_dtype
        return self.act_dtype if v == "auto" else DTYPE_BY_NAME[v]

    def kv_dtype(self) -> int:
        """The KV cache's dtype: kv_cache_dtype's, or the activations' (auto)."""
        kv = self.config.cache_config.kv_cache_dtype
        return self.act_dtype if kv == "auto" else DTYPE_BY_NAME[kv]

    def initialize_kv_cache(self) -> None:
        mc, cc, sc = (self.config.model_config, self.config.cache_config,
                      self.config.scheduler_config)
        report, hf = self.report, self.model.config
        nkv, hd = hf["num_key_value_heads"], hf["head_dim"]
        mla, spec = bool(hf.get("use_mla")), self.config.speculative_config
        dtype = self.kv_dtype()
        # Profile with a one-block cache (reads of block 0, writes skipped).
        states0 = report.used()
        runner = ModelRunner(self.model,
                             allocate_kv_caches(1, cc.block_size, kv_cache_layers(hf), nkv, hd, dtype,
                                                mla),
                             dtype, cc.block_size, sc.max_num_batched_tokens, sc.max_num_seqs,
                             mc.max_model_len, mc.seed, device="cuda",
                             num_speculative_tokens=spec.num_speculative_tokens
                             if spec is not None else 0)
        if runner.state_slots is not None:  # a hybrid's recurrent states, a slot a sequence
            report.parts.append(f"recurrent states {(report.used() - states0) / 2**30:.2f} GiB "
                                f"({sc.max_num_seqs} sequences)")
        before = report.used()
        runner.profile_run()
        _C.cuda_synchronize()
        report.parts.append(f"activations {(report.used() - before) / 2**30:.2f} GiB "
                            f"(profiled at {sc.max_num_batched_tokens} tokens)")
        # An mtp / eagle drafter's KV layers sit in the target's blocks, after its layers.
        draft_layers = num_draft_kv_layers(self.config)
        block_bytes = kv_block_bytes(hf, cc.block_size, 4 if dtype == F32 else 2, draft_layers)
        # A draft model's cache beside this one (draft_model speculation): its bytes a block
        # and its draft-only blocks come out of the same budget.
        draft_per_block, draft_fixed = getattr(self, "kv_reserve", (0, 0))
        budget = (int(cc.gpu_memory_utilization * report.total) - report.used()
                  - draft_fixed)
        num_blocks = num_kv_blocks(
            self.config, block_bytes + draft_per_block, budget,
            f"the model does not fit: after {self.weight_bytes / 2**30:.2f} GiB of weights and "
            f"the activations of a {sc.max_num_batched_tokens}-token step, that is what "
            f"gpu_memory_utilization={cc.gpu_memory_utilization} of "
            f"{report.total / 2**30:.1f} GiB leaves; lower max_model_len or "
            f"max_num_batched_tokens, or raise gpu_memory_utilization")
        self.kv_caches = allocate_kv_caches(num_blocks, cc.block_size,
                                            kv_cache_layers(hf, draft_layers), nkv, hd, dtype,
                                            mla)
        self.cache_dtype, runner.kv_caches = dtype, self.kv_caches
        report.parts.append(f"KV cache {num_blocks * block_bytes / 2**30:.2f} GiB = "
                            f"{num_blocks} blocks x {cc.block_size} tokens "
                            f"({DTYPE_NAMES[dtype]})")
        self.model_runner = runner

    def compile_or_warm_up_model(self) -> None:
        report, runner = self.report, self.model_runner
        if self.config.model_config.enforce_eager:
            report.parts.append("CUDA graphs off (enforce_eager)")
        else:
            before, t0 = report.used(), time.perf_counter()
            runner.capture_model()
            dc = runner.decode_capture
            verify = (f" and {len(dc.verify_sizes)} verify ones up to {dc.verify_sizes[-1]} x "
                      f"{dc.verify_len} tokens" if dc.verify_sizes else "")
            report.parts.append(f"CUDA graphs for {len(dc.sizes)} decode batch sizes up to "
                                f"{dc.sizes[-1]}{verify} ({(report.used() - before) / 2**20:.0f} "
                                f"MiB, {time.perf_counter() - t0:.1f}s)")
        report.log(_C.cuda_device_info()[0])
