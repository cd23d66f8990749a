"""A hybrid model's recurrent-state slots (vLLM's mamba state indices): one slot per running
request in the model's conv / recurrent state tensors, taken when the request starts or resumes
and given back when it finishes or is preempted (its state is then recomputed from its tokens);
slot max_num_seqs is the padding rows' scratch. The step's state_indices / has_initial_state
arrays are long-lived: a CPU step tape reads them in place."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from vllmx.device import StagedArray
from vllmx.worker.step_capture import StateRows, walk


class StateSlots:
    def __init__(self, model, max_num_seqs: int, on_gpu: bool = False):
        model.allocate_states(max_num_seqs + 1)
        self.model = model
        self._slot: dict[str, int] = {}
        self._free = list(range(max_num_seqs - 1, -1, -1))  # slot 0 handed out first
        self.state_indices = np.full(max_num_seqs, max_num_seqs, dtype=np.int32)
        self.has_initial_state = np.zeros(max_num_seqs, dtype=np.int32)
        self._rows_used = 0  # rows of state_indices the step being formed uses
        # On the GPU the mixers read staged device copies (a decode graph where it was captured).
        self._staged = ((StagedArray(self.state_indices), StagedArray(self.has_initial_state))
                        if on_gpu else None)

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

    def step_rows(self) -> StateRows:
        """The state rows the step being formed updates in place, for a step capture to put
        back before its checking replay."""
        arrays = [a for o in walk(self.model) if hasattr(o, "state_arrays")
                  for a in o.state_arrays()]
        return StateRows(arrays, lambda: self.state_indices[:self._rows_used])
