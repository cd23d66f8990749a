"""SparseMoeBlock: router + topk_softmax + fused_experts equal to the float64 MoE of the same
weights; block experts repacked expert by expert, and dequantized expert by expert for the
GPU (whose fused_experts runs dense experts)."""

from __future__ import annotations

import numpy as np
import pytest

from vllmx import _C, ops
from vllmx.layers.fused_moe import SparseMoeBlock
from vllmx.ops import Weight


def experts(rng, e=8, h=64, inter=32):
    gate = Weight.from_numpy(rng.standard_normal((e, h)).astype(np.float32))
    w13 = Weight.from_numpy((rng.standard_normal((e, 2 * inter, h)) / 8).astype(np.float32))
    w2 = Weight.from_numpy((rng.standard_normal((e, h, inter)) / 6).astype(np.float32))
    return gate, w13, w2


@pytest.mark.parametrize("renormalize", [False, True])
def test_matches_float64_moe(renormalize):
    rng = np.random.default_rng()
    gate, w13, w2 = experts(rng)
    block = SparseMoeBlock(gate, w13, w2, top_k=3, renormalize=renormalize)
    x = rng.standard_normal((11, 64)).astype(np.float32)
    out = block(x)
    x64 = x.astype(np.float64)
    logits = x64 @ gate.data.T.astype(np.float64)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = np.zeros_like(x64)
    for t in range(11):
        top = np.argsort(-p[t], kind="stable")[:3]
        wts = p[t, top] / (p[t, top].sum() if renormalize else 1.0)
        for e, wt in zip(top, wts):
            gu = w13.data[e].astype(np.float64) @ x64[t]
            g, u = gu[:32], gu[32:]
            want[t] += wt * (w2.data[e].astype(np.float64) @ (g / (1 + np.exp(-g)) * u))
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-5


def test_block_experts_are_repacked_per_expert():
    rng = np.random.default_rng()
    e, h, inter = 4, 256, 32
    q8 = int(_C.DType["Q8_0"])
    w13 = ops.quantize_weight(rng.standard_normal((e * 2 * inter, h)).astype(np.float32), q8)
    w2 = ops.quantize_weight(rng.standard_normal((e * h, inter)).astype(np.float32), q8)
    gate = Weight.from_numpy(rng.standard_normal((e, h)).astype(np.float32))
    block = SparseMoeBlock(gate, Weight(w13.reshape(e, 2 * inter, -1), q8, (e, 2 * inter, h)),
                           Weight(w2.reshape(e, h, -1), q8, (e, h, inter)), 2, True)
    if _C.packed_dtype(q8) >= 0:
        assert block.w13.dtype == _C.packed_dtype(q8)
    x = rng.standard_normal((5, h)).astype(np.float32)
    plain = SparseMoeBlock.__new__(SparseMoeBlock)
    plain.__dict__.update(block.__dict__,
                          w13=Weight(w13.reshape(e, 2 * inter, -1), q8, (e, 2 * inter, h)),
                          w2=Weight(w2.reshape(e, h, -1), q8, (e, h, inter)))
    a, b = block(x), plain(x)
    # equal up to f32 rounding, which may move an 8-bit step of the intermediate activations
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 1e-3


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "MXFP4"])
def test_block_experts_dequantize_expert_by_expert_for_the_gpu(qtype):
    """The GPU runs dense experts: a stack of GGUF blocks goes up expert by expert as its
    dequantized values, in f32 exactly and in bf16 rounded to nearest even."""
    from gguf import GGMLQuantizationType, quants

    from vllmx.device import BF16, F32
    from vllmx.layers.placement import dense_experts, host_as

    rng = np.random.default_rng()
    e, n, k = 5, 48, 256
    dense = rng.standard_normal((e * n, k)).astype(np.float32)
    gt = GGMLQuantizationType[qtype]
    blocks = (ops.quantize_weight(dense, int(gt)) if qtype == "Q4_K"  # (gguf-py has none)
              else quants.quantize(dense, gt))
    want = quants.dequantize(blocks, gt).reshape(e, n, k)
    w = Weight(blocks.reshape(e, n, -1), int(gt), (e, n, k))
    got = list(dense_experts(w, F32))
    assert len(got) == e and all(g.shape == (n, k) for g in got)
    np.testing.assert_array_equal(np.stack(got), want)
    np.testing.assert_array_equal(np.stack(list(dense_experts(w, BF16))), host_as(want, BF16))