"""The engine's further ranks under tensor / pipeline parallelism (vLLM's vllm/v1/executor):
rank 0 is the engine's own worker; tp_worker.py is what every other rank runs and the model rank 0 calls
through; multiproc_executor.py starts them as processes (distributed_executor_backend "mp"),
ray_executor.py as Ray actors on this host ("ray")."""

from __future__ import annotations

from vllmx.config import VllmxConfig


def create_executor(config: VllmxConfig):
    """The executor of config's distributed_executor_backend, its ranks starting."""
    if config.parallel_config.distributed_executor_backend == "ray":
        from vllmx.executor.ray_executor import RayDistributedExecutor

        return RayDistributedExecutor(config)
    from vllmx.executor.multiproc_executor import MultiprocExecutor

    return MultiprocExecutor(config)
