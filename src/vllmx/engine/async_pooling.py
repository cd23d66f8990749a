"""The server's EngineClient over a PoolingEngine: each call runs in a worker thread (the
engine serializes forwards), so the event loop never computes. A pooling model generates
nothing: generate() refuses, naming the mismatch, as vLLM's server does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from vllmx.config import VllmxConfig
from vllmx.core.scheduler import SchedulerStats
from vllmx.engine.pooling_engine import PoolingEngine
from vllmx.engine.protocol import EngineClient
from vllmx.outputs import PoolingRequestOutput, RequestOutput
from vllmx.pooling_params import PoolingParams, PoolingTask
from vllmx.sampling_params import SamplingParams


class AsyncPoolingLLM(EngineClient):
    def __init__(self, engine: PoolingEngine):
        self.engine = engine
        self._running = 0

    @classmethod
    def from_engine_args(cls, args) -> AsyncPoolingLLM:
        """Over a PoolingEngine whatever the checkpoint's architecture (runner='pooling')."""
        from dataclasses import replace

        from vllmx.engine.factory import create_engine

        return cls(create_engine(replace(args, runner="pooling")))

    @property
    def vllm_config(self) -> VllmxConfig:
        return self.engine.config

    @property
    def errored(self) -> bool:
        return False  # a failed forward fails its own call; nothing outlives it

    @property
    def dead_error(self) -> BaseException | None:
        return None

    def add_dead_callback(self, callback: Callable[[], None]) -> None:
        """Never called: this engine has no loop that can die."""

    def generate(self, prompt, sampling_params: SamplingParams | None = None,
                 request_id: str | None = None, priority: int = 0
                 ) -> AsyncIterator[RequestOutput]:
        raise ValueError("this server runs a pooling model, which cannot generate text; start "
                         "it with a generative model (--runner generate)")

    async def abort(self, request_id: str) -> None:
        """Nothing to abort: a pooling call is one forward, finished or not yet begun."""

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_scheduler_stats(self) -> SchedulerStats:
        return SchedulerStats(num_running_reqs=self._running)

    def shutdown(self) -> None:
        """Nothing runs in the background."""

    @property
    def supported_tasks(self) -> tuple[str, ...]:
        return self.engine.supported_tasks

    async def _run(self, fn, *args):
        self._running += 1
        try:
            return await asyncio.to_thread(fn, *args)
        finally:
            self._running -= 1

    async def encode(self, prompts: list, params: list[PoolingParams], task: PoolingTask,
                     request_ids: list[str] | None = None) -> list[PoolingRequestOutput]:
        return await self._run(self.engine.encode, prompts, params, task, request_ids)

    async def score(self, pairs: list[tuple], params: PoolingParams
                    ) -> list[PoolingRequestOutput]:
        return await self._run(self.engine.score_pairs, pairs, params)
