"""The persistent input batch (vLLM V1's InputBatch and BlockTable, in one): the requests of the
running batch keep a row each across steps — their token ids, computed-token count and
block-table row — so a step appends what changed (a sampled token, new blocks) instead of
rebuilding every request's inputs from Python lists, and forms its positions, input ids and
slot mapping with a few vectorized gathers.

Rows [0, num_reqs) are the batch, in the order the step runs them: a request the scheduler did
not schedule this step leaves its row (its state stays with the runner) and comes back, its row
rebuilt, when it is scheduled again; condense() closes the holes by moving the last rows into
them, as vLLM does."""

from __future__ import annotations

import numpy as np


def kv_slots(block_table: np.ndarray, rows: np.ndarray, positions: np.ndarray,
             block_size: int) -> np.ndarray:
    """The KV cache slots of positions, each in the blocks of its block_table row."""
    return block_table[rows, positions // block_size] * block_size + positions % block_size


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, block_size: int):
        self.block_size = block_size
        max_blocks = -(-max_model_len // block_size)
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.block_table = np.zeros((max_num_reqs, max_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)
        # Added to a row's rope positions (not its KV slots): longrope's long-prompt rows.
        self.rope_offset = np.zeros(max_num_reqs, dtype=np.int32)
        self.req_ids: list[str | None] = [None] * max_num_reqs
        self.req_id_to_index: dict[str, int] = {}
        self._free: list[int] = []  # holes below num_reqs, until condense()
        self.num_reqs = 0

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.req_id_to_index

    def add_request(self, req_id: str, token_ids: list[int], num_computed_tokens: int,
                    block_ids: list[int], rope_offset: int = 0) -> int:
        """A row for the request (a hole if there is one, else the next row), filled whole."""
        if req_id in self.req_id_to_index:
            self.remove_request(req_id)
        row = self._free.pop() if self._free else self.num_reqs
        if row == self.num_reqs:
            if row == len(self.req_ids):
                raise ValueError(f"InputBatch: more than {len(self.req_ids)} requests")
            self.num_reqs += 1
        n, nb = len(token_ids), len(block_ids)
        if n > self.token_ids.shape[1] or nb > self.block_table.shape[1]:
            raise ValueError(f"request {req_id}: {n} tokens / {nb} blocks exceed max_model_len")
        self.token_ids[row, :n] = token_ids
        self.num_tokens[row] = n
        self.num_computed_tokens[row] = num_computed_tokens
        self.block_table[row, :nb] = block_ids
        self.num_blocks[row] = nb
        self.rope_offset[row] = rope_offset
        self.req_ids[row] = req_id
        self.req_id_to_index[req_id] = row
        return row

    def remove_request(self, req_id: str) -> None:
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return
        self.req_ids[row] = None
        self._free.append(row)

    def condense(self) -> None:
        """Moves the last requests into the holes, so that the batch is rows [0, num_reqs)."""
        for hole in sorted(self._free):
            while self.num_reqs > 0 and self.req_ids[self.num_reqs - 1] is None:
                self.num_reqs -= 1
            if hole >= self.num_reqs:
                break
            last = self.num_reqs - 1
            req_id = self.req_ids[last]
            self._copy_rows([hole], [last])
            self.req_ids[hole], self.req_ids[last] = req_id, None
            self.req_id_to_index[req_id] = hole
            self.num_reqs -= 1
        while self.num_reqs > 0 and self.req_ids[self.num_reqs - 1] is None:
            self.num_reqs -= 1
        self._free.clear()

    def put_last(self, last: np.ndarray) -> None:
        """Reorders rows [0, num_reqs) (after condense) so that those marked in `last` (bool
        [num_reqs]) come after the others, by swaps (neither side keeps its order): vLLM's
        reorder_batch, which MLA backends use to take a step's prefills apart from its
        decodes."""
        i, j = 0, self.num_reqs - 1
        while True:
            while i < j and not last[i]:
                i += 1
            while i < j and last[j]:
                j -= 1
            if i >= j:
                return
            self._swap_rows(i, j)
            last[i], last[j] = last[j], last[i]

    def _copy_rows(self, dst: list[int], src: list[int]) -> None:
        """Rows src's state (tokens, block table, counts, rope offset; not the request ids)
        into rows dst. Every source row is read before any is written: dst may be src
        permuted."""
        n = int(self.num_tokens[src].max())
        self.token_ids[dst, :n] = self.token_ids[src, :n]
        nb = int(self.num_blocks[src].max())
        self.block_table[dst, :nb] = self.block_table[src, :nb]
        for a in (self.num_tokens, self.num_blocks, self.num_computed_tokens, self.rope_offset):
            a[dst] = a[src]

    def _swap_rows(self, i: int, j: int) -> None:
        self._copy_rows([i, j], [j, i])
        self.req_ids[i], self.req_ids[j] = self.req_ids[j], self.req_ids[i]
        self.req_id_to_index[self.req_ids[i]] = i
        self.req_id_to_index[self.req_ids[j]] = j

    def append_blocks(self, req_id: str, block_ids: list[int]) -> None:
        row, n = self.req_id_to_index[req_id], len(block_ids)
        start = self.num_blocks[row]
        if start + n > self.block_table.shape[1]:
            raise ValueError(f"request {req_id}: {start + n} blocks exceed max_model_len")
        self.block_table[row, start:start + n] = block_ids
        self.num_blocks[row] = start + n

    def append_token(self, req_id: str, token: int) -> None:
        row = self.req_id_to_index[req_id]
        n = self.num_tokens[row]
        if n >= self.token_ids.shape[1]:
            raise ValueError(f"request {req_id}: more than max_model_len tokens")
        self.token_ids[row, n] = token
        self.num_tokens[row] = n + 1

    def append_tokens(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """One token each for the given (distinct) rows."""
        n = self.num_tokens[rows]
        if len(n) and int(n.max()) >= self.token_ids.shape[1]:
            raise ValueError("a request has more than max_model_len tokens")
        self.token_ids[rows, n] = tokens
        self.num_tokens[rows] = n + 1

    def prepare_inputs(self, num_scheduled: np.ndarray, input_ids: np.ndarray,
                       positions: np.ndarray, slot_mapping: np.ndarray,
                       query_start_loc: np.ndarray, seq_lens: np.ndarray) -> int:
        """The step's inputs for rows [0, len(num_scheduled)), each scheduled for
        num_scheduled[row] tokens from its num_computed_tokens, written into the runner's
        buffers; returns the number of tokens."""
        nb = len(num_scheduled)
        cu = np.cumsum(num_scheduled, dtype=np.int32)
        t = int(cu[-1]) if nb else 0
        rows = np.repeat(np.arange(nb, dtype=np.int32), num_scheduled)
        starts = self.num_computed_tokens[:nb]
        pos = starts[rows] + (np.arange(t, dtype=np.int32) - np.repeat(cu - num_scheduled,
                                                                         num_scheduled))
        offset = self.rope_offset[:nb]
        positions[:t] = pos + offset[rows] if offset.any() else pos
        input_ids[:t] = self.token_ids[rows, pos]
        slot_mapping[:t] = kv_slots(self.block_table, rows, pos, self.block_size)
        query_start_loc[0] = 0
        query_start_loc[1:nb + 1] = cu
        seq_lens[:nb] = starts + num_scheduled
        return t
