"""The hybrid models' GGUFs (llama.cpp's archs granitehybrid, nemotron_h, nemotron_h_moe,
qwen3next, qwen35, qwen35moe, falcon-h1): their metadata as the
Hugging Face config fields the model classes read, and their tensors under the checkpoint's
names and in its layouts, so that each hybrid model runs the same code from either format.

What llama.cpp's converter does to a Mamba2 mixer, undone here: A is stored as -exp(A_log)
[heads, 1] (read back as A_log = log(-A): exp(log(-A)) is A to a float's last bit), D as
[heads, 1], dt_bias as the ssm_dt bias, the conv1d weight squeezed to [channels, kernel] and
the gated norm's weight as [groups, d_inner / groups] (the mixer reads both flat). A tensor
that no table names is refused by name: vllmx would not run it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from vllmx.models.qwen35_gguf import qwen35_grouped
from vllmx.ops import Weight

HYBRID_GGUF_ARCHS = ("granitehybrid", "nemotron_h", "nemotron_h_moe", "qwen3next", "qwen35",
                     "qwen35moe", "falcon-h1")

# Per arch: GGUF tensor names (per layer with {i}, without .weight / .bias) -> HF names.
_MAMBA2 = {"ssm_in": "in_proj", "ssm_conv1d": "conv1d", "ssm_a": "A_log", "ssm_d": "D",
           "ssm_dt.bias": "dt_bias", "ssm_norm": "norm", "ssm_out": "out_proj"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
GGUF_TO_HF: dict[str, dict[str, str]] = {
    # Granite-4 (GraniteMoeHybrid). The shared MLP is ffn_*_shexp beside experts and the dense
    # ffn_* without them; both are the model's shared_mlp (gate and up apart).
    "granitehybrid": {
        **_TOP,
        **{f"blk.{{i}}.{g}": f"model.layers.{{i}}.mamba.{h}" for g, h in _MAMBA2.items()},
        "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
        "blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
        "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
        "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
        "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
        "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
        "blk.{i}.ffn_gate_inp": "model.layers.{i}.mlp.gate",
        "blk.{i}.ffn_gate_exps": "model.layers.{i}.mlp.experts.gate_proj",
        "blk.{i}.ffn_up_exps": "model.layers.{i}.mlp.experts.up_proj",
        "blk.{i}.ffn_down_exps": "model.layers.{i}.mlp.experts.down_proj",
        **{f"blk.{{i}}.ffn_{n}{s}": f"model.layers.{{i}}.shared_mlp.{n}_proj"
           for n in ("gate", "up", "down") for s in ("", "_shexp")},
    },
}
# Nemotron-H: one mixer a block, all under mixer.; nemotron_h_moe's experts stacked [E, ...].
_NEMOTRON_H = {
    "token_embd": "backbone.embeddings", "output_norm": "backbone.norm_f", "output": "lm_head",
    "blk.{i}.attn_norm": "backbone.layers.{i}.norm",
    **{f"blk.{{i}}.{g}": f"backbone.layers.{{i}}.mixer.{h}" for g, h in {
        **_MAMBA2, "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj",
        "attn_output": "o_proj", "ffn_up": "up_proj", "ffn_down": "down_proj",
        "ffn_gate_inp": "gate", "exp_probs_b.bias": "gate.e_score_correction_bias",
        "ffn_up_exps": "experts.up_proj", "ffn_down_exps": "experts.down_proj",
        "ffn_up_shexp": "shared_experts.up_proj",
        "ffn_down_shexp": "shared_experts.down_proj"}.items()},
}
GGUF_TO_HF["nemotron_h"] = GGUF_TO_HF["nemotron_h_moe"] = _NEMOTRON_H
# Qwen3-Next: the converter regroups in_proj_qkvz into attn_qkv [q; k; v] and attn_gate (z),
# Qwen3.5's in_proj_qkv / in_proj_z; ssm_ba stays per key-head group [b_g; a_g] (split below).
GGUF_TO_HF["qwen3next"] = {
    **_TOP,
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
    **{f"blk.{{i}}.{g}": f"model.layers.{{i}}.self_attn.{h}" for g, h in {
        "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
        "attn_q_norm": "q_norm", "attn_k_norm": "k_norm"}.items()},
    **{f"blk.{{i}}.{g}": f"model.layers.{{i}}.linear_attn.{h}" for g, h in {
        "attn_qkv": "in_proj_qkv", "attn_gate": "in_proj_z", "ssm_ba": "in_proj_ba",
        "ssm_conv1d": "conv1d", "ssm_a": "A_log", "ssm_dt.bias": "dt_bias", "ssm_norm": "norm",
        "ssm_out": "out_proj"}.items()},
    **{f"blk.{{i}}.{g}": f"model.layers.{{i}}.mlp.{h}" for g, h in {
        "ffn_gate_inp": "gate", "ffn_gate_exps": "experts.gate_proj",
        "ffn_up_exps": "experts.up_proj", "ffn_down_exps": "experts.down_proj",
        "ffn_gate_shexp": "shared_expert.gate_proj", "ffn_up_shexp": "shared_expert.up_proj",
        "ffn_down_shexp": "shared_expert.down_proj",
        "ffn_gate_inp_shexp": "shared_expert_gate"}.items()},
}

# Qwen3.5: the mixer's projections stored apart (ssm_beta / ssm_alpha), dense MLPs in qwen35.
GGUF_TO_HF["qwen35"] = GGUF_TO_HF["qwen35moe"] = {
    **{k: v for k, v in GGUF_TO_HF["qwen3next"].items() if not k.endswith("ssm_ba")},
    "blk.{i}.ssm_beta": "model.layers.{i}.linear_attn.in_proj_b",
    "blk.{i}.ssm_alpha": "model.layers.{i}.linear_attn.in_proj_a",
    **{f"blk.{{i}}.ffn_{n}": f"model.layers.{{i}}.mlp.{n}_proj" for n in ("gate", "up", "down")},
}

# Falcon-H1: its muP multipliers already folded into the matrices by the converter; the norm
# before the MLP named whole (the converter's table maps pre_ff_layernorm.weight to ffn_norm).
GGUF_TO_HF["falcon-h1"] = {
    "token_embd": "model.embed_tokens", "output_norm": "model.final_layernorm",
    "output": "lm_head",
    **{f"blk.{{i}}.{g}": f"model.layers.{{i}}.mamba.{h}" for g, h in _MAMBA2.items()},
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.ffn_norm": "model.layers.{i}.pre_ff_layernorm.weight",
    **{f"blk.{{i}}.{g}": f"model.layers.{{i}}.self_attn.{h}" for g, h in {
        "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj",
        "attn_output": "o_proj"}.items()},
    **{f"blk.{{i}}.ffn_{n}": f"model.layers.{{i}}.feed_forward.{n}_proj"
       for n in ("gate", "up", "down")},
}


def hybrid_config(arch: str, get: Callable[..., Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """The config fields of a hybrid GGUF (beside loader/gguf.py's common ones)."""
    return {"granitehybrid": _granitehybrid_config, "nemotron_h": _nemotron_h_config,
            "nemotron_h_moe": _nemotron_h_config, "qwen3next": _qwen3next_config,
            "qwen35": _qwen3next_config, "qwen35moe": _qwen3next_config,
            "falcon-h1": _falcon_h1_config}[arch](get, cfg)


def _mamba2_config(get) -> dict[str, Any]:
    heads = get("ssm.time_step_rank")  # the converter stores the head count there
    return {"heads": heads, "d_head": get("ssm.inner_size") // heads,
            "d_state": get("ssm.state_size"), "n_groups": get("ssm.group_count"),
            "d_conv": get("ssm.conv_kernel")}


def _granitehybrid_config(get, cfg: dict[str, Any]) -> dict[str, Any]:
    """A layer with 0 KV heads is a mamba layer (llama.cpp reads it so); rope only where
    rope.scaling.finetuned is true (llama.cpp's switch for Granite, true when absent);
    feed_forward_length is the experts' size, or the dense MLP's without experts."""
    kv = get("attention.head_count_kv")
    kv = kv if isinstance(kv, list) else [kv] * get("block_count")
    m = _mamba2_config(get)
    experts = int(get("expert_count") or 0)
    out = {"layer_types": ["attention" if n else "mamba" for n in kv],
           "num_key_value_heads": max(kv),
           "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
           "mamba_n_heads": m["heads"], "mamba_d_head": m["d_head"],
           "mamba_d_state": m["d_state"], "mamba_n_groups": m["n_groups"],
           "mamba_d_conv": m["d_conv"],
           "position_embedding_type": "rope" if get("rope.scaling.finetuned", True) else "nope",
           "num_local_experts": experts}
    if experts:
        out["shared_intermediate_size"] = int(get("expert_shared_feed_forward_length") or 0)
    else:
        out["shared_intermediate_size"] = get("feed_forward_length")
    return out


def _nemotron_h_config(get, cfg: dict[str, Any]) -> dict[str, Any]:
    """A block's kind from its KV heads and feed-forward length, as llama.cpp reads them:
    attention where KV heads, else a MoE (nemotron_h_moe) or an MLP (nemotron_h) where a
    feed-forward length, else mamba. Routing as llama.cpp's: sigmoid with the choice bias,
    renormalized only where expert_weights_norm says, scaled by expert_weights_scale."""
    n = get("block_count")
    kv, ff = get("attention.head_count_kv"), get("feed_forward_length")
    kv, ff = (v if isinstance(v, list) else [v or 0] * n for v in (kv, ff))
    ffn = "moe" if get("expert_count") else "mlp"
    if get("moe_latent_size"):
        raise ValueError(f"GGUF {cfg['gguf_architecture']}: moe_latent_size (experts in a "
                         f"latent space) is not supported by vllmx's GGUF loader")
    m = _mamba2_config(get)
    n_group = int(get("expert_group_count") or 1)
    topk_group = get("expert_group_used_count")
    if n_group > 1 and topk_group is None:
        raise ValueError(f"GGUF {cfg['gguf_architecture']}: expert_group_count {n_group} "
                         f"without expert_group_used_count")
    return {"layers_block_type": ["full_attention" if k else ffn if f else "linear_attention"
                                  for k, f in zip(kv, ff)],
            "num_key_value_heads": max(kv), "head_dim": get("attention.key_length"),
            "intermediate_size": max(ff), "mamba_num_heads": m["heads"],
            "mamba_head_dim": m["d_head"], "ssm_state_size": m["d_state"],
            "n_groups": m["n_groups"], "conv_kernel": m["d_conv"],
            "n_routed_experts": get("expert_count"),
            "moe_intermediate_size": get("expert_feed_forward_length"),
            "moe_shared_expert_intermediate_size": get("expert_shared_feed_forward_length"),
            "n_group": n_group, "topk_group": int(topk_group or 1),
            "norm_topk_prob": bool(get("expert_weights_norm", False)),
            "routed_scaling_factor": float(get("expert_weights_scale") or 1.0)}


def _qwen3next_config(get, cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-Next and Qwen3.5: every full_attention_interval-th layer gated attention, the rest
    Gated DeltaNet (key heads = ssm.group_count, value heads = ssm.time_step_rank, key head size
    = ssm.state_size); Qwen3-Next and Qwen3.5-MoE every layer sparse with a gated shared
    expert, the top-k renormalized as llama.cpp does; Qwen3.5's interleaved multimodal rope
    (rope.dimension_sections) is the plain rope for text positions."""
    hv = get("ssm.time_step_rank")
    arch = {"qwen3next": "Qwen3NextForCausalLM", "qwen35": "Qwen3_5ForCausalLM",
            "qwen35moe": "Qwen3_5MoeForCausalLM"}[cfg["gguf_architecture"]]
    return {"architectures": [arch],
            "full_attention_interval": get("full_attention_interval", 4),
            "linear_num_key_heads": get("ssm.group_count"), "linear_num_value_heads": hv,
            "linear_key_head_dim": get("ssm.state_size"),
            "linear_value_head_dim": get("ssm.inner_size") // hv,
            "linear_conv_kernel_dim": get("ssm.conv_kernel"),
            "moe_intermediate_size": get("expert_feed_forward_length"),
            "shared_expert_intermediate_size": get("expert_shared_feed_forward_length"),
            "norm_topk_prob": True}


def _falcon_h1_config(get, cfg: dict[str, Any]) -> dict[str, Any]:
    """The multipliers stay at 1 (folded into the file's matrices); the mixer's gated norm after
    the gate, as llama.cpp runs every falcon-h1 file (no key says otherwise); whether there is
    one at all the model reads from the tensors."""
    m = _mamba2_config(get)
    return {"mamba_d_ssm": m["heads"] * m["d_head"], "mamba_n_heads": m["heads"],
            "mamba_d_head": m["d_head"], "mamba_d_state": m["d_state"],
            "mamba_n_groups": m["n_groups"], "mamba_d_conv": m["d_conv"],
            "mamba_norm_before_gate": False}


def hf_weights(cfg: dict[str, Any], weights: dict[str, Weight]) -> dict[str, Weight]:
    """A hybrid GGUF's tensors under the checkpoint's names, A as A_log; any tensor the arch's
    table does not name is refused."""
    arch = cfg["gguf_architecture"]
    table = GGUF_TO_HF[arch]
    out = {}
    for name, w in weights.items():
        hf = _hf_name(name, table)
        if hf is None:
            raise ValueError(f"GGUF {arch}: tensor {name!r} is not supported by vllmx")
        if hf.endswith(".A_log"):
            a = w.to_float32().reshape(-1).astype(np.float64)
            w = Weight.from_numpy(np.log(-a).astype(np.float32))
        elif arch.startswith("qwen3") and hf.endswith("norm.weight") and ".linear_attn." not in hf:
            # stored as 1 + w; the model adds the 1 itself (exact but for |1 + w| < 0.5)
            w = Weight.from_numpy(w.to_float32() - np.float32(1.0))
        out[hf] = w
    if arch == "qwen3next":
        _split_ba(cfg, out)
    elif arch in ("qwen35", "qwen35moe"):
        qwen35_grouped(cfg, out)
    return out


def _split_ba(cfg: dict[str, Any], weights: dict[str, Weight]) -> None:
    """ssm_ba [b_g (r); a_g (r)] per key-head group g, r = value heads per key head, into
    Qwen3.5's in_proj_b and in_proj_a (value head g r + j in row g r + j of each)."""
    from vllmx.layers.linear import take_rows

    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    r = hv // hk
    g = np.arange(hk)[:, None] * 2 * r
    for name in [n for n in weights if n.endswith("linear_attn.in_proj_ba.weight")]:
        ba = weights.pop(name)
        weights[name.replace("_ba.", "_b.")] = take_rows(ba, (g + np.arange(r)).ravel())
        weights[name.replace("_ba.", "_a.")] = take_rows(ba, (g + r + np.arange(r)).ravel())


def _hf_name(name: str, table: dict[str, str]) -> str | None:
    parts = name.split(".")
    key, i = (("blk.{i}." + ".".join(parts[2:]), parts[1]) if parts[0] == "blk"
              else (name, ""))
    if key in table:  # a whole name: ssm_dt.bias, and ssm_a / ssm_d (no suffix)
        return table[key].format(i=i)
    base, _, suffix = key.rpartition(".")
    if base in table:
        return f"{table[base].format(i=i)}.{suffix}"
    return None
