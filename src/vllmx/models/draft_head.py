"""What a drafter reading the target's hidden states runs (spec_decode/eagle.py): an EAGLE head
(models/llama_eagle.py, llama_eagle3.py) or an MTP layer (models/mtp.py). Each has
    forward(input_ids, positions, hidden, md) -> the rows a further draft chains on
    compute_logits(rows) -> logits over its vocabulary
and what the defaults below say where it differs."""

from __future__ import annotations

import numpy as np


class DraftHead:
    # Its vocabulary's ids as target ids (EAGLE-3's d2t); None: the target's vocabulary.
    draft_id_to_target_id: np.ndarray | None = None
    # The target layers whose entering residual streams it reads (EAGLE-3); None: the target's
    # final hidden states.
    aux_hidden_state_layers: tuple[int, ...] | None = None

    def combine_hidden_states(self, hidden: np.ndarray) -> np.ndarray:
        """The target's hidden states as the first pass reads them (as they are; EAGLE-3: fc
        over the aux ones)."""
        return hidden
