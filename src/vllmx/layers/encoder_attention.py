"""Attention for a pooling forward: whole sequences in one pass, nothing kept afterwards.

The keys and values go to a scratch paged cache that every layer reuses (a layer's K/V are
dead once the layer is done, since every sequence is complete). Causal attention (the decoder
embedders) is the ordinary prefill over it. Bidirectional attention (BERT, XLM-R) is the same
paged_attention op with each query row posed as a one-token query at the end of its whole
sequence, i.e. as a decode row: a decode row sees every position of its context, which is
exactly the encoder's mask, so the op table (and each device's kernel) serves both.

On the GPU the batch's index arrays are copied to the device once per forward and the scratch
cache is a device array in the activation dtype (the tensor-core kernels' cache types)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllmx import ops
from vllmx.device import F32, DeviceArray
from vllmx.layers.attention import AttentionMetadata

BLOCK_SIZE = 16


@dataclass
class PoolingBatch:
    """One forward's layout: sequence b holds rows query_start_loc[b] .. [b + 1] and its K/V
    sit in blocks first_block[b] ... of the scratch cache."""

    query_start_loc: np.ndarray  # i32 [B + 1]
    positions: np.ndarray  # i32 [T]: 0 .. len - 1 in each sequence
    slot_mapping: np.ndarray  # i32 [T]
    block_table: np.ndarray  # i32 [B, max_blocks]
    seq_lens: np.ndarray  # i32 [B]
    device: str = "cpu"  # where the forward runs: "cpu" | "cuda"
    cache_dtype: int = F32  # the scratch cache's dtype (on the GPU the activation dtype)

    @classmethod
    def from_lens(cls, lens: list[int], device: str = "cpu",
                  cache_dtype: int = F32) -> PoolingBatch:
        lens_a = np.asarray(lens, dtype=np.int32)
        qsl = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(lens_a, out=qsl[1:])
        blocks = -(-lens_a // BLOCK_SIZE)
        first_block = np.concatenate([[0], np.cumsum(blocks)[:-1]]).astype(np.int32)
        max_blocks = int(blocks.max())
        block_table = first_block[:, None] + np.arange(max_blocks, dtype=np.int32)[None, :]
        seq_of_row = np.repeat(np.arange(len(lens)), lens_a)
        positions = (np.arange(int(qsl[-1]), dtype=np.int32) - qsl[seq_of_row]).astype(np.int32)
        slots = (first_block[seq_of_row] * BLOCK_SIZE + positions).astype(np.int32)
        return cls(qsl, positions, slots, block_table.astype(np.int32), lens_a, device,
                   cache_dtype)

    def to_device(self, a: np.ndarray):
        """A host index array where the forward runs (a device copy on the GPU)."""
        if self.device != "cuda":
            return a
        return DeviceArray.from_numpy(np.ascontiguousarray(a, dtype=np.int32))

    @property
    def num_blocks(self) -> int:
        return int((-(-self.seq_lens // BLOCK_SIZE)).sum())

    def scratch_cache(self, num_kv_heads: int, head_size: int) -> tuple:
        shape = (self.num_blocks, BLOCK_SIZE, num_kv_heads, head_size)
        if self.device == "cuda":
            return (DeviceArray.empty(shape, self.cache_dtype),
                    DeviceArray.empty(shape, self.cache_dtype))
        return np.empty(shape, np.float32), np.empty(shape, np.float32)

    def causal_metadata(self, num_layers: int, num_kv_heads: int,
                        head_size: int) -> AttentionMetadata:
        """A decoder's prefill of the whole batch, every layer on one scratch cache."""
        cache = self.scratch_cache(num_kv_heads, head_size)
        dev = self.to_device
        return AttentionMetadata(dev(self.slot_mapping), dev(self.block_table),
                                 dev(self.query_start_loc), dev(self.seq_lens),
                                 [cache] * num_layers, self.cache_dtype,
                                 int(np.diff(self.query_start_loc).max()))


class EncoderAttentionMetadata:
    """What a bidirectional layer needs: the scratch cache and the rows posed as decodes
    (query row t: its own one-token query, its sequence's blocks and length)."""

    def __init__(self, batch: PoolingBatch, num_kv_heads: int, head_size: int):
        self.batch = batch
        self.key_cache, self.value_cache = batch.scratch_cache(num_kv_heads, head_size)
        lens = np.diff(batch.query_start_loc)
        dev = batch.to_device
        self.slot_mapping = dev(batch.slot_mapping)
        self.row_block_table = dev(np.ascontiguousarray(np.repeat(batch.block_table, lens, axis=0)))
        self.row_seq_lens = dev(np.repeat(batch.seq_lens, lens).astype(np.int32))
        self.row_query_start_loc = dev(np.arange(int(lens.sum()) + 1, dtype=np.int32))


class EncoderAttention:
    """softmax(q k^T * scale) v over all of each sequence's positions (no mask but the
    sequence's own bounds): q [T, nh * D], k and v [T, nkv * D]."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int, scale: float):
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.scale = scale

    def __call__(self, q, k, v, md: EncoderAttentionMetadata):
        ops.write_kv_cache(k, v, md.key_cache, md.value_cache, md.slot_mapping, F32)
        return ops.paged_attention(q, md.key_cache, md.value_cache, md.row_block_table,
                                   md.row_query_start_loc, md.row_seq_lens, self.scale, F32,
                                   max_query_len=1)
