"""What the model runner hands a drafter that reads the target's hidden states (mtp): one
step's rows the target kept, request by request, with the attention metadata of the drafter's
own KV layer, which shares the target's blocks (vLLM's target_* inputs to EagleProposer.propose
and its CommonAttentionMetadata)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TargetHiddenStates:
    req_ids: list[str]
    hidden: np.ndarray  # [T, H] the target's hidden states this step (every row it ran)
    rows: np.ndarray  # i32 [N]: the rows of `hidden` kept, request after request
    input_ids: np.ndarray  # i32 [N]: the token after each row's position
    positions: np.ndarray  # i32 [N]
    slot_mapping: np.ndarray  # i32 [N]: each position's KV slot (the target's)
    query_start_loc: np.ndarray  # i32 [B + 1]: each request's rows in rows / input_ids
    seq_lens: np.ndarray  # i32 [B]: positions each request's drafter KV holds after this pass
    block_table: np.ndarray  # i32 [B, max_blocks]: each request's blocks (the target's)
    sampled: np.ndarray  # bool [B]: the request sampled a token this step and takes drafts
