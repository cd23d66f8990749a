"""A hybrid model's state slots under speculative decoding (worker/state_slots.py): which rows of
a verify step save their state where, and the rollback that puts a request's state after its
last accepted draft back."""

from __future__ import annotations

import numpy as np

from vllmx.worker.state_slots import StateSlots


class _Mixer:
    def allocate_states(self, n):
        self.state = np.zeros((n, 3), np.float32)

    def state_arrays(self):
        return [self.state]


class _Model:
    """Two mixers' states, each slot's rows copied by copy_states as DecoderLM does."""

    def __init__(self):
        self.layers = [_Mixer(), _Mixer()]

    def allocate_states(self, n):
        for m in self.layers:
            m.allocate_states(n)

    def copy_states(self, dst, src):
        for m in self.layers:
            m.state[dst] = m.state[src]


def test_verify_rows_save_their_states_and_rollback_restores_one():
    model = _Model()
    slots = StateSlots(model, max_num_seqs=4, num_spec=3, max_num_tokens=32)
    assert model.layers[0].state.shape[0] == 4 + 1 + 4 * 3  # slots, scratch, 3 per slot
    for r in ("a", "b", "c"):
        slots.take(r)
    a, b, c = (slots._slot[r] for r in "abc")
    # a: [last token, 3 drafts]; b: a prefill chunk (no drafts); c: 2 tokens the grammar forced
    # before its [last token, 2 drafts].
    layout = [("a", 0, 10, 4), ("b", 4, 0, 6), ("c", 10, 7, 5)]
    slots.mark_spec_rows(layout, {"a": (5, 6, 7), "b": (), "c": (8, 9)})
    si = slots.spec_state_indices
    base = 5
    assert si[0:3].tolist() == [base + 3 * a + i for i in range(3)]
    assert si[3:12].tolist() == [-1] * 9  # a's last row, b's rows, c's forced tokens' first
    assert si[12:14].tolist() == [base + 3 * c, base + 3 * c + 1]
    assert si[14:].tolist() == [-1] * 18
    # The next step's marks replace these.
    slots.mark_spec_rows([("b", 0, 6, 1)], {})
    assert (si == -1).all()

    for m in model.layers:
        m.state[:] = np.arange(m.state.shape[0])[:, None]
    slots.rollback([("a", 2), ("c", 0), ("gone", 1)])  # (a finished request is skipped)
    for m in model.layers:
        assert m.state[a].tolist() == [base + 3 * a + 2] * 3
        assert m.state[c].tolist() == [base + 3 * c] * 3
        assert m.state[b].tolist() == [b] * 3
