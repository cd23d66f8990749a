"""Pooling attention (layers/encoder_attention.py) against float64 numpy on random inputs:
bidirectional attention posed as decode rows of paged_attention, and the causal prefill over
the shared scratch cache, over sequences that end inside, on and past block boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from vllmx import ops
from vllmx.device import F32
from vllmx.layers.encoder_attention import (
    EncoderAttention,
    EncoderAttentionMetadata,
    PoolingBatch,
)

LENS = [1, 15, 16, 17, 40, 3]


def _reference(q, k, v, lens, nh, nkv, d, causal: bool) -> np.ndarray:
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    out = np.zeros(q.shape)
    start = 0
    for n in lens:
        rows = slice(start, start + n)
        for h in range(nh):
            g = h // (nh // nkv)
            qs = q64[rows, h * d:(h + 1) * d]
            ks, vs = k64[rows, g * d:(g + 1) * d], v64[rows, g * d:(g + 1) * d]
            s = qs @ ks.T * d ** -0.5
            if causal:
                s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
            w = np.exp(s - s.max(1, keepdims=True))
            out[rows, h * d:(h + 1) * d] = (w / w.sum(1, keepdims=True)) @ vs
        start += n
    return out


def _inputs(seed, nh, nkv, d):
    rng = np.random.default_rng(seed)
    t = sum(LENS)
    return (rng.standard_normal((t, nh * d)).astype(np.float32),
            rng.standard_normal((t, nkv * d)).astype(np.float32),
            rng.standard_normal((t, nkv * d)).astype(np.float32))


@pytest.mark.parametrize(("nh", "nkv", "d"), [(4, 4, 32), (8, 2, 64), (3, 1, 16)])
def test_bidirectional_matches_float64(nh, nkv, d):
    q, k, v = _inputs(nh * 100 + d, nh, nkv, d)
    batch = PoolingBatch.from_lens(LENS)
    got = EncoderAttention(nh, nkv, d, d ** -0.5)(q, k, v,
                                                  EncoderAttentionMetadata(batch, nkv, d))
    ref = _reference(q, k, v, LENS, nh, nkv, d, causal=False)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5
    # the first row of a sequence sees its last token: not causal
    causal = _reference(q, k, v, LENS, nh, nkv, d, causal=True)
    assert np.abs(got[1] - causal[1]).max() > 1e-3


@pytest.mark.parametrize(("nh", "nkv", "d"), [(4, 2, 32), (2, 2, 64)])
def test_causal_prefill_matches_float64(nh, nkv, d):
    q, k, v = _inputs(7 + d, nh, nkv, d)
    batch = PoolingBatch.from_lens(LENS)
    md = batch.causal_metadata(2, nkv, d)
    kc, vc = md.kv_caches[0]
    assert md.kv_caches[1][0] is kc  # one scratch cache for every layer
    ops.write_kv_cache(k, v, kc, vc, md.slot_mapping, F32)
    got = ops.paged_attention(q, kc, vc, md.block_table, md.query_start_loc, md.seq_lens,
                              d ** -0.5, F32, max_query_len=md.max_query_len)
    ref = _reference(q, k, v, LENS, nh, nkv, d, causal=True)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


def test_batch_layout():
    b = PoolingBatch.from_lens([3, 17])
    assert b.query_start_loc.tolist() == [0, 3, 20]
    assert b.positions.tolist() == [0, 1, 2, *range(17)]
    # the second sequence starts on its own block (the first's is 16 slots)
    assert b.slot_mapping.tolist()[:4] == [0, 1, 2, 16]
    assert b.block_table.tolist() == [[0, 1], [1, 2]] and b.num_blocks == 3
