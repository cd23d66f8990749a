"""Block tables for the paged-attention tests (CPU and CUDA): a random layout of a pool."""

from __future__ import annotations

import numpy as np


def make_block_table(rng, seq_lens, num_blocks, width=None, block_size=16, spare=0):
    """Each sequence's blocks, a random permutation of the pool; rows as wide as the longest
    sequence's (or width) plus spare unused entries, -1."""
    need = [(s + block_size - 1) // block_size for s in seq_lens]
    width = (width or max(need + [1])) + spare
    assert sum(need) <= num_blocks
    perm = rng.permutation(num_blocks).astype(np.int32)
    bt = np.full((len(seq_lens), width), -1, np.int32)  # unused entries are never read
    o = 0
    for b, n in enumerate(need):
        bt[b, :n] = perm[o:o + n]
        o += n
    return bt
