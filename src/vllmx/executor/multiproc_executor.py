"""Rank 0's handle on the other tensor-parallel ranks (TPExecutor), and MultiprocExecutor, which
starts them as processes of this host (vLLM's "mp" backend; spawned, so a script that builds
an engine with several ranks needs vLLM's `if __name__ == "__main__":` guard).

Start-up: the shared-memory segment, then the ranks (each loads its share while rank 0 loads
its own), "ready" from each, the KV cache's block count sent (rank 0 sizes it), "ready" again;
the segment's file is removed once every rank has mapped it. Then a watchdog thread reads
the ranks' connections, which carry nothing more unless a rank fails (its traceback) or exits
(end of file): it keeps the first failure and aborts the group, so a rank 0 waiting in a
collective raises instead of hanging, with the failed rank's traceback."""

from __future__ import annotations

import copy
import logging
import multiprocessing as mp
import threading
import weakref
from multiprocessing.connection import wait

from vllmx.config import VllmxConfig
from vllmx.distributed.parallel_state import rank_groups
from vllmx.distributed.shm_comm import ShmSegment
from vllmx.executor.tp_worker import check_ready, run_follower

logger = logging.getLogger("vllmx")

_START_TIMEOUT_S = 1800.0  # a rank's start-up step (loading a large checkpoint) at most


class TPExecutor:
    """The other ranks: their connections (rank -> Connection), the groups' segments (one of
    all ranks for the pipeline's hand-offs, one a stage for its tensor-parallel group), rank
    0's groups, and the calls of the step protocol (executor/tp_worker.py)."""

    def __init__(self, config: VllmxConfig):
        pc = config.parallel_config
        tp, pp = pc.tensor_parallel_size, pc.pipeline_parallel_size
        self.world_size, self.tp_size = pc.world_size, tp
        self.world_segment = ShmSegment.create(self.world_size) if pp > 1 else None
        self.stage_segments = [ShmSegment.create(tp) for _ in range(pp)] if tp > 1 else []
        self.segments = [s for s in (self.world_segment, *self.stage_segments) if s is not None]
        self.groups = rank_groups(0, tp, pp, self.world_segment,
                                  self.stage_segments[0] if tp > 1 else None,
                                  pc.enable_expert_parallel)
        self.conns: dict = {}
        self.state = _GroupState()
        try:
            self._launch(config)
        except BaseException:
            _unlink(self.segments)
            raise
        self._finalizer = weakref.finalize(self, _close, self.conns, self.segments, self.state,
                                           self._stop_handles())

    def segment_paths(self, rank: int) -> tuple[str | None, str | None]:
        """(all ranks' segment, rank's stage's segment) paths, None where there is none."""
        return (None if self.world_segment is None else self.world_segment.path,
                self.stage_segments[rank // self.tp_size].path if self.stage_segments else None)

    # -- what a backend provides ------------------------------------------------------------
    def _launch(self, config: VllmxConfig) -> None:
        """Starts ranks 1.. with their configs (rank set) and fills self.conns."""
        raise NotImplementedError

    def _alive(self, rank: int) -> str | None:
        """None while rank runs, else why it does not."""
        raise NotImplementedError

    def _stop_handles(self) -> list:
        """What _close stops after closing the connections (processes / actors)."""
        return []

    # -- start-up -----------------------------------------------------------------------------
    def _recv(self, rank: int):
        conn = self.conns[rank]
        waited = 0.0
        while not conn.poll(1.0):
            why = self._alive(rank)
            waited += 1.0
            if why is not None or waited > _START_TIMEOUT_S:
                raise RuntimeError(f"tensor-parallel rank {rank} did not start: "
                                   f"{why or 'timed out'}")
        try:
            return conn.recv()
        except EOFError:
            raise RuntimeError(f"tensor-parallel rank {rank} exited during start-up: "
                               f"{self._alive(rank)}") from None

    def wait_ready(self) -> None:
        """Each rank has loaded its share (its error raised here otherwise)."""
        for rank in self.conns:
            check_ready(self._recv(rank), rank)
        _unlink(self.segments)  # every rank has mapped them

    def init_kv_cache(self, num_blocks: int) -> None:
        """The other ranks allocate their KV caches of num_blocks blocks; then the watchdog."""
        for conn in self.conns.values():
            conn.send(("kv_cache", num_blocks))
        for rank in self.conns:
            check_ready(self._recv(rank), rank)
        # (the thread holds no reference to self: dropping the engine closes the ranks)
        threading.Thread(target=_watch, args=(dict(self.conns), self.segments, self.state),
                         name="vllmx-tp-watchdog", daemon=True).start()

    # -- steps ----------------------------------------------------------------------------
    def call(self, method: str, *args) -> None:
        """Sends one call of the step protocol to every other rank."""
        if self.state.failure is not None:
            raise RuntimeError(self.state.failure)
        for rank, conn in self.conns.items():
            try:
                conn.send((method, args))
            except OSError as e:
                self.state.failed.wait(5.0)
                raise RuntimeError(self.state.failure or f"tensor-parallel rank {rank} is "
                                   f"gone ({e})") from e

    def checked(self, fn, *args):
        """fn(*args) on rank 0's share; a collective released by the abort flag raises with the
        failed rank's traceback."""
        try:
            return fn(*args)
        except RuntimeError as e:
            if not any(s.aborted for s in self.segments):
                raise
            self.state.failed.wait(5.0)
            raise RuntimeError(self.state.failure
                               or "the tensor-parallel group was aborted") from e

    def close(self) -> None:
        self._finalizer()


class _GroupState:
    """What the watchdog tells rank 0: the first failure, once it is known."""

    def __init__(self):
        self.failure: str | None = None
        self.failed = threading.Event()
        self.closing = False


def _watch(conns: dict, segments: list[ShmSegment], state: _GroupState) -> None:
    by_conn = {conn: rank for rank, conn in conns.items()}
    while by_conn:
        for conn in wait(list(by_conn)):
            rank = by_conn.pop(conn)
            try:
                kind, payload = conn.recv()
                why = (f"tensor-parallel rank {rank} failed:\n{payload}" if kind == "error"
                       else f"tensor-parallel rank {rank} sent {kind!r} mid-run")
            except (EOFError, OSError):
                why = f"tensor-parallel rank {rank} exited"
            if state.closing:
                continue
            if state.failure is None:
                state.failure = why
                logger.error("%s", why)
            for s in segments:
                s.abort()
            state.failed.set()


def _unlink(segments: list[ShmSegment]) -> None:
    for s in segments:
        s.unlink()


def _close(conns: dict, segments: list[ShmSegment], state: _GroupState, handles: list) -> None:
    state.closing = True
    for conn in conns.values():
        try:
            conn.send(("close", ()))
        except OSError:
            pass
    for h in handles:
        h.stop()
    _unlink(segments)


class _Process:
    def __init__(self, p):
        self.p = p

    def stop(self) -> None:
        self.p.join(timeout=10)
        if self.p.is_alive():
            self.p.terminate()
            self.p.join(timeout=5)


class MultiprocExecutor(TPExecutor):
    """Ranks 1.. as spawned processes of this host, each with a pipe to rank 0."""

    def _launch(self, config: VllmxConfig) -> None:
        ctx = mp.get_context("spawn")
        self.procs = {}
        for rank in range(1, self.world_size):
            cfg = copy.deepcopy(config)
            cfg.parallel_config.rank = rank
            parent, child = ctx.Pipe()
            p = ctx.Process(target=run_follower, args=(cfg, child, *self.segment_paths(rank)),
                            name=f"vllmx-tp-rank{rank}", daemon=True)
            p.start()
            child.close()
            self.procs[rank], self.conns[rank] = p, parent

    def _alive(self, rank: int) -> str | None:
        p = self.procs[rank]
        return None if p.is_alive() else f"exit code {p.exitcode}"

    def _stop_handles(self) -> list:
        return [_Process(p) for p in self.procs.values()]
