"""CPU step capture: a decode forward recorded once per batch bucket as a native op tape
(vllmx._C.StepTape, csrc/engine/step_tape.h) and replayed in C++ with the GIL released: the
CPU's counterpart of the CUDA graphs (worker/decode_capture.py drives both).

Recording runs the forward eagerly while every native op also appends itself to the tape. The
capture then checks and packs what was recorded:
- every array an op reads is either written earlier in the tape (an activation) or memory that
  outlives the step (weights, KV caches, the runner's input buffers). Anything else was made by
  numpy inside the forward, would be frozen at its recorded value, and fails the capture;
- activations are packed into an arena by liveness (buffers whose lives do not overlap share
  bytes), so a tape costs a few activations of its bucket, not the whole forward's; a runner's
  tapes share one arena (Arena), since one step runs at a time and its output is consumed
  before the next replays, so all buckets together cost the largest bucket's activations;
- one replay right away must give the recorded output bit for bit: numpy work done in place on
  an activation (which replay would skip) fails the capture too.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib

import numpy as np

from vllmx import _C
from vllmx.ops import Weight

_ALIGN = 64  # arena offsets: a cache line, at least numpy's own alignment


def _root(a: np.ndarray) -> np.ndarray:
    """The array that owns a's memory (a view's base chain ends at it)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def walk(*objs):
    """Every object reachable from objs through attributes of vllmx objects, lists, tuples,
    dicts and Weights, once each."""
    seen: set[int] = set()
    stack = list(objs)
    while stack:
        o = stack.pop()
        if id(o) in seen or o is None or isinstance(o, (str, bytes, int, float, bool)):
            continue
        seen.add(id(o))
        yield o
        if isinstance(o, Weight):
            stack.append(o.data)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif hasattr(o, "__dict__") and type(o).__module__.startswith("vllmx."):
            stack.extend(vars(o).values())


def host_arrays(*objs) -> list[np.ndarray]:
    """The numpy arrays reachable from objs (a model's weights, norm weights, rope caches ...):
    the memory a captured forward may read as is."""
    return [o for o in walk(*objs) if isinstance(o, np.ndarray)]


class LongLived:
    """The address ranges of memory that outlives a step (the arrays reachable from objs: the
    model's weights, the KV caches, the runner's input buffers), merged where they overlap (two
    arrays over one mapped file), for "does this read lie inside one of them"."""

    def __init__(self, *objs):
        self.starts: list[int] = []
        self.ends: list[int] = []
        for s, n in sorted({(_addr(r), r.nbytes) for r in map(_root, host_arrays(*objs))}):
            if self.ends and s <= self.ends[-1]:
                self.ends[-1] = max(self.ends[-1], s + n)
            else:
                self.starts.append(s)
                self.ends.append(s + n)

    def contains(self, a: np.ndarray) -> bool:
        lo = _addr(a)
        i = bisect.bisect_right(self.starts, lo) - 1
        return i >= 0 and lo + a.nbytes <= self.ends[i]


class CapturedStep:
    """A bucket's tape and where in its arena the replay leaves the output."""

    def __init__(self, tape: _C.StepTape, arena: Arena, offset: int, dtype: np.dtype,
                 shape: tuple[int, ...]):
        self.tape = tape
        self.arena = arena  # kept alive with the tape, which points into it
        self.offset, self.dtype, self.shape = offset, dtype, shape
        self.output = arena.view(offset, dtype, shape)

    def replay(self) -> np.ndarray:
        self.tape.replay()
        return self.output


class Arena:
    """Activation memory that tapes are packed into. Grows to the largest tape's need; growing
    repoints the tapes already packed into it (StepTape.relocate) and frees the old bytes."""

    def __init__(self):
        self.buf = np.empty(0, dtype=np.uint8)
        self.base = 0  # the aligned address of byte 0
        self.size = 0
        self.steps: list[CapturedStep] = []

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        start = self.base - _addr(self.buf) + offset
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.buf[start:start + nbytes].view(dtype).reshape(shape)

    def ensure(self, size: int) -> None:
        if size <= self.size:
            return
        buf = np.empty(size + _ALIGN, dtype=np.uint8)
        base = _addr(buf) + (-_addr(buf) % _ALIGN)
        for step in self.steps:
            step.tape.relocate(self.base, self.size, base)
        self.buf, self.base, self.size = buf, base, size
        for step in self.steps:
            step.output = self.view(step.offset, step.dtype, step.shape)


def capture(forward, long_lived: LongLived, arena: Arena | None = None,
            state: StateRows | None = None) -> tuple[CapturedStep, np.ndarray]:
    """Runs forward() once while recording it; returns the checked, packed capture (in arena,
    or an arena of its own) and its output, which has the eager forward's bits. state: the
    recurrent state the step updates in place (hybrid models): the check replays the step with
    the first request alone live, its state put back first, and compares that request's output
    rows and state; the output returned is the recording's."""
    before = state.snapshot() if state is not None else None
    live = state.first_tokens() if state is not None else slice(None)
    tape = _C.StepTape()
    _C.record_begin(tape)
    try:
        out = forward()
    finally:
        _C.record_end()
    digest = _digest(out[live])
    recorded_out = out.copy() if state is not None else None  # (the check computes one request)
    size, offset = _pack(tape, out, long_lived)
    dtype, shape = out.dtype, out.shape
    # The recording's arrays are gone (_pack dropped them); the eager output goes too, so the
    # arena is allocated into their memory rather than beside it.
    del out
    arena = Arena() if arena is None else arena
    arena.ensure(size)
    tape.relocate(_STAGING, size, arena.base)
    step = CapturedStep(tape, arena, offset, dtype, shape)
    arena.steps.append(step)
    if state is not None:
        recorded = state.digest()
        state.restore(before)
        del before
    with state.isolate() if state is not None else contextlib.nullcontext():
        replayed = step.replay()
        same = _digest(replayed[live]) == digest and (state is None or state.digest() == recorded)
    if recorded_out is not None:
        replayed[...] = recorded_out
    if not same:
        # (bits, so that NaNs compare too)
        raise RuntimeError("step capture: the replayed forward differs from the recorded one "
                           "(its output or the state rows it updates); the forward changes an "
                           "activation or a state outside the native ops (numpy work in "
                           "place), which a tape cannot replay")
    return step, replayed


class StateRows:
    """The recurrent state a step updates in place (a hybrid model's conv and SSM / delta-rule
    states, slot first), for a capture's check. The check replays the step with its first
    request alone live: isolate() turns the others into padding rows while the block runs (no
    KV write, a scratch state slot, no saved state; the other long-lived rows they write put
    back after), so that their states, advanced once by the recording, are not advanced again.
    rows() names the slots to snapshot and put back (that request's), first_tokens() its rows of
    the step's output. A request's Mamba2 state can be megabytes a layer: a snapshot of every
    request's held a batch's worth of copies (246 MB at 16 requests of a Granite-shaped model,
    kept by the allocator after), gigabytes at 256."""

    def __init__(self, arrays: list[np.ndarray], rows, first_tokens, isolate):
        self.arrays, self.rows = arrays, rows
        self.first_tokens, self.isolate = first_tokens, isolate

    def snapshot(self) -> list[np.ndarray]:
        r = np.unique(self.rows())
        return [a[r] for a in self.arrays]

    def restore(self, saved: list[np.ndarray]) -> None:
        r = np.unique(self.rows())
        for a, b in zip(self.arrays, saved):
            a[r] = b

    def digest(self) -> bytes:
        r = np.unique(self.rows())
        h = hashlib.blake2b()
        for a in self.arrays:
            for i in r:  # row by row: no copy of all of them at once
                h.update(np.ascontiguousarray(a[i]).view(np.uint8))
        return h.digest()


def _digest(a: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(a).view(np.uint8)).digest()


# Where _pack moves a tape's activations before the arena exists: an address range no
# allocation can hold (x86-64 and arm64 user space ends below 2^48), so the recording's memory
# can be freed first and the arena reuse it; relocated to the arena once it is allocated.
_STAGING = 1 << 60


def _pack(tape: _C.StepTape, out: np.ndarray, long_lived: LongLived) -> tuple[int, int]:
    """Checks the recorded reads and repoints every activation at its place in an arena laid
    out from _STAGING; returns the arena's size and the output's offset in it. Frees the
    recording's own arrays."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    roots: dict[int, np.ndarray] = {}
    external: dict[int, np.ndarray] = {}
    for i, (name, reads, writes) in enumerate(tape.calls):
        read_ids = {id(a) for a in reads if a is not None}
        for a in reads + writes:
            if a is None:
                continue
            r = _root(a)
            k = id(r)
            if k not in roots and k not in external:
                if long_lived.contains(r):  # used in place, never moved
                    external[k] = r
                    continue
                if id(a) in read_ids:  # read before any op wrote it
                    raise ValueError(
                        f"step capture: op {i} ({name}) reads an array {a.shape} that no "
                        f"earlier native op wrote and that is no weight, KV cache or runner "
                        f"input: numpy work inside the forward would be frozen on replay")
                roots[k], first[k] = r, i
            if k in roots:
                last[k] = i
    out_root = _root(out)
    if id(out_root) not in roots:
        raise ValueError("step capture: the forward's output is not written by its native ops")
    last[id(out_root)] = len(tape.calls)
    offsets, size = _plan({k: (first[k], last[k], r.nbytes) for k, r in roots.items()})
    for k, r in roots.items():
        tape.relocate(_addr(r), r.nbytes, _STAGING + offsets[k])
    tape.keep = list(external.values())
    tape.calls = []
    return size, offsets[id(out_root)] + _addr(out) - _addr(out_root)


def _plan(buffers: dict[int, tuple[int, int, int]]) -> tuple[dict[int, int], int]:
    """Arena offsets for buffers {key: (first op, last op, bytes)}: largest first, each at the
    lowest aligned offset clear of every placed buffer alive at the same time."""
    order = sorted(buffers, key=lambda k: -buffers[k][2])
    placed: list[tuple[int, int, int, int]] = []  # (first, last, offset, end)
    offsets: dict[int, int] = {}
    size = 0
    for k in order:
        f, last, n = buffers[k]
        n = -(-n // _ALIGN) * _ALIGN
        busy = sorted((o, e) for pf, pl, o, e in placed if pf <= last and f <= pl)
        off = 0
        for o, e in busy:
            if off + n <= o:
                break
            off = max(off, e)
        placed.append((f, last, off, off + n))
        offsets[k] = off
        size = max(size, off + n)
    return offsets, size
