"""The CPU worker: the model in its stored formats (computing in float32), a KV cache that
takes a share of RAM and commits its pages only as blocks are written, decode steps captured
lazily as native op tapes (by the ModelRunner, per batch bucket)."""

from __future__ import annotations

import logging
import os

import numpy as np

from vllmx.device import F16, F32
from vllmx.loader import load_model
from vllmx.pages import keep_activations_in_heap, lazy_zeros
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

# vLLM's dtype names the CPU takes: auto and float32 as they are; bfloat16 / float16 (as vLLM's
# command lines pass them) set the KV cache's dtype, activations staying float32.
_CPU_DTYPES = {"auto": F32, **DTYPE_BY_NAME}


def _layer_cache(shape, np_dtype, mla: bool) -> tuple[np.ndarray, np.ndarray]:
    """A layer's (key_cache, value_cache); MLA's latent rows are both, one buffer."""
    k = lazy_zeros(shape, np_dtype)
    return (k, k) if mla else (k, lazy_zeros(shape, np_dtype))


def _total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


class CpuWorker(WorkerBase):
    def load_model(self) -> None:
        mc = self.config.model_config
        if mc.dtype not in _CPU_DTYPES:
            raise ValueError(f"dtype={mc.dtype!r} is not a dtype the CPU backend takes "
                             f"({', '.join(_CPU_DTYPES)})")
        if _CPU_DTYPES[mc.dtype] != F32:  # vLLM's command lines name one: run, and say how
            logger.info("dtype=%s on the CPU: activations are computed in float32 (weights stay "
                        "in their stored format); the KV cache is %s", mc.dtype,
                        "the kv_cache_dtype set" if self.config.cache_config.kv_cache_dtype
                        != "auto" else mc.dtype)
        ssm = self.config.cache_config.mamba_ssm_cache_dtype
        if ssm not in ("auto", "float32"):  # (auto: the activations', float32 here)
            raise ValueError(f"mamba_ssm_cache_dtype {ssm!r}: the CPU keeps recurrent states in "
                             f"float32, its activations' dtype; use auto or float32")
        pc = self.config.parallel_config
        if pc.world_size > 1 and pc.rank == 0:
            self._load_tensor_parallel()
        else:  # (a further rank: inside its group's model_parallel, executor/tp_worker.py)
            self.model, self.tokenizer = load_model(mc)
        keep_activations_in_heap()  # after loading, whose temporaries the heap need not keep

    def _load_tensor_parallel(self) -> None:
        """Rank 0's share, the other ranks loading theirs meanwhile (executor/); the runner's
        model is the ParallelModel that sends them each call."""
        from vllmx import _C
        from vllmx.distributed.parallel_state import model_parallel
        from vllmx.executor import create_executor
        from vllmx.executor.tp_worker import ParallelModel, threads_per_rank

        pc = self.config.parallel_config
        _C.set_num_threads(threads_per_rank(self.config))
        self.executor = create_executor(self.config)
        try:
            with model_parallel(self.executor.groups):
                model, self.tokenizer = load_model(self.config.model_config)
            self.executor.wait_ready()
        except BaseException:
            self.executor.close()
            raise
        self.model = ParallelModel(model, self.executor)
        logger.info("%d ranks (tensor parallel %d x pipeline stages %d; %s), %d threads each",
                    pc.world_size, pc.tensor_parallel_size, pc.pipeline_parallel_size,
                    pc.distributed_executor_backend, threads_per_rank(self.config))

    def kv_dtype(self) -> int:
        """The KV cache's dtype: kv_cache_dtype's; auto: the model's dtype where it names a
        half type, else f16 (f32 for an f32 safetensors checkpoint)."""
        mc, kv = self.config.model_config, self.config.cache_config.kv_cache_dtype
        if kv != "auto":
            return DTYPE_BY_NAME[kv]
        if _CPU_DTYPES[mc.dtype] != F32:
            return _CPU_DTYPES[mc.dtype]  # dtype=bfloat16 / float16: the cache holds that
        f32_model = mc.hf_config.get("torch_dtype", mc.hf_config.get("dtype")) == "float32"
        return F32 if (f32_model and not mc.is_gguf) else F16

    def initialize_kv_cache(self) -> None:
        self.allocate_kv_cache()
        mc, cc, sc = (self.config.model_config, self.config.cache_config,
                      self.config.scheduler_config)
        eager, spec = mc.enforce_eager, self.config.speculative_config
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.init_kv_cache(cc.num_blocks)
            # A tape replays its ops without the calls the other ranks follow: eager steps.
            eager = True
        self.model_runner = ModelRunner(self.model, self.kv_caches, self.cache_dtype,
                                        cc.block_size, sc.max_num_batched_tokens,
                                        sc.max_num_seqs, mc.max_model_len, mc.seed,
                                        enforce_eager=eager,
                                        num_speculative_tokens=spec.num_speculative_tokens
                                        if spec is not None else 0)

    def allocate_kv_cache(self) -> None:
        """Sizes (cache_config.num_blocks) and allocates self.kv_caches; under tensor
        parallelism a rank's layers hold its kv heads, and the ranks share RAM's budget."""
        mc, cc, sc = (self.config.model_config, self.config.cache_config,
                      self.config.scheduler_config)
        dtype = self.kv_dtype()
        hf = self.model.config
        draft_layers = num_draft_kv_layers(self.config)
        sized = hf
        pp = getattr(self.model, "pp_stage", None)
        if pp is not None:  # its stage's layers write KV (the others' pages stay uncommitted)
            start, end = pp.layers(hf["num_hidden_layers"])
            # (a stage of none: sized as one, the block count being the whole model's)
            sized = {**hf, "num_kv_cache_layers": max(1, kv_cache_layers(hf)[start:end]
                                                      .count(True))}
        block_bytes = kv_block_bytes(sized, cc.block_size, 4 if dtype == F32 else 2,
                                     draft_layers)
        # vLLM's CPU default: a share of RAM, at most 4 GiB, and never more than max_num_seqs
        # full-length sequences.
        ram_share = _total_memory_bytes() * cc.cpu_kv_cache_fraction
        budget = min(4 << 30, int(ram_share / self.config.parallel_config.world_size),
                     -(-mc.max_model_len // cc.block_size) * sc.max_num_seqs * block_bytes)
        num_blocks = num_kv_blocks(self.config, block_bytes, budget,
                                   "raise kv_cache_memory_bytes or lower max_model_len")
        np_dtype = np.float32 if dtype == F32 else np.uint16
        shape = (num_blocks, cc.block_size, hf["num_key_value_heads"], hf["head_dim"])
        # Pages are committed as blocks are first written (and the block pool reuses freed
        # blocks first), so an idle or lightly used cache costs little resident memory.
        self.kv_caches = [_layer_cache(shape, np_dtype, hf.get("use_mla", False))
                          for _ in range(hf["num_hidden_layers"] + draft_layers)]
        self.cache_dtype = dtype
        logger.info("KV cache: %d blocks x %d tokens (%s, %.1f MiB), max_model_len %d",
                    num_blocks, cc.block_size, DTYPE_NAMES[dtype],
                    num_blocks * block_bytes / 2**20, mc.max_model_len)
