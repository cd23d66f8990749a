"""distributed_executor_backend="ray" (vLLM's RayDistributedExecutor): Ray launches and places
the other ranks, as actors pinned to this host, whose shared memory their collectives run over
(a rank on another host would need NCCL, which the CPU path does not use). Each actor runs the
same tp_worker.run_follower as a spawned process does, over a Unix socket of this host's
(multiprocessing.connection, authenticated with a key made for this group) instead of a pipe.
Uses the Ray cluster this process is connected to, else starts a local one (ray.init())."""

from __future__ import annotations

import copy
import os
import queue
import threading
from multiprocessing.connection import Listener

from vllmx.config import VllmxConfig
from vllmx.executor.multiproc_executor import TPExecutor

_CONNECT_TIMEOUT_S = 600.0


class RankActor:
    """One further rank, as a Ray actor (ray.remote(RankActor) in the executor)."""

    def run(self, config: VllmxConfig, address: str, authkey: bytes, world_path: str | None,
            stage_path: str | None) -> None:
        from multiprocessing.connection import Client

        from vllmx.executor.tp_worker import run_follower

        conn = Client(address, family="AF_UNIX", authkey=authkey)
        conn.send(config.parallel_config.rank)
        run_follower(config, conn, world_path, stage_path)


class _Actor:
    def __init__(self, actor, ref):
        self.actor, self.ref = actor, ref

    def stop(self) -> None:
        import ray

        ray.wait([self.ref], timeout=10)
        ray.kill(self.actor)


class RayDistributedExecutor(TPExecutor):
    def _launch(self, config: VllmxConfig) -> None:
        try:
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        except ImportError:
            raise ValueError("distributed_executor_backend='ray' needs Ray "
                             "(pip install 'vllmx[ray]')") from None
        if not ray.is_initialized():
            ray.init()
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                              soft=False)
        address = self.segments[0].path + ".sock"
        authkey = os.urandom(32)
        listener = Listener(address, family="AF_UNIX", authkey=authkey)
        accepted: queue.Queue = queue.Queue()

        def accept():
            for _ in range(self.world_size - 1):
                try:
                    conn = listener.accept()
                    accepted.put((conn.recv(), conn))
                except Exception as e:  # noqa: BLE001 - the waiting loop below reports it
                    accepted.put((None, e))
                    return

        threading.Thread(target=accept, name="vllmx-ray-accept", daemon=True).start()
        actor_cls = ray.remote(num_cpus=0)(RankActor)  # (threads: threads_per_rank)
        self.actors = {}
        try:
            for rank in range(1, self.world_size):
                cfg = copy.deepcopy(config)
                cfg.parallel_config.rank = rank
                actor = actor_cls.options(scheduling_strategy=here,
                                          name=f"vllmx-tp-rank{rank}-{os.getpid()}").remote()
                self.actors[rank] = _Actor(actor, actor.run.remote(cfg, address, authkey,
                                                                    *self.segment_paths(rank)))
            waited = 0.0
            while len(self.conns) < self.world_size - 1:
                try:
                    rank, conn = accepted.get(timeout=1.0)
                except queue.Empty:
                    waited += 1.0
                    dead = {r: self._alive(r) for r in self.actors if r not in self.conns}
                    dead = {r: why for r, why in dead.items() if why is not None}
                    if dead or waited > _CONNECT_TIMEOUT_S:
                        raise RuntimeError(f"tensor-parallel ranks did not connect: "
                                           f"{dead or 'timed out'}") from None
                    continue
                if rank is None:
                    raise RuntimeError(f"accepting the ranks' connections failed: {conn}")
                self.conns[rank] = conn
        except BaseException:
            for a in self.actors.values():
                ray.kill(a.actor)
            raise
        finally:
            listener.close()  # (removes the socket's file)
        self.conns = dict(sorted(self.conns.items()))

    def _alive(self, rank: int) -> str | None:
        import ray

        ref = self.actors[rank].ref
        done, _ = ray.wait([ref], timeout=0)
        if not done:
            return None
        try:
            ray.get(ref)
            return "its actor returned"
        except Exception as e:  # noqa: BLE001 - the actor's failure, as text
            return f"its actor failed: {e}"

    def _stop_handles(self) -> list:
        return list(self.actors.values())
