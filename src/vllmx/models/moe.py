"""The mixture-of-experts MLPs: Qwen3-MoE (routed SwiGLU experts, norm_topk_prob, dense layers
by decoder_sparse_step / mlp_only_layers), Mixtral (renormalized top-2), GLM-4.5 (sigmoid scores
steered by e_score_correction_bias, shared experts, first_k_dense_replace dense layers) in the
Llama decoder, and DeepSeek V2/V3's (grouped routing, shared experts) beside MLA
(models/deepseek_v2.py). What differs between them is only the MLP of a sparse layer; this
module says which layers are sparse and how they route, gathers their experts into the stacked
w13 / w2 that fused_experts takes, and lists their tensors for load_format="dummy"."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

import numpy as np

from vllmx.distributed.parallel_state import expert_range, get_ep_group
from vllmx.layers.fused_moe import GroupedRouting, SparseMoeBlock, SwiGLUMLP
from vllmx.ops import Weight

MOE_ARCHS = ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Glm4MoeForCausalLM", "GptOssForCausalLM",
             "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
# Sigmoid scores and a choice bias (noaux_tc) unless the config says otherwise.
_SIGMOID_ARCHS = ("Glm4MoeForCausalLM", "DeepseekV3ForCausalLM")


def is_moe(cfg: dict) -> bool:
    archs = cfg.get("architectures") or []
    return any(a in MOE_ARCHS for a in archs) or bool(cfg.get("num_experts"))


def moe_config(cfg: dict) -> dict:
    """The MoE fields under one set of names: num_experts, num_experts_per_tok,
    moe_intermediate_size, norm_topk_prob, sparse_layers (one flag per layer),
    shared_intermediate_size (0: none) and routing (a GroupedRouting without its bias, or None
    for topk_softmax)."""
    archs = cfg.get("architectures") or []
    mixtral = "MixtralForCausalLM" in archs or cfg.get("gguf_architecture") == "llama"
    out = dict(cfg)
    out["num_experts"] = int(cfg.get("num_experts") or cfg.get("num_local_experts")
                             or cfg.get("n_routed_experts") or 0)
    out["num_experts_per_tok"] = int(cfg.get("num_experts_per_tok") or 0)
    out["moe_intermediate_size"] = int(cfg.get("moe_intermediate_size")
                                       or cfg["intermediate_size"])
    if out["num_experts"] < 1 or not 1 <= out["num_experts_per_tok"] <= out["num_experts"]:
        raise ValueError(f"MoE config: num_experts = {out['num_experts']} and "
                         f"num_experts_per_tok = {out['num_experts_per_tok']} are not usable")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"MoE config: hidden_act {cfg['hidden_act']!r} is not supported "
                         f"(experts run SwiGLU with silu)")
    # DeepSeek's / GLM's n_shared_experts, or Qwen2-MoE's / Qwen3-Next's one gated shared expert
    out["shared_expert_gated"] = bool(cfg.get("shared_expert_intermediate_size"))
    out["shared_intermediate_size"] = (int(cfg.get("shared_expert_intermediate_size") or 0)
                                       or int(cfg.get("n_shared_experts") or 0)
                                       * out["moe_intermediate_size"])
    # Mixtral, and llama.cpp's qwen3moe, always renormalize the top-k weights.
    out["norm_topk_prob"] = True if mixtral or cfg.get("gguf_architecture") == "qwen3moe" else (
        bool(cfg.get("norm_topk_prob", False)))
    out["routing"] = _routing(cfg, archs)
    step = int(cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or 1)
    first_sparse = int(cfg.get("first_k_dense_replace") or 0)
    dense = set(cfg.get("mlp_only_layers") or [])
    if "first_k_dense_replace" in cfg:  # DeepSeek / GLM-4.5: every step-th layer from there
        out["sparse_layers"] = [i >= first_sparse and i % step == 0
                                for i in range(cfg["num_hidden_layers"])]
    else:
        out["sparse_layers"] = [i not in dense and (i + 1) % step == 0
                                for i in range(cfg["num_hidden_layers"])]
    return out


def _routing(cfg: dict, archs: list[str]) -> GroupedRouting | None:
    """DeepSeek's and GLM-4.5's routing (vLLM's grouped_topk), None for a softmax router. A
    deepseek2 / glm4moe GGUF's config names its scoring and method (loader/gguf.py)."""
    if not (any(a in archs for a in ("DeepseekV2ForCausalLM", *_SIGMOID_ARCHS))
            or cfg.get("gguf_architecture") in ("deepseek2", "glm4moe")):
        return None
    sigmoid = any(a in archs for a in _SIGMOID_ARCHS)
    method = cfg.get("topk_method") or ("noaux_tc" if sigmoid else "greedy")
    if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise ValueError(f"MoE config: topk_method {method!r} is not supported (greedy, "
                         f"group_limited_greedy, noaux_tc)")
    grouped = method != "greedy"
    return GroupedRouting(
        num_expert_group=int(cfg.get("n_group") or 1) if grouped else 1,
        topk_group=int(cfg.get("topk_group") or 1) if grouped else 1,
        scoring_func=cfg.get("scoring_func") or ("sigmoid" if sigmoid else "softmax"),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0))


def stack_experts(ws: list[Weight]) -> np.ndarray:
    """[E, N, row] from E weights [N, row] of one dtype."""
    if len({w.dtype for w in ws}) != 1:
        raise ValueError(f"experts of one layer must share a dtype, got "
                         f"{sorted({w.dtype for w in ws})}")
    return np.stack([np.asarray(w.data).reshape(w.shape[0], -1) for w in ws])


def expert_weights(weights, cfg: dict, i: int) -> tuple[Weight, Weight]:
    """(w13 [E, 2 I, H], w2 [E, H, I]) of layer i: from each expert's gate/up/down tensors
    (model.layers.{i}.mlp.experts.{e}.gate_proj / Mixtral's block_sparse_moe.experts.{e}.w1,
    w3, w2), or from the stacked tensors of a GGUF (mlp.experts.gate_proj [E, I, H], ...)."""
    p = f"model.layers.{i}.mlp.experts."
    if p + "gate_proj.weight" in weights:  # stacked (GGUF's ffn_*_exps)
        gate, up, down = (weights[p + n + ".weight"] for n in ("gate_proj", "up_proj",
                                                                "down_proj"))
        if gate.dtype != up.dtype:
            raise ValueError(f"layer {i}: ffn_gate_exps and ffn_up_exps must share a dtype to "
                             f"run as one w13, got types {gate.dtype} and {up.dtype}")
        e = gate.shape[0]
        w13 = np.concatenate([np.asarray(gate.data).reshape(e, gate.shape[1], -1),
                              np.asarray(up.data).reshape(e, up.shape[1], -1)], axis=1)
        w2 = np.asarray(down.data).reshape(e, down.shape[1], -1)
        inter, h = gate.shape[1], gate.shape[2]
        return (Weight(w13, gate.dtype, (e, 2 * inter, h)),
                Weight(np.ascontiguousarray(w2), down.dtype, tuple(down.shape)))
    e_count = cfg["num_experts"]
    first = 0
    if (ep := get_ep_group()) is not None:  # this rank's experts, whole
        first, e_count = expert_range(e_count, ep)
    names = [(p + f"{e}.gate_proj.weight", p + f"{e}.up_proj.weight", p + f"{e}.down_proj.weight")
             for e in range(first, first + e_count)]
    missing = [n for trio in names for n in trio if n not in weights]
    if missing:
        raise ValueError(f"layer {i}: checkpoint is missing {len(missing)} expert tensors, e.g. "
                         f"{missing[:3]}")
    gates = [weights[g] for g, _, _ in names]
    ups = [weights[u] for _, u, _ in names]
    downs = [weights[d] for _, _, d in names]
    inter, h = gates[0].shape
    w13 = np.concatenate([stack_experts(gates), stack_experts(ups)], axis=1)
    return (Weight(w13, gates[0].dtype, (e_count, 2 * inter, h)),
            Weight(stack_experts(downs), downs[0].dtype, (e_count, h, inter)))


class RenamedWeights(Mapping):
    """weights under new names, looked up on access (a dummy checkpoint's tensors are made
    only when asked for)."""

    def __init__(self, weights, rename):
        self.weights = weights
        self.names = {rename(n): n for n in weights}

    def __getitem__(self, name: str) -> Weight:
        return self.weights[self.names[name]]

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


_MIXTRAL_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def mixtral_name(name: str) -> str:
    """Mixtral's block_sparse_moe names as Qwen3-MoE's: mlp.gate, and mlp.experts.{e}.gate_proj /
    up_proj / down_proj for w1 / w3 / w2."""
    parts = name.replace(".block_sparse_moe.", ".mlp.").split(".")
    if len(parts) == 8 and parts[3:5] == ["mlp", "experts"]:
        parts[6] = _MIXTRAL_EXPERT.get(parts[6], parts[6])
    return ".".join(parts)


def sparse_block(cfg: dict, weights, i: int) -> SparseMoeBlock:
    """Layer i's MoE MLP: its router (and the router's choice bias under noaux_tc), experts and
    shared experts."""
    p = f"model.layers.{i}.mlp."
    w13, w2 = expert_weights(weights, cfg, i)
    routing = cfg["routing"]
    # the choice bias: a checkpoint's buffer, or a GGUF's exp_probs_b.bias
    bias_name = next((p + n for n in ("gate.e_score_correction_bias",
                                      "gate.e_score_correction.bias") if p + n in weights), None)
    biased = bias_name is not None
    if routing is not None and routing.num_expert_group == 1 and routing.scoring_func == \
            "softmax" and not biased:
        routing = None if routing.routed_scaling_factor == 1.0 else routing
    if routing is not None and bias_name is not None:
        bias = weights[bias_name].to_float32().reshape(-1)
        routing = dataclasses.replace(routing, e_score_correction_bias=np.ascontiguousarray(
            bias, dtype=np.float32))
    shared = gate = None
    if cfg["shared_intermediate_size"]:
        s = p + ("shared_expert." if cfg["shared_expert_gated"] else "shared_experts.")
        shared = SwiGLUMLP([weights[s + "gate_proj.weight"], weights[s + "up_proj.weight"]],
                           weights[s + "down_proj.weight"], reduce_results=False)
        if cfg["shared_expert_gated"]:
            gate = weights[p + "shared_expert_gate.weight"]
    ep = get_ep_group()
    return SparseMoeBlock(weights[p + "gate.weight"], w13, w2, cfg["num_experts_per_tok"],
                          cfg["norm_topk_prob"], name=p[:-1], routing=routing,
                          shared_experts=shared, shared_expert_gate=gate,
                          expert_range=None if ep is None else expert_range(
                              cfg["num_experts"], ep))


def moe_checkpoint_shapes(cfg: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """Replaces the dense MLP tensors of each sparse layer by the router and the experts, as
    Qwen3-MoE / Mixtral checkpoints name them."""
    cfg = moe_config(cfg)
    mixtral = "MixtralForCausalLM" in (cfg.get("architectures") or [])
    h, inter, n = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    shared = cfg["shared_intermediate_size"]
    for i, sparse in enumerate(cfg["sparse_layers"]):
        if not sparse:
            continue
        p = f"model.layers.{i}."
        for name in ("gate_proj", "up_proj", "down_proj"):  # (absent without intermediate_size)
            shapes.pop(f"{p}mlp.{name}.weight", None)
        mlp = p + ("block_sparse_moe." if mixtral else "mlp.")
        shapes[mlp + "gate.weight"] = (n, h)
        if cfg["routing"] is not None and cfg["routing"].scoring_func == "sigmoid":
            shapes[mlp + "gate.e_score_correction_bias"] = (n,)
        if shared:
            s = mlp + ("shared_expert." if cfg["shared_expert_gated"] else "shared_experts.")
            shapes[s + "gate_proj.weight"] = shapes[s + "up_proj.weight"] = (shared, h)
            shapes[s + "down_proj.weight"] = (h, shared)
            if cfg["shared_expert_gated"]:
                shapes[mlp + "shared_expert_gate.weight"] = (1, h)
        for e in range(n):
            gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj",
                                                                 "down_proj")
            shapes[f"{mlp}experts.{e}.{gate}.weight"] = (inter, h)
            shapes[f"{mlp}experts.{e}.{up}.weight"] = (inter, h)
            shapes[f"{mlp}experts.{e}.{down}.weight"] = (h, inter)
