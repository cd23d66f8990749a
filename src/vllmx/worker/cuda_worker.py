"""GPU start-up (vLLM's Worker.determine_available_memory + initialize_cache): choose the device
and activation dtype, profile a forward of max_num_batched_tokens tokens to see what the
activations take, size the KV cache by gpu_memory_utilization (or kv_cache_memory_bytes), and
say in one line how much went where."""

from __future__ import annotations

import logging
import time

import numpy as np

from vllmx import _C
from vllmx.device import BF16, F16, F32, DeviceArray

logger = logging.getLogger("vllmx")

# Compute capabilities the CUDA kernels are built for: sm_80 and sm_90 code, and PTX that newer
# GPUs compile at load. Older GPUs lack the bf16 tensor-core instructions the kernels use.
MIN_CAPABILITY = 80

_DTYPES = {"bfloat16": BF16, "float16": F16, "half": F16, "float32": F32, "float": F32}


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
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be auto, {', '.join(_DTYPES)}; got {dtype!r}")
    return _DTYPES[dtype]


def allocate_kv_caches(num_blocks: int, block_size: int, layers: int, nkv: int, head_dim: int,
                       dtype: int) -> list[tuple[DeviceArray, DeviceArray]]:
    # Zeroed: the padded rows of a decode bucket read slot 0 of block 0 (and discard the result),
    # which must not hold NaN bit patterns from whatever used the memory before.
    shape = (num_blocks, block_size, nkv, head_dim)
    return [(DeviceArray.zeros(shape, dtype), DeviceArray.zeros(shape, dtype))
            for _ in range(layers)]


def profile_run(runner, num_tokens: int, num_seqs: int, max_model_len: int) -> None:
    """One forward of the largest step the scheduler can form: num_tokens prompt tokens (at
    most num_seqs sequences of at most max_model_len each; KV writes skipped, reads from block
    0) plus logits for num_seqs rows: afterwards the caching allocator holds what it needs."""
    per_seq = min(num_tokens, max_model_len)
    num_tokens = min(num_tokens, num_seqs * per_seq)
    nb = -(-num_tokens // per_seq)
    lens = np.full(nb, per_seq, dtype=np.int32)
    lens[-1] = num_tokens - per_seq * (nb - 1)
    runner.input_ids[:num_tokens] = 0
    runner.positions[:num_tokens] = np.concatenate([np.arange(n, dtype=np.int32) for n in lens])
    runner.slot_mapping[:num_tokens] = -1
    runner.query_start_loc[0] = 0
    runner.query_start_loc[1:nb + 1] = np.cumsum(lens)
    runner.seq_lens[:nb] = lens
    runner.block_table[:nb] = 0
    hidden, _ = runner._forward(num_tokens, nb, decode_only=False)
    rows = hidden[:min(num_seqs, num_tokens)]
    from vllmx import ops

    ops.to_float32(runner.model.compute_logits(rows))
    _C.cuda_synchronize()


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
