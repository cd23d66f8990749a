"""The groups a model's layers are built for (vLLM's parallel_state): a layer takes
get_tp_group() at construction (None: one rank, nothing to reduce) and calls its collectives
in its forward; a pipeline-parallel model builds the layers of get_pp_stage() only. The loader
builds a rank's model inside model_parallel(groups), as it builds inside a placement, so one
process may hold models of different groups.

Ranks are numbered stage by stage: rank = stage * tensor_parallel_size + tp_rank; each stage's
ranks form a tensor-parallel group, and the pipeline's hand-offs go over a group of all ranks."""

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


def layer_range(num_layers: int, stage: int, num_stages: int) -> tuple[int, int]:
    """[start, end) of stage's layers: num_layers / num_stages each, the first stages one more
    where they do not divide; ValueError where a stage would get none."""
    if num_layers < num_stages:
        raise ValueError(f"pipeline_parallel_size={num_stages} is more than the model's "
                         f"{num_layers} layers")
    base, extra = divmod(num_layers, num_stages)
    start = stage * base + min(stage, extra)
    return start, start + base + (stage < extra)


@dataclass
class PipelineStage:
    """This rank's pipeline stage and the group of all ranks its hand-offs go over: each stage
    in turn runs its layers and hands its residual stream on (stage s's first rank sends, every
    rank takes part), the last hands on the final hidden states (rank 0 samples)."""

    stage: int
    num_stages: int
    tp_size: int
    group: GroupCoordinator  # all ranks

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def layers(self, num_layers: int) -> tuple[int, int]:
        return layer_range(num_layers, self.stage, self.num_stages)

    def hand_off(self, stage: int, x: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
        """stage's x (f32 [shape]) on every rank: its ranks pass theirs, the others a buffer."""
        buf = x if self.stage == stage else np.empty(shape, np.float32)
        return self.group.broadcast(buf, src=stage * self.tp_size)


@dataclass
class ParallelGroups:
    """A rank's groups: tensor-parallel (None: one rank a stage) and pipeline (None: one
    stage); expert_parallel: the tensor-parallel ranks hold whole experts, E / tp each, instead
    of each expert's share (vLLM's enable_expert_parallel)."""

    tp: GroupCoordinator | None = None
    pp: PipelineStage | None = None
    expert_parallel: bool = False


def rank_groups(rank: int, tp: int, pp: int, world: ShmSegment | None,
                stage_segment: ShmSegment | None,
                expert_parallel: bool = False) -> ParallelGroups:
    """rank's groups, over the segment of all ranks (pipeline hand-offs) and its stage's."""
    stage, tp_rank = divmod(rank, tp)
    return ParallelGroups(
        GroupCoordinator(tp_rank, tp, stage_segment) if tp > 1 else None,
        PipelineStage(stage, pp, tp, GroupCoordinator(rank, tp * pp, world)) if pp > 1
        else None, expert_parallel and tp > 1)


_groups = ParallelGroups()


def get_tp_group() -> GroupCoordinator | None:
    """The tensor-parallel group of the model being built (None: a single rank)."""
    return _groups.tp


def get_ep_group() -> GroupCoordinator | None:
    """The group whose ranks hold whole experts, E / world_size each (None: experts split by
    their intermediate rows, or one rank)."""
    return _groups.tp if _groups.expert_parallel else None


def expert_range(num_experts: int, group: GroupCoordinator) -> tuple[int, int]:
    """(first expert, count) of group's rank under expert parallelism."""
    count = num_experts // group.world_size
    return group.rank * count, count


def get_pp_stage() -> PipelineStage | None:
    """The pipeline stage of the model being built (None: a single stage)."""
    return _groups.pp


@contextmanager
def model_parallel(groups: ParallelGroups):
    global _groups
    old, _groups = _groups, groups
    try:
        yield groups
    finally:
        _groups = old


def shard_range(size: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of rank's share of size rows, ceil(size / world) a rank (the last fewer):
    vLLM's vocab-parallel padding without the padding rows."""
    part = -(-size // world)
    return min(rank * part, size), min((rank + 1) * part, size)
