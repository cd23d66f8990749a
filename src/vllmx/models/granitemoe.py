"""Granite's mixture-of-experts models: GraniteMoeForCausalLM (PowerMoE, Granite 3.0/3.1 MoE)
and GraniteMoeSharedForCausalLM, which adds a dense SwiGLU MLP that every token takes beside
its routed experts. Both are Granite (llama.py: embedding, attention, residual and logits
multipliers) with every layer sparse; this module maps their checkpoints onto SparseMoeBlock.

transformers' router takes the top k of the logits, then a softmax over those k: the same
weights as a softmax over all experts renormalized over the top k (topk_softmax with
renormalize; exp(l_i) / sum over the k of exp(l_j) either way), and llama.cpp's granitemoe
renormalizes too. The experts come stacked: input_linear [E, 2 I, H] is [gate; up]
(transformers chunks it in that order and applies the activation to the first half), as
fused_experts' w13, and output_linear [E, H, I] is w2."""

from __future__ import annotations

from vllmx.layers.fused_moe import SparseMoeBlock, SwiGLUMLP
from vllmx.models import moe
from vllmx.models.shapes import require_tensors

GRANITE_MOE_ARCHS = ("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM")

# Checkpoint names -> the names llama.py and moe.py read (the router as mlp.gate; the experts
# already stacked, unlike Qwen3-MoE's per-expert tensors).
_HF_NAMES = {".block_sparse_moe.router.layer.": ".mlp.gate.",
             ".block_sparse_moe.input_linear.": ".mlp.experts.gate_up_proj.",
             ".block_sparse_moe.output_linear.": ".mlp.experts.down_proj.",
             ".shared_mlp.input_linear.": ".shared_mlp.gate_up_proj.",
             ".shared_mlp.output_linear.": ".shared_mlp.down_proj."}


def is_granite_moe(cfg: dict) -> bool:
    archs = cfg.get("architectures") or []
    return (any(a in GRANITE_MOE_ARCHS for a in archs)
            or cfg.get("gguf_architecture") == "granitemoe")


def granite_moe_config(cfg: dict) -> dict:
    """moe.moe_config's fields with every layer sparse (intermediate_size is the experts' size)
    and the top-k weights always renormalized, plus shared_intermediate_size (0: no shared
    MLP, GraniteMoe's)."""
    out = moe.moe_config({**cfg, "norm_topk_prob": True})
    out["shared_intermediate_size"] = int(cfg.get("shared_intermediate_size") or 0)
    return out


def granite_moe_name(name: str) -> str:
    for old, new in _HF_NAMES.items():
        name = name.replace(old, new)
    return name


def sparse_block(cfg: dict, weights, i: int) -> SparseMoeBlock:
    """Layer i's MLP (GraniteMoeShared's with its shared SwiGLU beside the experts), from a
    checkpoint renamed by granite_moe_name or a GGUF's tensors (stacked gate / up / down apart,
    and ffn_*_shexp for the shared MLP)."""
    p = f"model.layers.{i}."
    if "gguf_architecture" in cfg:
        w13, w2 = moe.expert_weights(weights, cfg, i)
    else:
        names = [p + "mlp.experts.gate_up_proj.weight", p + "mlp.experts.down_proj.weight"]
        require_tensors(weights, names)
        w13, w2 = (weights[n] for n in names)
    shared_mlp = None
    if cfg["shared_intermediate_size"]:
        shared = p + "shared_mlp."
        fused = shared + "gate_up_proj.weight" in weights
        gate_up = [shared + "gate_up_proj"] if fused else [shared + "gate_proj",
                                                           shared + "up_proj"]
        require_tensors(weights, [n + ".weight" for n in gate_up + [shared + "down_proj"]])
        shared_mlp = SwiGLUMLP([weights[n + ".weight"] for n in gate_up],
                               weights[shared + "down_proj.weight"], reduce_results=False)
    return SparseMoeBlock(weights[p + "mlp.gate.weight"], w13, w2, cfg["num_experts_per_tok"],
                          cfg["norm_topk_prob"], name=p + "block_sparse_moe",
                          shared_experts=shared_mlp)


def granite_moe_checkpoint_shapes(cfg: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """Replaces each layer's dense MLP tensors by the router, the stacked experts and the shared
    MLP, as GraniteMoe / GraniteMoeShared checkpoints name them."""
    cfg = granite_moe_config(cfg)
    h, inter, n = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    s = cfg["shared_intermediate_size"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name in ("gate_proj", "up_proj", "down_proj"):
            del shapes[f"{p}mlp.{name}.weight"]
        shapes[p + "block_sparse_moe.router.layer.weight"] = (n, h)
        shapes[p + "block_sparse_moe.input_linear.weight"] = (n, 2 * inter, h)
        shapes[p + "block_sparse_moe.output_linear.weight"] = (n, h, inter)
        if s:
            shapes[p + "shared_mlp.input_linear.weight"] = (2 * s, h)
            shapes[p + "shared_mlp.output_linear.weight"] = (h, s)
