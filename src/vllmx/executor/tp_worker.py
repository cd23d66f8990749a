"""Both ends of the step protocol of tensor and pipeline parallelism. Rank 0 (the engine's
process) keeps the scheduler, the model runner and the sampler; its model is a ParallelModel,
which sends every forward and compute_logits call, with its inputs, to the other ranks before
running it on its own share. Each other rank (run_follower) makes the same call on its share
(its heads, its stage's layers), and the calls' collectives (distributed/parallel_state.py)
pair up across the ranks. The other ranks never sample: rank 0's logits are whole (lm_head's
all_gather; the last stage hands the final hidden states back), and its tokens are the step's.

A rank that fails sets the group's abort flag (the ranks waiting in a collective raise) and
sends its traceback; rank 0's step then fails with it, which stops the engine."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
import traceback

from vllmx.config import VllmxConfig
from vllmx.distributed.parallel_state import model_parallel, rank_groups
from vllmx.distributed.shm_comm import ShmSegment
from vllmx.layers.attention import AttentionMetadata

logger = logging.getLogger("vllmx")


def threads_per_rank(config: VllmxConfig) -> int:
    """A rank's native threads: num_threads, else this host's cores shared by the ranks."""
    pc = config.parallel_config
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return pc.num_threads or max(1, (cores or 1) // pc.world_size)


def _metadata_fields(md: AttentionMetadata) -> dict:
    """md without what each rank holds itself (its KV cache and its dtype)."""
    return {f.name: getattr(md, f.name) for f in dataclasses.fields(md)
            if f.name not in ("kv_caches", "cache_dtype")}


class ParallelModel:
    """Rank 0's model under tensor / pipeline parallelism: its own share, each forward /
    compute_logits first sent to the other ranks (executor.call). Every other attribute is the
    share's."""

    def __init__(self, model, executor):
        self._model = model
        self._executor = executor

    def __getattr__(self, name):
        return getattr(self._model, name)

    def forward(self, input_ids, positions, md: AttentionMetadata):
        self._executor.call("forward", input_ids, positions, _metadata_fields(md))
        return self._executor.checked(self._model.forward, input_ids, positions, md)

    def compute_logits(self, hidden):
        self._executor.call("compute_logits", hidden)
        return self._executor.checked(self._model.compute_logits, hidden)

    def allocate_states(self, num_slots: int) -> None:
        """A hybrid model's state slots, on every rank (each holds its heads' states)."""
        self._executor.call("allocate_states", num_slots)
        self._model.allocate_states(num_slots)

    def copy_states(self, dst, src) -> None:
        """A hybrid's state slots copied (speculative decoding's rollback), on every rank."""
        self._executor.call("copy_states", dst, src)
        self._model.copy_states(dst, src)


def _watch_parent(segments: list[ShmSegment]) -> None:
    """Aborts the group and exits if the process that started this one goes away (a rank
    waiting in a collective would otherwise wait for it forever)."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        for s in segments:
            s.abort()
        os._exit(1)

    threading.Thread(target=watch, name="vllmx-tp-parent-watch", daemon=True).start()


def run_follower(config: VllmxConfig, conn, world_path: str | None,
                 stage_path: str | None) -> None:
    """Rank config.parallel_config.rank's life: its share loaded (beside rank 0's, which
    loads at the same time), its KV cache of rank 0's block count, then each call rank 0 sends
    until "close" or the connection ends. world_path / stage_path: the segments of all ranks
    (pipeline stages' hand-offs) and of its stage's tensor-parallel group, None where the
    group is one rank."""
    from vllmx import _C
    from vllmx.worker.cpu_worker import CpuWorker

    pc = config.parallel_config
    try:  # Ctrl-C reaches the whole process group: rank 0 decides, and closes the others
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # (not the main thread: a Ray actor's may not be)
        pass
    world, stage = (None if p is None else ShmSegment(p) for p in (world_path, stage_path))
    segments = [s for s in (world, stage) if s is not None]
    _watch_parent(segments)
    try:
        _C.set_num_threads(threads_per_rank(config))
        worker = CpuWorker(config)
        with model_parallel(rank_groups(pc.rank, pc.tensor_parallel_size,
                                        pc.pipeline_parallel_size, world, stage,
                                        pc.enable_expert_parallel)):
            worker.load_model()
        conn.send(("ready", None))
        kind, num_blocks = conn.recv()
        if kind == "close":  # rank 0 failed to start
            return
        config.cache_config.num_gpu_blocks_override = num_blocks
        worker.allocate_kv_cache()
        conn.send(("ready", None))
        model, kv_caches, cache_dtype = worker.model, worker.kv_caches, worker.cache_dtype
        lora_manager = None
        if config.lora_config is not None:  # rank 0 sends each step's slots (lora_step)
            from vllmx.lora.model_manager import create_lora_manager

            lora_manager = create_lora_manager(model, config, "cpu")
        while True:
            method, args = conn.recv()
            if method == "forward":
                input_ids, positions, fields = args
                model.forward(input_ids, positions,
                              AttentionMetadata(kv_caches=kv_caches, cache_dtype=cache_dtype,
                                                **fields))
            elif method == "compute_logits":
                # (a later pipeline stage holds no lm_head; GPT-NeoX calls its head embed_out)
                if getattr(model, "lm_head", model) is not None:
                    model.compute_logits(*args)
            elif method in ("allocate_states", "copy_states"):
                getattr(model, method)(*args)
            elif method == "lora_step":
                lora_manager.apply_step(*args)
            elif method == "close":
                return
            else:
                raise ValueError(f"unknown call {method!r}")
    except EOFError:  # rank 0 is gone
        for s in segments:
            s.abort()
    except BaseException:  # noqa: BLE001 - any failure: abort the groups, tell rank 0
        for s in segments:
            s.abort()
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass


def check_ready(msg, rank: int) -> None:
    """A follower's answer to a start-up step: ("ready", None), or its error raised here."""
    kind, payload = msg
    if kind != "ready":
        raise RuntimeError(f"tensor-parallel rank {rank} failed:\n{payload}")
