"""The waiting queue under each scheduling policy (vLLM V1's RequestQueue): FCFS is a deque
(preempted requests go back to the front); priority is a heap ordered by
(request.priority, arrival time, order of arrival), lower first."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator

from vllmx.engine.request import Request


class FCFSRequestQueue:
    def __init__(self):
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._queue.append(request)

    def prepend_request(self, request: Request) -> None:
        """A preempted request resumes before every request that arrived after it."""
        self._queue.appendleft(request)

    def peek_request(self) -> Request:
        return self._queue[0]

    def pop_request(self) -> Request:
        return self._queue.popleft()

    def remove_request(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityRequestQueue:
    def __init__(self, key: Callable[[Request], tuple]):
        self._key = key
        self._heap: list[tuple[tuple, Request]] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (self._key(request), request))

    # A preempted request takes its place by priority again.
    prepend_request = add_request

    def peek_request(self) -> Request:
        return self._heap[0][1]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[1]

    def remove_request(self, request: Request) -> None:
        self._heap = [e for e in self._heap if e[1] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[1] for e in sorted(self._heap, key=lambda e: e[0]))
