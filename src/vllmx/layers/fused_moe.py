"""A mixture-of-experts MLP (vLLM's FusedMoE behind a router): router logits, topk_softmax,
then fused_experts over the stacked SwiGLU experts. The experts stay in their stored format;
on the CPU block experts are repacked once, expert by expert (ops.repack_experts)."""

from __future__ import annotations

from vllmx import _C, ops
from vllmx.layers import placement
from vllmx.layers.linear import Linear
from vllmx.ops import Weight


class SparseMoeBlock:
    """out = sum over the token's top_k experts e of p_e * down_e(silu(gate_e x) * up_e x), p the
    router's softmax over its logits gate(x), renormalized over the top_k when asked (Mixtral,
    Qwen3-MoE's norm_topk_prob). w13 [E, 2 I, H] stacks each expert's [gate; up], w2 [E, H, I]."""

    def __init__(self, gate: Weight, w13: Weight, w2: Weight, top_k: int, renormalize: bool,
                 name: str = "experts"):
        if placement.current().on_gpu and not _C.ops.fused_experts.has_kernel("cuda"):
            raise ValueError(
                f"{name}: the fused_experts op has no CUDA kernel yet (mixture-of-experts "
                f"models run on the CPU only); run this model with device='cpu'")
        num_experts = w13.shape[0]
        if gate.shape[0] != num_experts or not 1 <= top_k <= num_experts:
            raise ValueError(f"{name}: router {gate.shape} and experts {w13.shape} disagree, or "
                             f"top_k = {top_k} is not in 1..{num_experts}")
        self.gate = Linear(gate)
        self.w13 = ops.repack_experts(w13)
        self.w2 = ops.repack_experts(w2)
        self.top_k = top_k
        self.renormalize = renormalize

    def __call__(self, x):
        topk_weights, topk_ids = ops.topk_softmax(self.gate(x), self.top_k, self.renormalize)
        return ops.fused_experts(x, self.w13, self.w2, topk_weights, topk_ids)
