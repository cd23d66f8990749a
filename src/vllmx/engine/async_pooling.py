"""The server's EngineClient over a PoolingEngine. Requests are tokenized and checked in
worker threads, then queued for one batching thread that runs everything queued since its last
forward as one batch (continuous batching for pooling: concurrent requests share forwards), so
the event loop never computes. A pooling model generates nothing: generate() refuses, naming
the mismatch, as vLLM's server does."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

from vllmx.config import VllmxConfig
from vllmx.core.scheduler import SchedulerStats
from vllmx.engine.pooling_engine import PoolingEngine, PoolingInput
from vllmx.engine.protocol import EngineClient
from vllmx.outputs import PoolingRequestOutput, RequestOutput
from vllmx.pooling_params import PoolingParams, PoolingTask
from vllmx.sampling_params import SamplingParams


class AsyncPoolingLLM(EngineClient):
    def __init__(self, engine: PoolingEngine):
        self.engine = engine
        self._running = 0
        # (inputs, future, its loop) queued for the batching thread
        self._queue: list[tuple[list[PoolingInput], asyncio.Future, asyncio.AbstractEventLoop]] = []
        self._wake = threading.Condition()
        self._shutdown = False
        self._thread: threading.Thread | None = None

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
                 request_id: str | None = None, priority: int = 0,
                 lora_request=None) -> AsyncIterator[RequestOutput]:
        raise ValueError("this server runs a pooling model, which cannot generate text; start "
                         "it with a generative model (--runner generate)")

    async def abort(self, request_id: str) -> None:
        """Nothing to abort: a pooling call is one forward, finished or not yet begun."""

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_scheduler_stats(self) -> SchedulerStats:
        return SchedulerStats(num_running_reqs=self._running)

    def shutdown(self) -> None:
        with self._wake:
            self._shutdown = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def supported_tasks(self) -> tuple[str, ...]:
        return self.engine.supported_tasks

    # -- batching ---------------------------------------------------------------------------------
    async def _execute(self, inputs: list[PoolingInput]) -> list:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._wake:
            if self._shutdown:
                raise RuntimeError("the pooling engine has shut down")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="vllmx-pooling",
                                                daemon=True)
                self._thread.start()
            self._queue.append((inputs, future, loop))
            self._wake.notify()
        self._running += 1
        try:
            return await future
        finally:
            self._running -= 1

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._shutdown:
                    self._wake.wait()
                if self._shutdown:
                    batch, self._queue = self._queue, []
                    for _, future, loop in batch:
                        loop.call_soon_threadsafe(_fail, future,
                                                  RuntimeError("the pooling engine shut down"))
                    return
                batch, self._queue = self._queue, []
            flat = [i for inputs, _, _ in batch for i in inputs]
            try:
                data = self.engine.execute(flat)
            # the forward's failure is each merged request's; the loop goes on
            except Exception as e:  # noqa: BLE001
                for _, future, loop in batch:
                    loop.call_soon_threadsafe(_fail, future, e)
                continue
            start = 0
            for inputs, future, loop in batch:
                part = data[start:start + len(inputs)]
                start += len(inputs)
                loop.call_soon_threadsafe(_resolve, future, part)

    # -- requests -----------------------------------------------------------------------------
    async def encode(self, prompts: list, params: list[PoolingParams], task: PoolingTask,
                     request_ids: list[str] | None = None) -> list[PoolingRequestOutput]:
        inputs = await asyncio.to_thread(self.engine.prepare, prompts, params, task)
        return self.engine.outputs(inputs, await self._execute(inputs), request_ids)

    async def score(self, pairs: list[tuple], params: PoolingParams
                    ) -> list[PoolingRequestOutput]:
        inputs = await asyncio.to_thread(self.engine.prepare_score, pairs, params)
        return self.engine.score_outputs(inputs, await self._execute(inputs))


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():  # a cancelled request (its client left) takes nothing
        future.set_result(value)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
