"""The sampler (vLLM V1's Sampler): logits of one batch -> next tokens and logprobs.

One step is three native calls over the whole batch: `apply_logits_processors` (allowed ids,
bad words, min_tokens bans, logit_bias, penalties; skipped when no row needs any),
`sample` (temperature, min_p, top_k, top_p, per-request generator) and, when logprobs are
wanted, `compute_logprobs` over the raw logits (vLLM's default logprobs_mode="raw_logprobs").
The same three ops run on whichever device holds the logits: on the GPU the logits never come
to the host (only the tokens, log-probs and the requested top lists do).

Per-request state that grows with the sequence (the distinct prompt / output tokens and their
output counts, for penalties) is kept incrementally in `RequestSamplingState`, so building the
batch's arrays costs O(new tokens + distinct tokens), not O(sequence length x vocab)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from vllmx import ops
from vllmx.core.sched_output import TokenLogprobs
from vllmx.device import DeviceArray, dtype_id
from vllmx.sampling_params import SamplingParams

_EMPTY_I32 = np.zeros(0, dtype=np.int32)
# The most top logprobs per row the GPU's compute_logprobs computes (cuda/sampler.cu's
# kMaxDeviceTopLogprobs); a row asking for more is sampled on the host.
MAX_DEVICE_TOP_LOGPROBS = 64


def seed_rng_state(seed: int) -> np.ndarray:
    """A sampler generator state (u64[2]) from a seed, by splitmix64."""
    out = np.empty(2, dtype=np.uint64)
    x = seed & ((1 << 64) - 1)
    for i in range(2):
        x = (x + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
        out[i] = z ^ (z >> 31)
    if not out.any():
        out[0] = 1
    return out


def advance_rng_states(states: np.ndarray, n: int = 1) -> np.ndarray:
    """Generator states (u64 [..., 2]) after n draws each (csrc/sampling/rng.h's
    xoroshiro128++ transition; a random row of the sampler takes exactly one per step): a
    verify step's row j starts where the request's stream is after the j draws before it, and
    a step launched before the last one's tokens are back starts where that one left off."""
    s0 = np.array(states[..., 0], dtype=np.uint64)
    s1 = np.array(states[..., 1], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for _ in range(n):
            s1 ^= s0
            s0 = ((s0 << np.uint64(49)) | (s0 >> np.uint64(15))) ^ s1 ^ (s1 << np.uint64(21))
            s1 = (s1 << np.uint64(28)) | (s1 >> np.uint64(36))
    return np.stack([s0, s1], axis=-1)


class RequestSamplingState:
    """What the sampler keeps per request: its fixed arrays (allowed ids, bias, bans, bad
    words) and the incremental token counts for penalties."""

    def __init__(self, sp: SamplingParams, vocab_size: int):
        def ids(xs):
            return np.array([t for t in xs if 0 <= t < vocab_size], dtype=np.int32)

        self.allowed = ids(sp.allowed_token_ids) if sp.allowed_token_ids else None
        bias = {t: b for t, b in (sp.logit_bias or {}).items() if 0 <= t < vocab_size}
        self.bias_ids = np.fromiter(bias.keys(), dtype=np.int32, count=len(bias))
        self.bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        banned = set(sp.stop_token_ids or [])
        if not sp.ignore_eos:
            banned |= sp.all_stop_token_ids
        ban = ids(sorted(banned)) if sp.min_tokens > 0 else _EMPTY_I32
        # logit_bias, then -inf for the ids min_tokens bans (while it does): one sparse add
        self.bias_ban_ids = np.concatenate([self.bias_ids, ban])
        self.bias_ban_values = np.concatenate(
            [self.bias_values, np.full(len(ban), -np.inf, dtype=np.float32)])
        self.bad_words = [w for w in (sp.bad_words_token_ids or [])
                          if w and all(0 <= t < vocab_size for t in w)]
        self.bad_words_flat = np.array([t for w in self.bad_words for t in w], dtype=np.int32)
        self.bad_words_lens = [len(w) for w in self.bad_words]
        self.max_bad_prefix = max(self.bad_words_lens, default=1) - 1
        self.penalties = sp.has_penalties
        # The row's scalars in the sampler's types, converted once: a value the native sampler
        # cannot hold fails here, for this request alone, not inside the batch's step.
        row = (0.0 if sp.greedy else sp.temperature, sp.top_p, sp.min_p,
               sp.repetition_penalty, sp.frequency_penalty, sp.presence_penalty)
        with np.errstate(over="raise", invalid="raise"):
            try:
                f32 = np.array(row, dtype=np.float32)
                self.top_k = np.int32(sp.top_k)
            except (OverflowError, FloatingPointError) as e:
                raise ValueError(f"sampling parameters out of the sampler's range: {e}") from e
        if not np.isfinite(f32).all():
            raise ValueError(f"sampling parameters out of the sampler's range (float32): {row}")
        self.temperature, self.top_p, self.min_p = f32[0], f32[1], f32[2]
        self.penalty_values = (f32[3], f32[4], f32[5])
        k = sp.logprobs
        self.num_logprobs = np.int32(-1 if k is None else vocab_size if k == -1
                                     else min(k, vocab_size))
        # Distinct tokens of the prompt and output (ids / output counts in [:num_distinct]).
        self._index: dict[int, int] = {}
        self.penalty_ids = np.zeros(64, dtype=np.int32)
        self.output_counts = np.zeros(64, dtype=np.int32)
        self.num_distinct = 0
        self._num_seen = 0  # tokens of the request counted so far

    def update_counts(self, token_ids: list[int], num_prompt_tokens: int) -> None:
        """Counts the tokens appended since the last call (prompt tokens count 0)."""
        for pos in range(self._num_seen, len(token_ids)):
            t = token_ids[pos]
            j = self._index.get(t)
            if j is None:
                j = self.num_distinct
                if j == len(self.penalty_ids):
                    self.penalty_ids = np.resize(self.penalty_ids, 2 * j)
                    self.output_counts = np.resize(self.output_counts, 2 * j)
                self._index[t] = j
                self.penalty_ids[j] = t
                self.output_counts[j] = 0
                self.num_distinct += 1
            if pos >= num_prompt_tokens:
                self.output_counts[j] += 1
        self._num_seen = len(token_ids)


def _csr(rows: list[np.ndarray], dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
    indptr = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=indptr[1:])
    flat = np.concatenate(rows).astype(dtype, copy=False) if rows else np.zeros(0, dtype)
    return indptr, np.ascontiguousarray(flat)


@dataclass
class SamplingMetadata:
    """The batch's sampling inputs as arrays, one row per request being sampled."""

    temperature: np.ndarray  # f32 [B]; 0 = greedy
    top_k: np.ndarray  # i32 [B]; 0 = off
    top_p: np.ndarray  # f32 [B]
    min_p: np.ndarray  # f32 [B]
    rng_state: np.ndarray  # u64 [B, 2]: the requests' generators (copied; advanced by sample)
    num_logprobs: np.ndarray  # i32 [B]: top-k wanted per row (vocab size for -1), -1 = none
    # Keyword arrays for ops.apply_logits_processors; empty when no row needs processing.
    processors: dict[str, np.ndarray] = field(default_factory=dict)
    # Structured output: the constrained rows' grammar masks (i32 [R, ceil(V / 32)], from
    # llguidance) and the row of the batch each applies to (i32 [R]); None: no row constrained.
    grammar_bitmask: np.ndarray | None = None
    grammar_rows: np.ndarray | None = None

    @classmethod
    def build(cls, params: list[SamplingParams], states: list[RequestSamplingState],
              token_ids: list[list[int]], num_prompt_tokens: list[int],
              rng_states: list[np.ndarray], vocab_size: int) -> SamplingMetadata:
        """From each request's params, sampler state, tokens so far and generator state."""
        n = len(params)
        temperature = np.array([st.temperature for st in states], dtype=np.float32)
        top_k = np.array([st.top_k for st in states], dtype=np.int32)
        top_p = np.array([st.top_p for st in states], dtype=np.float32)
        min_p = np.array([st.min_p for st in states], dtype=np.float32)
        num_logprobs = np.array([st.num_logprobs for st in states], dtype=np.int32)
        rng = np.array(rng_states, dtype=np.uint64).reshape(n, 2)
        md = cls(temperature, top_k, top_p, min_p, rng, num_logprobs)
        md.processors = _processor_arrays(params, states, token_ids, num_prompt_tokens)
        return md


def _processor_arrays(params, states, token_ids, num_prompt_tokens) -> dict[str, np.ndarray]:
    n = len(params)
    allowed = [_EMPTY_I32] * n
    words, word_lens, tails = [_EMPTY_I32] * n, [[] for _ in range(n)], [_EMPTY_I32] * n
    bias_ids, bias_vals = [_EMPTY_I32] * n, [np.zeros(0, np.float32)] * n
    pen_ids, pen_counts = [_EMPTY_I32] * n, [_EMPTY_I32] * n
    rep = np.ones(n, dtype=np.float32)
    freq = np.zeros(n, dtype=np.float32)
    pres = np.zeros(n, dtype=np.float32)
    any_allowed = any_words = any_bias = any_pen = False
    for i, (sp, st) in enumerate(zip(params, states)):
        num_output = len(token_ids[i]) - num_prompt_tokens[i]
        if st.allowed is not None:
            allowed[i] = st.allowed
            any_allowed = True
        if st.bad_words:
            words[i], word_lens[i] = st.bad_words_flat, st.bad_words_lens
            k = min(st.max_bad_prefix, num_output)
            tails[i] = np.array(token_ids[i][len(token_ids[i]) - k:], dtype=np.int32)
            any_words = True
        nb = len(st.bias_ban_ids) if num_output < sp.min_tokens else len(st.bias_ids)
        if nb:
            bias_ids[i], bias_vals[i] = st.bias_ban_ids[:nb], st.bias_ban_values[:nb]
            any_bias = True
        if st.penalties:
            st.update_counts(token_ids[i], num_prompt_tokens[i])
            pen_ids[i] = st.penalty_ids[:st.num_distinct]
            pen_counts[i] = st.output_counts[:st.num_distinct]
            rep[i], freq[i], pres[i] = st.penalty_values
            any_pen = True
    out: dict[str, np.ndarray] = {}
    if any_allowed:
        out["allowed_indptr"], out["allowed_ids"] = _csr(allowed)
    if any_words:
        out["bad_words_indptr"] = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(w) for w in word_lens], out=out["bad_words_indptr"][1:])
        lens = [x for w in word_lens for x in w]
        out["bad_word_token_indptr"] = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(lens, out=out["bad_word_token_indptr"][1:])
        out["bad_word_tokens"] = np.ascontiguousarray(np.concatenate(words), dtype=np.int32)
        out["output_tail_indptr"], out["output_tail"] = _csr(tails)
    if any_bias:
        out["bias_indptr"], out["bias_ids"] = _csr(bias_ids)
        out["bias_values"] = np.ascontiguousarray(np.concatenate(bias_vals), dtype=np.float32)
    if any_pen:
        out["penalty_indptr"], out["penalty_ids"] = _csr(pen_ids)
        out["output_counts"] = np.ascontiguousarray(np.concatenate(pen_counts), dtype=np.int32)
        out["repetition_penalty"], out["frequency_penalty"] = rep, freq
        out["presence_penalty"] = pres
    return out


@dataclass
class SamplerOutput:
    sampled_token_ids: np.ndarray  # i32 [B]
    sampled_logprobs: np.ndarray  # f32 [B]: under the raw logits
    logprobs: list[TokenLogprobs | None]  # rows that asked for logprobs


def _host(*arrays) -> list[np.ndarray]:
    """Host copies of device arrays (host arrays as they are): compute_logprobs' results."""
    return [a if isinstance(a, np.ndarray) else a.numpy() for a in arrays]


def token_logprobs(token_ids, token_logprob, rank, top_ids, top_logprobs,
                   num_logprobs) -> list[TokenLogprobs | None]:
    """TokenLogprobs per row (the token first, then its row's top-k), None where not wanted."""
    out: list[TokenLogprobs | None] = []
    for i, k in enumerate(num_logprobs.tolist()):
        if k < 0:
            out.append(None)
            continue
        out.append(TokenLogprobs([int(token_ids[i])] + top_ids[i, :k].tolist(),
                                 [float(token_logprob[i])] + top_logprobs[i, :k].tolist(),
                                 int(rank[i])))
    return out


class PendingSample:
    """A sampling step launched on the device: result() waits for it (once) and returns the
    SamplerOutput; token_ids are the sampled ids where they were computed (a device array on
    the GPU, readable by the next step's ops before the host has them)."""

    def __init__(self, token_ids, finish):
        self.token_ids = token_ids
        self._finish = finish
        self._out: SamplerOutput | None = None

    @staticmethod
    def done(out: SamplerOutput) -> PendingSample:
        pending = PendingSample(out.sampled_token_ids, None)
        pending._out = out
        return pending

    def result(self) -> SamplerOutput:
        if self._out is None:
            self._out, self._finish = self._finish(), None
        return self._out


class _DeviceStaging:
    """One sampling step's pinned host staging and its device twin (grow-only); the sampler
    alternates two, so that a step is staged while the one before it is still in flight."""

    def __init__(self):
        self.pinned = None
        self.device = None
        self.event = None

    def get(self, nbytes: int):
        from vllmx import _C

        if self.event is not None:
            self.event.synchronize()  # the step that used it last has finished with it
        if self.pinned is None or self.pinned.nbytes < nbytes:
            self.pinned = _C.PinnedHostBuffer(2 * nbytes)
            self.device = _C.DeviceBuffer(2 * nbytes)
            self.event = _C.CudaEvent()
        return self.pinned, self.device


class Sampler:
    def __init__(self):
        self._staging = (_DeviceStaging(), _DeviceStaging())  # GPU: alternated per step
        self._num_launched = 0

    def __call__(self, logits: np.ndarray, md: SamplingMetadata) -> SamplerOutput:
        """Samples one token per row; `logits` (f32 [B, V]) may be modified in place. Device
        logits stay on the GPU (processors, sampling, logprobs there), unless a row asks for
        more top logprobs than the GPU op computes (then the batch goes to the host)."""
        return self.launch(logits, md).result()

    def launch(self, logits, md: SamplingMetadata) -> PendingSample:
        """__call__ without waiting: on the GPU the step is queued and the host goes on (its
        tokens reach the host in result()); on the host it is done at once."""
        if isinstance(logits, DeviceArray):
            logits = ops.to_float32(logits)
            if int(md.num_logprobs.max(initial=-1)) <= MAX_DEVICE_TOP_LOGPROBS:
                return self._sample_on_device(logits, md)
            logits = logits.numpy()
        return PendingSample.done(self._sample_on_host(logits, md))

    @staticmethod
    def _apply_grammar(logits, bitmask, rows) -> None:
        """Masks the constrained rows first, as vLLM does: their log-probs are those of the
        distribution the grammar leaves (the processors then act on what it allows). bitmask,
        rows: SamplingMetadata's (on the logits' device), None: no row is constrained."""
        if bitmask is not None:
            ops.apply_token_bitmask(logits, bitmask, rows)

    def _sample_on_host(self, logits: np.ndarray, md: SamplingMetadata) -> SamplerOutput:
        self._apply_grammar(logits, md.grammar_bitmask, md.grammar_rows)
        raw = logits
        if md.processors:
            raw = logits.copy()  # logprobs refer to the model's distribution
            ops.apply_logits_processors(logits, **md.processors)
        want_logprobs = bool((md.num_logprobs >= 0).any())
        fused = not md.processors and not want_logprobs
        ids, lps = ops.sample(logits, md.temperature, md.top_k, md.top_p, md.min_p,
                              md.rng_state, with_logprobs=fused)
        if fused:
            return SamplerOutput(ids, lps, [None] * len(ids))
        lps, rank, top_ids, top_lps = ops.compute_logprobs(raw, ids, md.num_logprobs)
        return SamplerOutput(ids, lps, token_logprobs(ids, lps, rank, top_ids, top_lps,
                                                      md.num_logprobs))

    def _sample_on_device(self, logits: DeviceArray, md: SamplingMetadata) -> PendingSample:
        """The host path's steps on the GPU: the grammar masks and the processors, the sampling
        kernel, and compute_logprobs over the raw logits when a row wants logprobs or
        processors changed the distribution. Every host array they read (generator states,
        sampling parameters, masks, the processors' lists, logprob counts) goes up in one
        queued copy from pinned memory, and everything they give back (tokens, log-probs,
        advanced generators, the top lists) comes down in one, which result() waits for.
        Nothing here waits for the GPU: a step's sampling is queued while the forward before
        it may still run (a pageable upload would wait for the whole stream, that forward
        included, and leave the GPU idle for the host's turn)."""
        b, vocab = logits.shape
        want_logprobs = bool((md.num_logprobs >= 0).any())
        fused = not md.processors and not want_logprobs
        k = ops.num_top_logprobs(md.num_logprobs, vocab)
        # (name, shape, dtype, host array to send); the first `n_back` come back
        fields = [("rng", (b, 2), np.uint64, md.rng_state), ("ids", (b,), np.int32, None),
                  ("logprobs", (b,), np.float32, None)]
        if not fused:
            fields += [("top_ids", (b, k), np.int32, None), ("top_lps", (b, k), np.float32, None),
                       ("rank", (b,), np.int32, None)]
        n_back = len(fields)
        sent = [("temperature", md.temperature, np.float32), ("top_k", md.top_k, np.int32),
                ("top_p", md.top_p, np.float32), ("min_p", md.min_p, np.float32)]
        if not fused:
            sent.append(("num_logprobs", md.num_logprobs, np.int32))
        if md.grammar_bitmask is not None:
            sent.append(("bitmask", md.grammar_bitmask, np.int32))
            if md.grammar_rows is not None:
                sent.append(("grammar_rows", md.grammar_rows, np.int32))
        sent += [(name, a, a.dtype) for name, a in md.processors.items()]
        fields += [(name, np.shape(a), dtype, a) for name, a, dtype in sent]
        offsets, off = [], 0
        for _, shape, dtype, _ in fields:
            offsets.append(off)
            off += -(-(math.prod(shape) * np.dtype(dtype).itemsize) // 8) * 8
        back_bytes = offsets[n_back]
        slot = self._staging[self._num_launched % 2]
        self._num_launched += 1
        pinned, buf = slot.get(off)
        staging = pinned.array(np.uint8, off)
        dev, host = {}, {}
        for (name, shape, dtype, a), o in zip(fields, offsets):
            n = math.prod(shape) * np.dtype(dtype).itemsize
            host[name] = staging[o:o + n].view(dtype).reshape(shape)
            dev[name] = DeviceArray(buf, dtype_id(dtype), shape, o)
            if a is not None:
                host[name][...] = a
        pinned.copy_to_device(buf, off)
        try:
            self._apply_grammar(logits, dev.get("bitmask"), dev.get("grammar_rows"))
            raw = logits
            if md.processors:  # log-probs refer to the model's distribution, as on the host
                raw = DeviceArray.empty(logits.shape, logits.dtype)
                raw.copy_from(logits)
                ops.apply_logits_processors(logits, **{n: dev[n] for n in md.processors})
            ops.sample(logits, dev["temperature"], dev["top_k"], dev["top_p"], dev["min_p"],
                       dev["rng"], out=(dev["ids"], dev["logprobs"] if fused else None))
            if not fused:
                ops.compute_logprobs(raw, dev["ids"], md.num_logprobs,
                                     counts=dev["num_logprobs"],
                                     out=(dev["logprobs"], dev["rank"],
                                          dev["top_ids"] if k else None,
                                          dev["top_lps"] if k else None))
            pinned.copy_from_device(buf, back_bytes)
        finally:  # (where an op refused, the slot's next use still waits for the upload)
            slot.event.record()

        def finish() -> SamplerOutput:
            slot.event.synchronize()
            md.rng_state[:] = host["rng"]
            ids, lps = host["ids"].copy(), host["logprobs"].copy()
            if fused:
                return SamplerOutput(ids, lps, [None] * b)
            return SamplerOutput(ids, lps, token_logprobs(
                ids, lps, host["rank"], host["top_ids"], host["top_lps"], md.num_logprobs))

        return PendingSample(dev["ids"], finish)

    @staticmethod
    def prompt_logprobs(logits, next_token_ids: np.ndarray,
                        num_logprobs: int) -> list[TokenLogprobs]:
        """TokenLogprobs of each row's next prompt token (logits: f32 [N, V] of N prompt
        positions; num_logprobs: the request's prompt_logprobs, -1 = whole vocabulary). Device
        logits stay on the GPU unless more top logprobs are asked for than it computes."""
        n, vocab = logits.shape
        k = vocab if num_logprobs == -1 else min(num_logprobs, vocab)
        if isinstance(logits, DeviceArray):
            logits = ops.to_float32(logits)
            if k > MAX_DEVICE_TOP_LOGPROBS:
                logits = logits.numpy()
        counts = np.full(n, k, dtype=np.int32)
        ids = np.ascontiguousarray(next_token_ids, dtype=np.int32)
        lps, rank, top_ids, top_lps = _host(*ops.compute_logprobs(logits, ids, counts))
        return token_logprobs(ids, lps, rank, top_ids, top_lps, counts)
