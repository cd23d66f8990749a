"""RequestOutputCollector: vLLM's per-request output slot between the engine and a caller,
here across threads (the engine thread puts, the caller's event loop gets).

While the caller is behind, a DELTA output merges into the one already waiting (so a stream
sends the tokens of several steps in one chunk) and a CUMULATIVE one replaces it, instead of
queueing one wake-up and one chunk per token. Under load this is what keeps a server's event
loop, which shares the GIL with the engine thread, from taking as much Python time per step
as there are running streams times the steps it fell behind. The loop is woken (a write to its
self-pipe) only when the caller is actually waiting, not for every output."""

from __future__ import annotations

import asyncio
import threading

from vllmx.outputs import RequestOutput


class RequestOutputCollector:
    def __init__(self, loop: asyncio.AbstractEventLoop, aggregate: bool):
        self._loop = loop
        self._aggregate = aggregate  # DELTA outputs: merged, not replaced
        self._lock = threading.Lock()
        self._output: RequestOutput | BaseException | None = None
        self._waiter: asyncio.Future | None = None  # the caller's, while it waits in get()

    def put(self, item: RequestOutput | BaseException) -> None:
        """From the engine thread: an output, or the error that ends the request."""
        with self._lock:
            pending = self._output
            if isinstance(pending, BaseException):
                return  # the request has failed: nothing after its error reaches the caller
            if isinstance(pending, RequestOutput):
                if isinstance(item, RequestOutput):
                    pending.add(item, self._aggregate)
                if pending.finished or isinstance(item, RequestOutput):
                    return  # (a finished request stays finished, even if the engine dies
                    # before its last output is taken)
            self._output = item  # an error ends an unfinished stream: it replaces what waits
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._loop.call_soon_threadsafe(_wake, waiter)

    async def get(self) -> RequestOutput:
        """The next (possibly merged) output; raises the error that ended the request."""
        while True:
            with self._lock:
                out, self._output = self._output, None
                if out is None:
                    waiter = self._waiter = self._loop.create_future()
            if out is None:
                try:
                    await waiter
                finally:
                    with self._lock:  # (cancelled: put() must not wake a dead future)
                        if self._waiter is waiter:
                            self._waiter = None
                continue
            if isinstance(out, BaseException):
                raise out
            return out


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
