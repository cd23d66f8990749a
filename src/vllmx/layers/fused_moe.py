"""A mixture-of-experts MLP (vLLM's FusedMoE behind a router): router logits, routing
(topk_softmax, or grouped_topk for DeepSeek V2/V3 and GLM-4.5), then fused_experts over the
stacked SwiGLU experts, plus the shared experts where the model has them. The experts stay in
their stored format; on the CPU block experts are repacked once, expert by expert
(ops.repack_experts); on the GPU they are uploaded dense in the activation dtype (the CUDA
kernel, cuda/fused_moe.cu, sorts the tokens by expert on the device)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from vllmx import ops
from vllmx.device import F32
from vllmx.distributed.parallel_state import get_tp_group
from vllmx.layers import placement
from vllmx.layers.linear import Linear, MergedLinear, RowParallelLinear, UnquantizedLinear
from vllmx.layers.norm import ResidualAdd
from vllmx.ops import Weight


@dataclass
class GroupedRouting:
    """vLLM's grouped_topk parameters (csrc/ops.def): scores by scoring_func ("softmax" or
    "sigmoid"), the choice steered by e_score_correction_bias (DeepSeek V3's noaux_tc) where
    there is one, only the topk_group best of num_expert_group groups competing, weights times
    routed_scaling_factor."""
    num_expert_group: int = 1
    topk_group: int = 1
    scoring_func: str = "softmax"
    routed_scaling_factor: float = 1.0
    e_score_correction_bias: np.ndarray | None = None  # f32 [E] (a DeviceArray on the GPU)


class SwiGLUMLP:
    """down(silu(gate x) * up x): a dense MLP (DeepSeek's first layers, the hybrids'), or one
    beside the experts (DeepSeek's, GLM-4.5's and GraniteMoeShared's shared experts: then
    reduce_results=False, vLLM's flag, since under tensor parallelism the block reduces its sum
    once). gate_up: [gate, up], or one fused [gate; up] tensor."""

    def __init__(self, gate_up: list[Weight], down: Weight, reduce_results: bool = True):
        self.gate_up_proj = MergedLinear(gate_up, [None] * len(gate_up))
        self.down_proj = RowParallelLinear(down) if reduce_results else Linear(down)

    def __call__(self, x):
        return self.down_proj(self.gate_up_proj.act_and_mul(x))


class SparseMoeBlock:
    """out = sum over the token's top_k experts e of p_e * down_e(silu(gate_e x) * up_e x), p the
    router's weights for its logits gate(x): softmax, renormalized over the top_k when asked
    (Mixtral, Qwen3-MoE's norm_topk_prob), or GroupedRouting's; plus shared_experts(x) where
    given. w13 [E, 2 I, H] stacks each expert's [gate; up], w2 [E, H, I]."""

    def __init__(self, gate: Weight, w13: Weight, w2: Weight, top_k: int, renormalize: bool,
                 name: str = "experts", routing: GroupedRouting | None = None,
                 shared_experts: SwiGLUMLP | None = None, gate_bias: Weight | None = None,
                 w13_bias: np.ndarray | None = None, w2_bias: np.ndarray | None = None,
                 activation: str = "silu", shared_expert_gate: Weight | None = None,
                 expert_range: tuple[int, int] | None = None):
        on_gpu = placement.current().on_gpu
        num_experts = gate.shape[0]  # (the router's: every expert, whichever rank holds it)
        # Expert parallelism: this rank holds experts [first, first + count) of them, whole.
        _, count = expert_range or (0, num_experts)
        if w13.shape[0] != count or not 1 <= top_k <= num_experts:
            raise ValueError(f"{name}: router {gate.shape} and experts {w13.shape} disagree, or "
                             f"top_k = {top_k} is not in 1..{num_experts}")
        self.expert_range = expert_range
        if on_gpu:  # (the experts first: a type the GPU cannot run fails before any upload)
            # fp8 experts (an fp8 checkpoint's, or online fp8's) where both stacks can be.
            fp8 = placement.experts_fp8(w13) and placement.experts_fp8(w2)
            self.w13 = placement.upload_experts(w13, f"{name}.w13", fp8)
            self.w2 = placement.upload_experts(w2, f"{name}.w2", fp8)
            w13_bias, w2_bias = (None if b is None else placement.upload_vector(b, F32)
                                 for b in (w13_bias, w2_bias))
        else:
            self.w13 = ops.repack_experts(w13)
            self.w2 = ops.repack_experts(w2)
        self.gate = UnquantizedLinear(gate, gate_bias)  # vLLM's router: never fp8
        self.top_k = top_k
        self.renormalize = renormalize
        if routing is not None and routing.e_score_correction_bias is not None:
            routing = dataclasses.replace(routing, e_score_correction_bias=placement.upload_vector(
                routing.e_score_correction_bias, F32))  # where the router runs
        self.routing = routing
        # gpt-oss: f32 biases [E, 2 I] / [E, H] and its clamped SwiGLU ("swigluoai")
        self.w13_bias, self.w2_bias, self.activation = w13_bias, w2_bias, activation
        self.shared_experts = shared_experts
        self._add = ResidualAdd(w13.shape[2]) if shared_experts is not None else None
        # Qwen2-MoE / Qwen3-Next: the shared expert's output times sigmoid(x @ gate^T) [T, 1]
        self.shared_expert_gate = (None if shared_expert_gate is None
                                   else Linear(shared_expert_gate))
        # Tensor parallelism: each expert's intermediate rows are cut tp ways, or under expert
        # parallelism each rank holds its experts whole (the shared experts cut either way),
        # so every rank's out is a partial sum, reduced once at the end.
        self.tp_group = get_tp_group()

    def route(self, x):
        """(topk_weights f32 [T, k], topk_ids i32 [T, k]) of the tokens x."""
        logits = self.gate(x)
        r = self.routing
        if r is None:
            return ops.topk_softmax(logits, self.top_k, self.renormalize)
        return ops.grouped_topk(logits, self.top_k, r.num_expert_group, r.topk_group,
                                r.scoring_func, self.renormalize, r.routed_scaling_factor,
                                r.e_score_correction_bias)

    def __call__(self, x):
        topk_weights, topk_ids = self.route(x)
        if self.expert_range is not None:  # the other ranks' experts: -1, skipped
            ops.remap_expert_ids(topk_ids, *self.expert_range)
        out = ops.fused_experts(x, self.w13, self.w2, topk_weights, topk_ids, self.w13_bias,
                                self.w2_bias, self.activation)
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_expert_gate is not None:
                ops.sigmoid_gate_(shared, self.shared_expert_gate(x))
            self._add(out, shared)  # shared += out
            out = shared
        if self.tp_group is not None:
            self.tp_group.all_reduce(out)
        return out
