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

    def bucket(self, nb: int) -> int | None:
        """The smallest bucket that holds nb requests (None: above the largest). A bisection:
        the CPU has a bucket per batch size, and this runs every step."""
        i = bisect.bisect_left(self.sizes, nb)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, key, forward: Callable):
        """forward()'s output for bucket `key` (its size; on the CPU also (requests, tokens) of
        a speculative verify step), replayed from its capture (recorded now if this device
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

    def capture_all(self, prepare: Callable[[int], Callable]) -> None:
        """At start-up: captures every bucket, largest first (prepare(size) pads and stages
        the bucket's inputs and returns its forward)."""
        if self.captures_at_startup:
            for size in reversed(self.sizes):
                self.steps[size] = self.capture(prepare(size))


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
