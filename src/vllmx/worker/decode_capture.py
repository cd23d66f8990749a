"""Decode-step capture, one interface on every device (vLLM's cudagraph_capture_sizes).

One bucket and padding rule everywhere: a pure decode step of nb requests runs padded to the
smallest bucket that holds it (eager or captured alike, so enforce_eager gives the same tokens);
a bigger one runs eagerly at its own size. The buckets differ by device: the GPU's are vLLM's
capture sizes (every graph holds memory of its own); on the CPU every batch size is a bucket,
since tapes are recorded on first use into one shared arena (a bucket costs nothing until it
runs, little after), so no CPU step computes padding rows. A bucket's forward (model forward and f32 logits) is
recorded once and replayed after, with no Python inside:
- CudaGraphs: a CUDA graph per bucket, all captured at start-up, largest first (a capture needs
  a quiet device, and grow-only scratch buffers must reach their final size before the smaller
  graphs bake them in);
- StepTapes: a native op tape per bucket (worker/step_capture.py), recorded the first time the
  bucket runs (a recording costs one ordinary forward and one replay, so buckets never used cost
  nothing);
- DecodeCapture itself: none (enforce_eager), the padded forward runs each step.

Speculative verify steps (each request's last token and up to k drafts, every row sampled) on
the GPU have buckets of their own, vLLM's uniform-decode graphs: a bucket of s requests holds
s * (k + 1) rows, for the decode sizes whose rows fit max_verify_tokens. A verify step of nb
requests and t rows runs in the smallest bucket with room for a padding request of at least one
row for each missing request (so s > nb, or s == nb with every request at k drafts); the
attention finds each request's rows on the device, so one graph serves every mix of draft
counts. The CPU records a tape per (requests, rows) instead, which needs no padding.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable


def cudagraph_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default decode buckets: 1, 2, 4, then every multiple of 8, up to max_num_seqs
    (at most 512); a batch runs in the smallest bucket that holds it."""
    sizes = [s for s in [1, 2, 4] + list(range(8, 513, 8)) if s <= max_num_seqs]
    if max_num_seqs <= 512 and max_num_seqs not in sizes:
        sizes.append(max_num_seqs)
    return sorted(sizes)


def tape_capture_sizes(max_num_seqs: int) -> list[int]:
    """The CPU's buckets: every batch size up to max_num_seqs."""
    return list(range(1, max_num_seqs + 1))


class CapturedGraph:
    """A bucket's CUDA graph and the buffer its replay leaves the output in."""

    def __init__(self, graph, output):
        self.graph = graph
        self.output = output

    def replay(self):
        self.graph.replay()
        return self.output


class DecodeCapture:
    """Buckets and the eager policy: every decode step runs its (padded) forward."""

    captures_at_startup = False

    def __init__(self, sizes: list[int]):
        self.sizes = sorted(sizes)
        self.steps: dict = {}  # bucket key -> its capture (.replay() -> output)
        self.verify_len = 0  # k + 1 rows a request in a verify bucket (0: none)
        self.verify_sizes: list[int] = []

    def bucket(self, nb: int) -> int | None:
        """The smallest bucket that holds nb requests (None: above the largest). A bisection:
        the CPU has a bucket per batch size, and this runs every step."""
        i = bisect.bisect_left(self.sizes, nb)
        return self.sizes[i] if i < len(self.sizes) else None

    @property
    def max_rows(self) -> int:
        """The most rows a bucket's forward computes (its logits buffer's)."""
        return max(self.sizes[-1], self.verify_sizes[-1] * self.verify_len
                   if self.verify_sizes else 0)

    def set_verify_buckets(self, num_speculative_tokens: int, max_verify_tokens: int) -> None:
        """Verify buckets of k + 1 rows a request, for the decode sizes whose rows fit
        max_verify_tokens (set before any capture)."""
        if self.steps:
            raise RuntimeError("set_verify_buckets: before any step is captured")
        q = num_speculative_tokens + 1
        self.verify_len = q if num_speculative_tokens > 0 else 0
        self.verify_sizes = ([s for s in self.sizes if s * q <= max_verify_tokens]
                             if self.verify_len else [])

    def verify_bucket(self, nb: int, t: int) -> int | None:
        """The verify bucket for nb requests of t rows in all: the smallest size s with room
        for them and a padding request of at least one row for each of the s - nb missing
        (None: no bucket holds them)."""
        q, sizes = self.verify_len, self.verify_sizes
        for i in range(bisect.bisect_left(sizes, nb), len(sizes)):
            s = sizes[i]
            if (s > nb or t == s * q) and s * q - t >= s - nb:
                return s
        return None

    def run(self, key, forward: Callable):
        """forward()'s output for bucket `key` (its size, or (requests, rows) of a speculative
        verify step), replayed from its capture (recorded now if this device
        records lazily)."""
        step = self.steps.get(key)
        if step is not None:
            return step.replay()
        if not self.captures_at_startup:
            step = self.capture(forward)
            if step is not None:
                self.steps[key] = step
                return step.output  # the recording's check already replayed it
        return forward()

    def capture(self, forward: Callable):
        """Records forward (running it), or None where this policy does not capture."""
        return

    def capture_all(self, prepare: Callable[[int, int], Callable]) -> None:
        """At start-up: captures every bucket, the verify buckets first, each kind largest
        first (prepare(requests, rows) pads and stages the bucket's inputs and returns its
        forward). A verify bucket's key is (requests, rows), a decode bucket's its size."""
        if self.captures_at_startup:
            for size in reversed(self.verify_sizes):
                key = (size, size * self.verify_len)
                self.steps[key] = self.capture(prepare(*key))
            for size in reversed(self.sizes):
                self.steps[size] = self.capture(prepare(size, size))


class CudaGraphs(DecodeCapture):
    captures_at_startup = True

    def capture(self, forward: Callable) -> CapturedGraph:
        from vllmx._C import CudaGraph, cuda_synchronize

        forward()  # warm-up: the allocator and the scratch buffers settle
        cuda_synchronize()
        graph = CudaGraph()
        graph.capture_begin()
        try:
            output = forward()
        finally:
            graph.capture_end()
        cuda_synchronize()
        return CapturedGraph(graph, output)


class StepTapes(DecodeCapture):
    def __init__(self, sizes: list[int], long_lived: Callable, state=None):
        """long_lived(): the step_capture.LongLived memory a tape may read in place (built at
        the first recording, when the KV cache and input buffers exist); state: the
        step_capture.StateRows a hybrid model's steps update in place, or None."""
        from vllmx.worker.step_capture import Arena

        super().__init__(sizes)
        self._long_lived_fn = long_lived
        self._long_lived = None
        self._state = state
        self.arena = Arena()  # shared by every bucket's tape: one step runs at a time

    def capture(self, forward: Callable):
        from vllmx.worker.step_capture import capture

        if self._long_lived is None:
            self._long_lived = self._long_lived_fn()
        step, _ = capture(forward, self._long_lived, self.arena, self._state)
        return step
