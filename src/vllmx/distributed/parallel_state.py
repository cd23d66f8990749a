"""The tensor-parallel group a model's layers are built for (vLLM's parallel_state): a layer
takes get_tp_group() at construction (None: one rank, nothing to reduce) and calls its
collectives in its forward. The loader builds a rank's model inside model_parallel(group), as
it builds inside a placement, so one process may hold models of different groups."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from vllmx import _C
from vllmx.distributed.shm_comm import ShmSegment


@dataclass
class GroupCoordinator:
    """One rank's view of its group: the collectives every rank calls in the same order."""

    rank: int
    world_size: int
    segment: ShmSegment

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        """x summed over the ranks, in place (the same bits on every rank)."""
        _C.ops.all_reduce(x, self.segment.buf, self.rank)
        return x

    def all_gather(self, x: np.ndarray, total: int, part: int) -> np.ndarray:
        """[T, total]: every rank's x side by side, rank r's at columns r * part on."""
        out = np.empty((x.shape[0], total), dtype=np.float32)
        _C.ops.all_gather(out, x, self.segment.buf, self.rank, part)
        return out

    def broadcast(self, x: np.ndarray, src: int = 0) -> np.ndarray:
        _C.ops.broadcast(x, self.segment.buf, self.rank, src)
        return x


_tp_group: GroupCoordinator | None = None


def get_tp_group() -> GroupCoordinator | None:
    """The group of the model being built (None: a single rank)."""
    return _tp_group


@contextmanager
def model_parallel(group: GroupCoordinator | None):
    global _tp_group
    old, _tp_group = _tp_group, group
    try:
        yield group
    finally:
        _tp_group = old


def shard_range(size: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of rank's share of size rows, ceil(size / world) a rank (the last fewer):
    vLLM's vocab-parallel padding without the padding rows."""
    part = -(-size // world)
    return min(rank * part, size), min((rank + 1) * part, size)
