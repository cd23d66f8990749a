"""Mixture-of-experts ops: routing (softmax top-k, DeepSeek / GLM-4.5's grouped top-k with a
choice bias), expert-parallel id remapping, and the fused experts."""

from __future__ import annotations

import numpy as np

from vllmx import _C
from vllmx.device import F8_E4M3
from vllmx.ops._base import _arg, _empty
from vllmx.ops.fp8 import _typed, is_fp8_weight


def topk_softmax(gating_output, k: int, renormalize: bool):
    """MoE routing: (topk_weights f32 [T, k], topk_ids i32 [T, k]) of the softmax over the
    router logits gating_output [T, E]; renormalize divides the k weights by their sum."""
    weights = _empty(gating_output, (gating_output.shape[0], k), np.float32)
    ids = _empty(gating_output, (gating_output.shape[0], k), np.int32)
    _C.ops.topk_softmax(weights, ids, gating_output, renormalize)
    return weights, ids


def remap_expert_ids(topk_ids, start: int, count: int):
    """Expert parallelism: global expert ids in [start, start + count) to this rank's local
    ones, the others -1 (fused_experts skips them), in place."""
    _C.ops.remap_expert_ids(topk_ids, start, count)
    return topk_ids


def grouped_topk(gating_output, k: int, num_expert_group: int = 1, topk_group: int = 1,
                 scoring_func: str = "softmax", renormalize: bool = False,
                 routed_scaling_factor: float = 1.0, e_score_correction_bias=None):
    """MoE routing with expert groups and a choice bias (vLLM's grouped_topk: DeepSeek V2/V3,
    GLM-4.5; contract in csrc/ops.def): (topk_weights f32 [T, k], topk_ids i32 [T, k]).
    scoring_func is "softmax" or "sigmoid"."""
    if scoring_func not in ("softmax", "sigmoid"):
        raise ValueError(f"grouped_topk: scoring_func must be 'softmax' or 'sigmoid', got "
                         f"{scoring_func!r}")
    weights = _empty(gating_output, (gating_output.shape[0], k), np.float32)
    ids = _empty(gating_output, (gating_output.shape[0], k), np.int32)
    _C.ops.grouped_topk(weights, ids, gating_output, e_score_correction_bias, num_expert_group,
                        topk_group, scoring_func == "sigmoid", renormalize,
                        routed_scaling_factor)
    return weights, ids


_EXPERT_ACTIVATIONS = {"silu": 0, "swigluoai": 1, "relu2": 2}


def fused_experts(x, w13, w2, topk_weights, topk_ids, w13_bias=None, w2_bias=None,
                  activation: str = "silu", w13_scale=None, w2_scale=None):
    """out [T, H] = sum_j topk_weights[:, j] * w2_e(act(gate_e x, up_e x)), e = topk_ids[:, j];
    w13 [E, 2 I, H] and w2 [E, H, I] stacked expert Weights (vLLM's fused_experts), optional
    f32 biases [E, 2 I] / [E, H]; activation "silu" (SwiGLU) or "swigluoai" (gpt-oss's).
    fp8 experts (W8A8, vLLM's block-fp8 MoE): w13 / w2 e4m3 codes (uint8 host arrays, or
    F8_E4M3 device arrays, whose `.scales` are taken when no scales are given) with f32 scales
    [E, K / 128, N]; the rows each product reads are quantized per 128 values."""
    if activation not in _EXPERT_ACTIVATIONS:
        raise ValueError(f"fused_experts: activation must be one of "
                         f"{sorted(_EXPERT_ACTIVATIONS)}, got {activation!r}")
    if w13_scale is None and is_fp8_weight(w13):
        w13_scale, w2_scale = w13.scales, getattr(w2, "scales", None)
    fp8 = w13_scale is not None
    out = _empty(x, x.shape)
    _C.ops.fused_experts(out, x, _typed(w13, F8_E4M3) if fp8 else _arg(w13),
                         _typed(w2, F8_E4M3) if fp8 else _arg(w2), topk_weights, topk_ids,
                         w13_bias, w2_bias, _EXPERT_ACTIVATIONS[activation], w13_scale,
                         w2_scale)
    return out
