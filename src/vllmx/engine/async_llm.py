"""AsyncLLM: the engine behind an asyncio interface (what the server uses). The step loop
runs in its own thread; native ops release the GIL, so the event loop keeps serving while a
step runs. Requests and aborts reach the loop through a command queue, outputs come back
through one RequestOutputCollector per request (engine/output_collector.py)."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator, Callable

from vllmx.beam_search import BeamSearch
from vllmx.config import VllmxConfig
from vllmx.core.scheduler import SchedulerStats
from vllmx.engine.arg_utils import EngineArgs
from vllmx.engine.exceptions import EngineDeadError, EngineGenerateError
from vllmx.engine.llm_engine import LLMEngine
from vllmx.engine.output_collector import RequestOutputCollector
from vllmx.engine.protocol import EngineClient
from vllmx.outputs import CompletionOutput, RequestOutput
from vllmx.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

logger = logging.getLogger("vllmx")


class AsyncLLM(EngineClient):
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: collections.deque = collections.deque()
        self._queues: dict[str, RequestOutputCollector] = {}
        self._wake = threading.Condition()
        self._shutdown = False
        self._dead_error: BaseException | None = None
        # Called once, from the engine thread, when the loop dies (the server exits on it).
        self._dead_callbacks: list[Callable[[], None]] = []
        self._next_id = 0
        self._thread = threading.Thread(target=self._run, name="vllmx-engine", daemon=True)
        self._thread.start()
        if engine.structured_output_manager is not None:  # serving: no stall at first use
            engine.structured_output_manager.warm_up_async()

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> AsyncLLM:
        return cls(LLMEngine.from_engine_args(args))

    # -- EngineClient ---------------------------------------------------------------------
    @property
    def vllm_config(self) -> VllmxConfig:
        return self.engine.config

    @property
    def errored(self) -> bool:
        return self._dead_error is not None or not self._thread.is_alive()

    @property
    def dead_error(self) -> BaseException | None:
        return self._dead_error

    def add_dead_callback(self, callback: Callable[[], None]) -> None:
        self._dead_callbacks.append(callback)

    def get_tokenizer(self):
        return self.engine.tokenizer

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_scheduler_stats(self) -> SchedulerStats:
        return self.engine.scheduler.make_stats()  # plain reads, racing the step harmlessly

    async def generate(self, prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, priority: int = 0,
                       lora_request=None) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as they come; aborts the request if the caller stops early."""
        self.check_health()
        params = sampling_params or SamplingParams()
        # Bad input raises here, in the caller; tokenizing and checking a long prompt runs in
        # a worker thread, never on the event loop (nor in the engine thread, which steps).
        text, ids = await asyncio.to_thread(self.engine.process_inputs, prompt, params)
        if request_id is None:
            request_id = f"async-{self._next_id}"
            self._next_id += 1
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        queue = RequestOutputCollector(asyncio.get_running_loop(),
                                       params.output_kind == RequestOutputKind.DELTA)
        self._queues[request_id] = queue
        self._submit(("add", request_id, text, ids, params, priority, lora_request))
        finished = False
        try:
            while True:
                out = await queue.get()
                finished = out.finished
                if out.error is not None:
                    raise EngineGenerateError(f"request {request_id} failed: {out.error}")
                yield out
                if finished:
                    break
        finally:
            self._queues.pop(request_id, None)
            if not finished:  # the caller went away (e.g. a client disconnected): free its blocks
                self._submit(("abort", request_id))

    async def beam_search(self, prompt, request_id: str, params: BeamSearchParams,
                          lora_request=None) -> AsyncIterator[RequestOutput]:
        """vLLM's EngineClient.beam_search (vllmx/beam_search.py): one final RequestOutput
        whose outputs are the beam_width best beams, best first. Each step runs the live
        beams as concurrent one-token requests (ids request_id-b<step>-<beam>), under
        lora_request's adapter if given; a caller that stops early aborts them."""
        step = params.step_params()
        text, ids = await asyncio.to_thread(self.engine.process_inputs, prompt, step)
        search = BeamSearch(ids, params, set(self.engine.eos_token_ids),
                            self.engine.config.scheduler_config.max_model_len)

        async def next_logprobs(req_id: str, tokens: list[int]):
            final = None
            async for out in self.generate({"prompt_token_ids": tokens}, step, req_id,
                                           lora_request=lora_request):
                final = out
            return final.outputs[0].logprobs[0]

        k = 0
        while pending := search.pending():
            search.advance(list(await asyncio.gather(
                *(next_logprobs(f"{request_id}-b{k}-{i}", t) for i, t in enumerate(pending)))))
            k += 1
        tok = self.tokenizer
        beams = search.result(tok.decode if tok is not None else None)
        yield RequestOutput(request_id, text, ids, None, [
            CompletionOutput(i, b.text or "", b.tokens[len(ids):], b.cum_logprob,
                             finish_reason=b.finish_reason) for i, b in enumerate(beams)],
            finished=True)

    # -- LoRA adapters: changed on the engine thread, between steps -------------------------
    async def add_lora(self, lora_request) -> bool:
        """Loads an adapter (vLLM's EngineClient.add_lora); a bad one raises ValueError."""
        return await self._on_engine_thread("add_lora", lora_request)

    async def remove_lora(self, lora_id: int) -> bool:
        return await self._on_engine_thread("remove_lora", lora_id)

    async def list_loras(self) -> set[int]:
        return await self._on_engine_thread("list_loras")

    async def _on_engine_thread(self, name: str, *args):
        self.check_health()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._submit(("lora", name, args, loop, fut))
        return await fut

    async def abort(self, request_id: str) -> None:
        self._submit(("abort", request_id))

    def shutdown(self) -> None:
        with self._wake:
            self._shutdown = True
            self._wake.notify()
        self._thread.join(timeout=10)

    # -- the engine thread ----------------------------------------------------------------
    def _submit(self, command: tuple) -> None:
        with self._wake:
            self._commands.append(command)
            self._wake.notify()

    def _deliver(self, request_id: str, item) -> None:
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put(item)

    def _apply_commands(self) -> None:
        while self._commands:
            cmd = self._commands.popleft()
            if cmd[0] == "add":
                _, rid, text, ids, params, priority, lora = cmd
                try:
                    self.engine.add_processed_request(rid, text, ids, params, priority=priority,
                                                      lora_request=lora)
                except Exception as e:  # reaches the caller's generate()
                    self._deliver(rid, e)
            elif cmd[0] == "lora":  # (name, args, the caller's loop and future)
                _, name, args, loop, fut = cmd
                try:
                    result = getattr(self.engine, name)(*args)
                except Exception as e:  # noqa: BLE001 - handed to the caller's await
                    loop.call_soon_threadsafe(_settle, fut, None, e)
                else:
                    loop.call_soon_threadsafe(_settle, fut, result, None)
            else:
                for out in self.engine.abort_request(cmd[1]):
                    self._deliver(out.request_id, out)

    def _run(self) -> None:
        try:
            while True:
                with self._wake:
                    while (not self._shutdown and not self._commands
                           and not self.engine.has_unfinished_requests()):
                        self._wake.wait()
                    if self._shutdown:
                        return
                    self._apply_commands()
                if not self.engine.has_unfinished_requests():
                    continue
                for out in self.engine.step():
                    self._deliver(out.request_id, out)
        except BaseException as e:  # the engine is dead: fail every waiting request
            logger.exception("engine step failed")
            self._dead_error = e
            err = EngineDeadError(f"the engine has stopped: {type(e).__name__}: {e}")
            for rid in list(self._queues):
                self._deliver(rid, err)
            for callback in self._dead_callbacks:
                try:
                    callback()
                except Exception:
                    logger.exception("engine-dead callback failed")


def _settle(fut: asyncio.Future, result, error: BaseException | None) -> None:
    if not fut.done():  # the caller may have gone away
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
