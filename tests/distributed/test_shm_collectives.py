"""The CPU collectives (all_reduce, all_gather, broadcast over a shared-memory segment) across
real processes, against float64 references on fresh random inputs; small slots so that every
call takes several pieces; a group whose peer never comes is released by the abort flag."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from vllmx import _C
from vllmx.distributed.parallel_state import GroupCoordinator, shard_range
from vllmx.distributed.shm_comm import ShmSegment
from vllmx.weights import aligned_empty

_SLOT = 4096  # bytes: a [37, 300] f32 tensor takes 11 pieces


def _inputs(rank: int, seed: int):
    rng = np.random.default_rng(seed * 100 + rank)
    x = rng.standard_normal((37, 300)).astype(np.float32)
    return x, rng


def _rank_main(path: str, rank: int, seed: int, vocab: int, world: int, q) -> None:
    try:
        g = GroupCoordinator(rank, world, ShmSegment(path))
        x, rng = _inputs(rank, seed)
        reduced = g.all_reduce(x.copy())
        lo, hi = shard_range(vocab, rank, world)
        logits = rng.standard_normal((5, hi - lo)).astype(np.float32)
        gathered = g.all_gather(logits, vocab, -(-vocab // world))
        b = np.arange(1000, dtype=np.int32) * (rank + 1)
        g.broadcast(b, src=world - 1)
        q.put((rank, reduced, gathered, b, None))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put((rank, None, None, None, f"{type(e).__name__}: {e}"))


def _run(world: int, seed: int, vocab: int):
    seg = ShmSegment.create(world, slot_bytes=_SLOT)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(seg.path, r, seed, vocab, world, q))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = sorted((q.get(timeout=120) for _ in range(world)), key=lambda r: r[0])
    finally:
        for p in procs:
            p.join(timeout=30)
        seg.unlink()
    assert [r[4] for r in results] == [None] * world
    return results


@pytest.mark.parametrize("world,seed,vocab", [(2, 0, 1001), (3, 1, 1000)])
def test_collectives_match_references(world, seed, vocab):
    results = _run(world, seed, vocab)
    xs = [_inputs(r, seed)[0].astype(np.float64) for r in range(world)]
    ref = np.sum(xs, axis=0)
    for _, reduced, gathered, b, _ in results:
        np.testing.assert_allclose(reduced, ref, rtol=1e-5, atol=1e-5)
        # Every rank holds the same bits: their residual streams stay identical.
        assert reduced.tobytes() == results[0][1].tobytes()
        assert np.array_equal(b, np.arange(1000, dtype=np.int32) * world)
    parts = []
    for r in range(world):
        lo, hi = shard_range(vocab, r, world)
        rng = _inputs(r, seed)[1]
        parts.append(rng.standard_normal((5, hi - lo)).astype(np.float32))
    full = np.concatenate(parts, axis=1)
    assert full.shape == (5, vocab)
    for _, _, gathered, _, _ in results:
        assert np.array_equal(gathered, full)


def test_abort_releases_a_waiting_rank():
    seg = ShmSegment.create(2, slot_bytes=_SLOT)
    try:
        g = GroupCoordinator(0, 2, seg)
        ctx = mp.get_context("spawn")
        # Rank 1 never calls: the parent's watchdog (here: a timer) sets the abort flag.
        killer = ctx.Process(target=_abort_later, args=(seg.path, 0.5))
        killer.start()
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match="aborted"):
            g.all_reduce(np.ones(10, np.float32))
        assert time.perf_counter() - t0 < 60
        killer.join(timeout=30)
    finally:
        seg.unlink()


def _abort_later(path: str, delay: float) -> None:
    time.sleep(delay)
    ShmSegment(path).abort()


def test_bad_arguments_are_value_errors():
    seg = ShmSegment.create(2, slot_bytes=_SLOT)
    try:
        with pytest.raises(ValueError, match="rank 2 out of range"):
            _C.ops.all_reduce(np.ones(4, np.float32), seg.buf, 2)
        with pytest.raises(ValueError, match="not a vllmx collective segment"):
            not_a_segment = aligned_empty((4096,), np.uint8)
            not_a_segment[:] = 0
            _C.ops.all_reduce(np.ones(4, np.float32), not_a_segment, 0)
        with pytest.raises(ValueError, match="columns"):
            _C.ops.all_gather(np.empty((2, 10), np.float32), np.ones((2, 3), np.float32),
                              seg.buf, 0, 5)
    finally:
        seg.unlink()


def test_embedding_shard_rows_outside_are_zero():
    rng = np.random.default_rng(3)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    ids = np.array([0, 20, 49, 25, 30, 19], np.int32)
    lo, hi = 20, 30
    out = np.empty((len(ids), 8), np.float32)
    _C.ops.embedding_shard(out, ids, table[lo:hi].copy(), lo)
    ref = np.where(((ids >= lo) & (ids < hi))[:, None], table[np.clip(ids, 0, 49)], 0.0)
    assert np.array_equal(out, ref)
