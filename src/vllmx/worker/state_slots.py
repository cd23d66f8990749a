"""A hybrid model's recurrent-state slots (vLLM's mamba state indices): one slot per running
request in the model's conv / recurrent state tensors, taken when the request starts or resumes
and given back when it finishes or is preempted (its state is then recomputed from its tokens);
slot max_num_seqs is the padding rows' scratch. The step's state_indices / has_initial_state
arrays are long-lived: a CPU step tape reads them in place.

With speculative decoding (num_speculative_tokens k) each request's slot s has k more,
max_num_seqs + 1 + s * k + i: a verify step's mixers also save the state after the request's
i-th row there (spec_state_indices, vLLM's per-position mamba states), and when the step
accepts only i of its drafts, rollback() copies the state after its row i back to slot s, the
state its next token continues (the rejected drafts' rows had advanced it past them)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import numpy as np

from vllmx.device import StagedArray
from vllmx.worker.step_capture import StateRows


class StateSlots:
    def __init__(self, model, max_num_seqs: int, on_gpu: bool = False, num_spec: int = 0,
                 max_num_tokens: int = 0):
        """num_spec: the drafts a verify step may have for a request (0: no speculation);
        max_num_tokens: a step's rows (the spec_state_indices a row)."""
        model.allocate_states(max_num_seqs + 1 + max_num_seqs * num_spec)
        self.model = model
        self.num_spec = num_spec
        self._spec_base = max_num_seqs + 1
        # Each row's extra slot (-1: none), filled for verify steps (mark_spec_rows); long-lived.
        self.spec_state_indices = (np.full(max_num_tokens, -1, dtype=np.int32) if num_spec
                                   else None)
        self._spec_marked: list[slice] = []
        self._slot: dict[str, int] = {}
        self._free = list(range(max_num_seqs - 1, -1, -1))  # slot 0 handed out first
        self.state_indices = np.full(max_num_seqs, max_num_seqs, dtype=np.int32)
        self.has_initial_state = np.zeros(max_num_seqs, dtype=np.int32)
        self._rows_used = 0  # rows of state_indices the step being formed uses
        # On the GPU the mixers read staged device copies (a decode graph where it was captured).
        self._staged = ((StagedArray(self.state_indices), StagedArray(self.has_initial_state))
                        if on_gpu else None)
        self._staged_spec = (StagedArray(self.spec_state_indices)
                             if on_gpu and num_spec else None)

    def take(self, req_id: str) -> None:
        """A slot for a request that starts or resumes (a request that has one keeps it)."""
        if req_id not in self._slot:
            self._slot[req_id] = self._free.pop()

    def give_back(self, req_ids: Iterable[str]) -> None:
        """The slots of requests that finished or were preempted (unknown ids are skipped)."""
        for req_id in req_ids:
            slot = self._slot.pop(req_id, None)
            if slot is not None:
                self._free.append(slot)

    def rows(self, req_ids: list[str], nb: int,
             first_positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The step's first nb rows: req_ids' slots, and whether each continues its sequence
        (first_positions: its first token's position this step, > 0); the padding rows past
        them take the scratch slot, fresh."""
        n = len(req_ids)
        self.state_indices[:nb] = len(self.state_indices)
        self.state_indices[:n] = [self._slot[r] for r in req_ids]
        self.has_initial_state[:nb] = 0
        self.has_initial_state[:n] = first_positions > 0
        self._rows_used = nb
        if self._staged is not None:
            for s in self._staged:
                s.upload()
            return self._staged[0].view(nb), self._staged[1].view(nb)
        return self.state_indices[:nb], self.has_initial_state[:nb]

    def mark_spec_rows(self, layout, drafts: dict[str, tuple]) -> None:
        """The step's spec_state_indices: a request with k drafts ends its rows (layout:
        (req_id, first row, first position, rows)) with [its last token, k drafts]; all but
        the last of those save their state (accepting i drafts keeps the state after the i-th
        of them), every other row -1."""
        si = self.spec_state_indices
        for rows in self._spec_marked:  # (the previous step's)
            si[rows] = -1
        self._spec_marked.clear()
        for req_id, row0, _, n in layout:
            k = len(drafts.get(req_id, ()))
            if k:
                first = self._spec_base + self._slot[req_id] * self.num_spec
                rows = slice(row0 + n - 1 - k, row0 + n - 1)
                si[rows] = np.arange(first, first + k, dtype=np.int32)
                self._spec_marked.append(rows)

    def spec_rows(self, t: int):
        """The step's first t spec_state_indices (marked at launch); on the GPU their staged
        copy, sent each step so that a decode graph's rows read -1 after a verify step."""
        if self._staged_spec is None:
            return self.spec_state_indices[:t]
        self._staged_spec.upload()
        return self._staged_spec.view(t)

    def rollback(self, accepted: list[tuple[str, int]]) -> None:
        """After a verify step, for each (request, drafts it accepted) that rejected some: its
        slot gets the state after its row `accepted` back (the model copies the slots, on
        every rank under tensor parallelism)."""
        dst = [self._slot[r] for r, _ in accepted if r in self._slot]
        src = [self._spec_base + self._slot[r] * self.num_spec + m
               for r, m in accepted if r in self._slot]
        if dst:
            self.model.copy_states(np.array(dst), np.array(src))

    def step_rows(self, query_start_loc: np.ndarray, kv_slots: np.ndarray,
                  outputs) -> StateRows:
        """The state the step being formed updates in place, for a step capture's check, which
        replays the step with its first request alone live (step_capture.StateRows):
        query_start_loc and kv_slots are the step's token offsets and slot_mapping; outputs()
        the other long-lived token-row arrays the step writes (the drafter's hidden_out; None
        entries skipped)."""
        return StateRows(self.model.state_arrays(), lambda: self.state_indices[:1],
                         lambda: slice(int(query_start_loc[0]), int(query_start_loc[1])),
                         lambda: self._first_alone(query_start_loc, kv_slots, outputs()))

    @contextlib.contextmanager
    def _first_alone(self, query_start_loc, kv_slots, outputs):
        """The step's requests after its first as padding rows until the block ends: their
        tokens write no KV (slot -1) and save no state, their state is the scratch slot's,
        started from zeros; their rows of outputs are put back after."""
        n = self._rows_used
        t1, t = int(query_start_loc[1]), int(query_start_loc[n])
        tokens = [(kv_slots, -1)]
        if self.spec_state_indices is not None:
            tokens.append((self.spec_state_indices, -1))
        requests = [(self.state_indices, len(self.state_indices)), (self.has_initial_state, 0)]
        saved = ([(a, slice(t1, t), a[t1:t].copy()) for a, _ in tokens]
                 + [(a, slice(1, n), a[1:n].copy()) for a, _ in requests]
                 + [(o, slice(t1, t), o[t1:t].copy()) for o in outputs if o is not None])
        for a, v in tokens:
            a[t1:t] = v
        for a, v in requests:
            a[1:n] = v
        try:
            yield
        finally:
            for a, rows, b in saved:
                a[rows] = b
