"""The model runner's step inputs and forwards (as vLLM splits its runner into mixins): the
capture policy and its buckets, the step's host buffers staged where the model reads them (on
the GPU one pinned copy a step), a decode or verify step's bucket padded and replayed from its
capture, the verify steps' CPU tapes, the start-up captures and profile_run."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers.attention import AttentionMetadata
from vllmx.worker.decode_capture import (
    CudaGraphs,
    DecodeCapture,
    StepTapes,
    cudagraph_capture_sizes,
    tape_capture_sizes,
)
from vllmx.worker.step_capture import LongLived

_MAX_VERIFY_BUCKET_ROWS = 512
# MLA prefill on decompressed keys (layers/mla.py): whole prompts (or first chunks) of at least
# this many tokens; shorter ones attend in the latent space (decompressing their keys would cost
# more than their few queries save). A rule about the sequence alone, so that where a request
# runs does not depend on the batch it is in.
MLA_MIN_PREFILL_QUERY = 64


def mla_decompressed(num_computed: np.ndarray, query_lens: np.ndarray) -> np.ndarray:
    """Which sequences of an MLA model's step prefill on decompressed keys: whole prompts
    (nothing computed before this step) of MLA_MIN_PREFILL_QUERY tokens or more."""
    return (num_computed == 0) & (query_lens >= MLA_MIN_PREFILL_QUERY)


class StepInputsModelRunnerMixin:
    """For ModelRunner: reads its model, device, KV caches, the step's host buffers (input_ids,
    positions, slot_mapping, query_start_loc, seq_lens, block_table), their device staging and
    decode_capture."""

    def _init_step_inputs(self, t: int, b: int, enforce_eager: bool,
                          num_speculative_tokens: int) -> None:
        """The capture policy and its buckets (worker/decode_capture.py) and, on the GPU, the
        staging of a step's inputs: after the host buffers, the state slots and hidden_out (t
        tokens, b sequences at most a step)."""
        device, model = self.device, self.model
        sizes = (cudagraph_capture_sizes if device == "cuda" else tape_capture_sizes)(min(b, t))
        if enforce_eager:
            self.decode_capture = DecodeCapture(sizes)
        elif device == "cuda":
            self.decode_capture = CudaGraphs(sizes)
        else:
            # A hybrid model's tape reads its state slots from the long-lived state_indices
            # and updates their rows in place (put back before the capture's check).
            slots = self.state_slots
            state = ((slots.state_indices, slots.has_initial_state, slots.spec_state_indices)
                     if slots else ())
            self.decode_capture = StepTapes(sizes, lambda: LongLived(
                self.model, self.kv_caches, self.input_ids, self.positions, self.slot_mapping,
                self.query_start_loc, self.seq_lens, self.block_table, self.hidden_out, *state),
                slots.step_rows(self.query_start_loc, self.slot_mapping,
                                lambda: [self.hidden_out]) if slots else None)
        if device == "cuda" and num_speculative_tokens:
            # Verify steps in buckets of their own (eager ones padded alike: the same tokens),
            # up to vLLM's default max_cudagraph_capture_size in rows, and to max_model_len (a
            # padding request may take nearly all of a bucket's rows: its positions and block
            # table reads then stay within a sequence's).
            self.decode_capture.set_verify_buckets(
                num_speculative_tokens, min(t, self.max_model_len, _MAX_VERIFY_BUCKET_ROWS))
        self._decode_logits = None  # GPU: the buckets' f32 logits (below)
        # (dst, src, tokens) for the step being formed: input ids dst <- tokens[src], the
        # tokens the step in flight sampled (scatter_tokens, where the tokens are)
        self._token_fixup: tuple | None = None
        # GPU: the hidden rows a step samples (when not its first rows), staged with its inputs
        self._logits_rows: np.ndarray | None = None
        self._staged_rows = None
        # MLA models whose prompts' prefill attends on decompressed keys (layers/mla.py): the
        # query_start_loc and block table of those prompts staged too. The table is n x the
        # longest of n prompts of m = MLA_MIN_PREFILL_QUERY tokens or more within t tokens: at
        # most n (t - m (n - 1)) <= (t + m)^2 / 4m entries (and b t).
        self._mla_prefill = bool(getattr(model, "mla_decompressed_prefill", False))
        m = MLA_MIN_PREFILL_QUERY
        self._mla_staged = min(b * t, (t + m) ** 2 // (4 * m)) + b + 1 if self._mla_prefill else 0
        if device != "cuda":
            return
        from vllmx._C import CudaEvent, PinnedHostBuffer
        from vllmx.device import F32, I32, DeviceArray

        # One host staging array and its device twin: [ids | positions | slots | qsl | seq_lens |
        # block_table | fixup dst | fixup src | logits rows] packed by _stage, so a step's
        # inputs are one copy. The host side is pinned, two of them used in turn: the copy is
        # queued and the host goes on to launch the step, and stages the next one while the GPU
        # may still read this one; each one's event marks when the GPU has read it.
        n = 4 * t + 4 * b + 1 + b * self.max_blocks_per_req + self._mla_staged
        self._pinned = [PinnedHostBuffer(4 * n) for _ in range(2)]
        self._staging = [p.array(np.int32, n) for p in self._pinned]
        for a in self._staging:
            a[:] = 0
        self._staged = [CudaEvent() for _ in range(2)]
        self._num_staged = 0
        self._stage_views: dict[tuple, tuple] = {}  # decode buckets' device views
        self._dev_staging = DeviceArray.empty((n,), I32)
        # A bucket's f32 logits land here (graphs or not): one buffer for every bucket,
        # allocated before any capture so that no graph's scratch overlaps it.
        rows = self.decode_capture.max_rows
        self._rows = DeviceArray.from_numpy(np.arange(rows, dtype=np.int32))
        self._decode_logits = DeviceArray.empty((rows, model.vocab_size), F32)

    # -- GPU: one input copy per step ---------------------------------------------------------
    def _stage(self, t: int, nb: int, max_query_len: int = 0, mla: tuple | None = None) -> tuple:
        """Copies the first t tokens / nb requests of the host inputs to the device in one
        transfer; returns the device views (ids, positions, AttentionMetadata). max_query_len 1:
        a decode bucket (its views are built once and kept)."""
        m = self.max_blocks_per_req
        parts = [(self.input_ids, t), (self.positions, t), (self.slot_mapping, t),
                 (self.query_start_loc, nb + 1), (self.seq_lens, nb),
                 (self.block_table[:nb].reshape(-1), nb * m)]
        if mla is not None:  # (its query_start_loc, then its block table)
            parts += [(mla[2], len(mla[2])), (mla[3].reshape(-1), mla[3].size)]
        fixup, self._token_fixup = self._token_fixup, None
        if fixup is not None:
            parts += [(fixup[0], len(fixup[0])), (fixup[1], len(fixup[1]))]
        rows, self._logits_rows = self._logits_rows, None
        if rows is not None:
            parts.append((rows, len(rows)))
        off = 0
        i = self._num_staged % 2
        self._num_staged += 1
        pinned, staging, staged = self._pinned[i], self._staging[i], self._staged[i]
        staged.synchronize()  # the copy two steps ago has left this staging array
        for host, n in parts:
            staging[off:off + n] = host[:n]
            off += n
        pinned.copy_to_device(self._dev_staging.buffer, 4 * off, self._dev_staging.offset)
        staged.record()
        end = off
        if rows is not None:  # the hidden rows the step samples from
            self._staged_rows = self._dev_staging[end - len(rows):end]
            end -= len(rows)
        if fixup is not None:  # the input ids the step in flight samples, on the device
            n = len(fixup[0])
            ops.scatter_tokens(self._dev_staging[0:t], self._dev_staging[end - 2 * n:end - n],
                               fixup[2], self._dev_staging[end - n:end])
        key = (t, nb, max_query_len)
        staged = None if mla is not None else self._stage_views.get(key)
        if staged is None:
            views, off = [], 0
            for _, n in parts[:6]:  # (not the fixup's)
                views.append(self._dev_staging[off:off + n])
                off += n
            ids, pos, slots, qsl, seq_lens, bt = views
            md = AttentionMetadata(slots, bt.reshape(nb, m), qsl, seq_lens, self.kv_caches,
                                   self.cache_dtype, max_query_len)
            if mla is not None:  # (staged after the block table)
                n = len(mla[2])
                self._set_mla(md, mla, self._dev_staging[off:off + n],
                              self._dev_staging[off + n:off + n + mla[3].size].reshape(
                                  mla[3].shape))
            staged = (ids, pos, md)
            if max_query_len == 1:
                self._stage_views[key] = staged
        return staged

    def _pad(self, nb: int, t: int, size: int, rows: int) -> None:
        """Requests nb..size and rows t..rows of a bucket: a padding request a row, the last
        one the rows left (a verify bucket's), at positions from 0, whose KV writes are
        skipped (slot -1), whose reads are block 0's and whose outputs are never read."""
        if size == nb:
            return
        lens = np.ones(size - nb, dtype=np.int32)
        lens[-1] = rows - t - (size - nb - 1)
        self.input_ids[t:rows] = 0
        self.positions[t:rows - lens[-1]] = 0
        self.positions[rows - lens[-1]:rows] = np.arange(lens[-1], dtype=np.int32)
        self.slot_mapping[t:rows] = -1
        self.seq_lens[nb:size] = lens
        self.query_start_loc[nb + 1:size + 1] = self.query_start_loc[nb] + np.cumsum(lens)
        self.block_table[nb:size] = 0

    def _inputs(self, t: int, nb: int, max_query_len: int = 0, mla: tuple | None = None) -> tuple:
        """(input ids, positions, AttentionMetadata) of the first t tokens / nb requests, where
        the model reads them: the host buffers' slices, or their device copy."""
        if self.device == "cuda":
            ids, positions, md = self._stage(t, nb, max_query_len, mla)
        else:
            if self._token_fixup is not None:
                dst, src, tokens = self._token_fixup
                self._token_fixup = None
                ops.scatter_tokens(self.input_ids[:t], dst, tokens, src)
            ids, positions = self.input_ids[:t], self.positions[:t]
            md = AttentionMetadata(self.slot_mapping[:t], self.block_table[:nb],
                                   self.query_start_loc[:nb + 1], self.seq_lens[:nb],
                                   self.kv_caches, self.cache_dtype, max_query_len)
            if mla is not None:
                self._set_mla(md, mla, mla[2], mla[3])
        if self.state_slots is not None:  # (on the GPU: staged copies, where graphs read them)
            n = min(nb, self.input_batch.num_reqs)
            md.state_indices, md.has_initial_state = self.state_slots.rows(
                self.input_batch.req_ids[:n], nb, self.positions[self.query_start_loc[:n]])
            if self.state_slots.spec_state_indices is not None:  # (rows marked at launch)
                md.spec_state_indices = self.state_slots.spec_rows(t)
        return ids, positions, md

    def _decode_forward(self, rows: int, inputs: tuple):
        """A bucket's forward and f32 logits (every row's): what a capture records, and what an
        eager step in that bucket runs, so both give the same tokens. On the GPU the logits
        land in the buffer every bucket shares (a graph's output must stay put)."""
        hidden = self.model.forward(*inputs)
        if self.hidden_out is not None and not self._aux_hidden:  # a native copy, replayed
            ops.copy_rows(self.hidden_out[:hidden.shape[0]], hidden)
        logits = self.model.compute_logits(hidden)
        if self.device != "cuda":
            return logits  # the host's logits are f32; a tape's arena keeps them in place
        return ops.embedding(self._rows[:rows], logits, out=self._decode_logits[:rows])

    def _prepare_bucket(self, nb: int, t: int, size: int, rows: int):
        """Pads a bucket of `size` requests and `rows` rows holding nb requests of t rows
        (a decode bucket: rows == size) and stages its inputs; returns its forward."""
        self._pad(nb, t, size, rows)
        inputs = self._inputs(rows, size, max_query_len=1 if rows == size else 0)
        return lambda: self._decode_forward(rows, inputs)

    def capture_model(self) -> None:
        """vLLM's capture_model: the buckets this device captures at start-up (the GPU's
        graphs; the CPU records its tapes as buckets first run)."""
        self.query_start_loc[0] = 0
        self.decode_capture.capture_all(lambda size, rows: self._prepare_bucket(0, 0, size, rows))

    def _forward(self, t: int, nb: int, sample_all: bool = False):
        """(hidden states, None) or, for a captured bucket, (None, f32 logits of the t rows).
        sample_all: every row of the step is sampled (a decode step, t == nb, or a
        speculative verify step). A decode step replays its bucket's capture; so does a verify
        step: on the GPU padded to a verify bucket (decode_capture.py), on the CPU from a tape
        keyed (nb, t) (its buckets are every batch size, so it needs no padding; the tape reads
        the step's lengths from the input buffers). Both results are views of memory the next
        step overwrites (a capture's output buffer): the step consumes them first."""
        capture = self.decode_capture
        if sample_all and t == nb:
            size = capture.bucket(nb)
            if size is not None:
                logits = capture.run(size, self._prepare_bucket(nb, nb, size, size))
                return None, logits[:nb]
        elif sample_all:
            size = capture.verify_bucket(nb, t)
            if size is not None:
                rows = size * capture.verify_len
                logits = capture.run((size, rows), self._prepare_bucket(nb, t, size, rows))
                return None, logits[:t]
            if self.device != "cuda" and capture.bucket(nb) == nb:
                inputs = self._inputs(t, nb)
                logits = capture.run((nb, t), lambda: self._decode_forward(t, inputs))
                return None, logits
        # The longest query, vLLM's max_query_len: long prompts take the GPU's prefill kernel
        # for them (cuda/attention.cu).
        qsl = self.query_start_loc[:nb + 1]
        max_query_len = int((qsl[1:] - qsl[:-1]).max()) if nb > 0 else 0
        mla = self._mla_prefill_plan(t, nb) if self._mla_prefill else None
        return self.model.forward(*self._inputs(t, nb, max_query_len, mla)), None

    def _mla_prefill_plan(self, t: int, nb: int) -> tuple | None:
        """For an MLA model's step whose last sequences are whole prompts (each one's context
        its query: no prefix-cache hit, a first chunk at most) of MLA_MIN_PREFILL_QUERY tokens
        or more (the model runner puts them last: InputBatch.put_last): (their first sequence,
        its first row, their query_start_loc from that row, their block table: sequence b's
        position i at row query_start_loc[b] + i of theirs). layers/mla.py decompresses those
        rows' keys and values and attends over them; the sequences before them (decodes, later
        chunks, short prompts) attend in the latent space. None when there are none."""
        qsl = self.query_start_loc[:nb + 1]
        lens = qsl[1:] - qsl[:-1]
        latent = np.flatnonzero(~mla_decompressed(self.seq_lens[:nb] - lens, lens))
        b0 = int(latent[-1]) + 1 if latent.size else 0
        if b0 == nb:
            return None
        t0, longest = int(qsl[b0]), int(lens[b0:].max())
        rows = (qsl[b0:] - t0).astype(np.int32)
        table = rows[:-1, None] + np.arange(longest, dtype=np.int32)
        # (entries past a sequence's end are never read)
        return b0, t0, rows, np.minimum(table, t - t0 - 1).astype(np.int32)

    @staticmethod
    def _set_mla(md: AttentionMetadata, mla: tuple, query_start_loc, block_table) -> None:
        md.mla_first_seq, md.mla_first_row = mla[0], mla[1]
        md.mla_query_start_loc, md.mla_block_table = query_start_loc, block_table

    def profile_run(self) -> None:
        """vLLM's profile_run: one forward of the largest step the scheduler can form
        (max_num_batched_tokens prompt tokens in at most max_num_seqs sequences of at most
        max_model_len each; KV writes skipped, reads from block 0) plus logits for max_num_seqs
        rows, so that afterwards the device's allocator holds what a step needs."""
        num_seqs, per_seq = len(self.seq_lens), min(len(self.input_ids), self.max_model_len)
        num_tokens = min(len(self.input_ids), num_seqs * per_seq)
        nb = -(-num_tokens // per_seq)
        lens = np.full(nb, per_seq, dtype=np.int32)
        lens[-1] = num_tokens - per_seq * (nb - 1)
        self.input_ids[:num_tokens] = 0
        self.positions[:num_tokens] = np.concatenate([np.arange(n, dtype=np.int32) for n in lens])
        self.slot_mapping[:num_tokens] = -1
        self.query_start_loc[0] = 0
        self.query_start_loc[1:nb + 1] = np.cumsum(lens)
        self.seq_lens[:nb] = lens
        self.block_table[:nb] = 0
        if self._mla_prefill:  # (the latent path, which later chunks take, may need more)
            self._mla_prefill = False
            try:
                self._forward(num_tokens, nb)
            finally:
                self._mla_prefill = True
        hidden, _ = self._forward(num_tokens, nb)
        ops.to_float32(self.model.compute_logits(hidden[:min(num_seqs, num_tokens)]))
