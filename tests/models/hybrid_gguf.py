"""The hybrid tiny checkpoints (tiny_checkpoints.py) as GGUF files laid out the way llama.cpp's
convert_hf_to_gguf.py lays them out, for the archs llama.cpp names: granitehybrid (Granite-4),
nemotron_h, qwen3next / qwen35 / qwen35moe, falcon-h1. What the converter does to a Mamba2
mixer: A stored as -exp(A_log) [heads, 1], D as [heads, 1], dt_bias as ssm_dt.bias, the conv1d
weight squeezed to [channels, kernel], the gated norm's weight as [groups, d_inner / groups].
Matrices in `qtype` (gguf's quantizer) where their rows are whole blocks; norms, biases, the
conv, A, D and routers stay F32 as llama-quantize leaves them. No tokenizer (tests run on ids)."""

from __future__ import annotations

import json
import os

import numpy as np

FAMILIES = {"granite_moe_hybrid": "granitehybrid", "granite_hybrid_dense": "granitehybrid",
            "nemotron_h_moe_gguf": "nemotron_h_moe", "nemotron_h_dense": "nemotron_h",
            "qwen3_next_gguf": "qwen3next", "qwen3_5_gguf": "qwen35",
            "qwen3_5_moe_gguf": "qwen35moe", "falcon_h1_gguf": "falcon-h1",
            "falcon_h1_no_norm": "falcon-h1"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Llama Q/K permutation (rows of each head interleaved for GPT-J rope)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _mamba2(rest: str, t: np.ndarray, n_groups: int) -> tuple[str, np.ndarray]:
    """A Mamba2 mixer tensor (its name after the mixer's prefix) as the converter writes it."""
    if rest == "A_log":
        return "ssm_a", -np.exp(t.reshape(-1, 1))
    if rest == "D":
        return "ssm_d", t.reshape(-1, 1)
    if rest == "dt_bias":
        return "ssm_dt.bias", t
    if rest == "conv1d.weight":
        return "ssm_conv1d.weight", t.reshape(t.shape[0], -1)
    if rest == "norm.weight":
        return "ssm_norm.weight", t.reshape(n_groups, -1)
    base, _, suffix = rest.rpartition(".")
    return {"in_proj": "ssm_in", "out_proj": "ssm_out", "conv1d": "ssm_conv1d"}[base] + \
        "." + suffix, t


def _granitehybrid(w, cfg: dict, sd: dict) -> dict:
    """Granite-4's keys and tensors (GraniteHybridModel): the mamba layers say 0 KV heads, the
    rope is on only where rope.scaling.finetuned says so, the experts' input_linear split into
    gate and up, the shared MLP as *_shexp beside experts and as the dense ffn_* without."""
    n = cfg["num_hidden_layers"]
    types = cfg["layer_types"]
    attn = [t in ("attention", "full_attention") for t in types]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    use_rope = cfg.get("position_embedding_type") == "rope"
    experts = cfg.get("num_local_experts") or 0
    w.add_context_length(cfg["max_position_embeddings"] if use_rope else 2 ** 20)
    w.add_head_count(nh)
    w.add_head_count_kv([nkv if a else 0 for a in attn])
    w.add_rope_dimension_count(cfg["hidden_size"] // nh)
    w.add_rope_freq_base(cfg.get("rope_theta") or
                         (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    w.add_rope_scaling_finetuned(use_rope)
    w.add_embedding_scale(cfg["embedding_multiplier"])
    w.add_residual_scale(cfg["residual_multiplier"])
    w.add_attention_scale(cfg["attention_multiplier"])
    w.add_logit_scale(cfg["logits_scaling"])
    # llama.cpp sizes the dense MLP by feed_forward_length, the experts by it too (granitemoe)
    w.add_feed_forward_length(cfg["intermediate_size"] if experts
                              else cfg["shared_intermediate_size"])
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_shared_feed_forward_length(cfg["shared_intermediate_size"])
    heads, d_head = cfg["mamba_n_heads"], cfg["mamba_d_head"]
    w.add_ssm_conv_kernel(cfg["mamba_d_conv"])
    w.add_ssm_state_size(cfg["mamba_d_state"])
    w.add_ssm_group_count(cfg["mamba_n_groups"])
    w.add_ssm_inner_size(heads * d_head)
    w.add_ssm_time_step_rank(heads)
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "block_sparse_moe.router.layer": "ffn_gate_inp",
                 "block_sparse_moe.output_linear": "ffn_down_exps",
                 "shared_mlp.output_linear": "ffn_down_shexp" if experts else "ffn_down"}
    out = {}
    for name, t in sd.items():
        if not name.startswith("model.layers."):
            out[_TOP[name]] = t
            continue
        parts = name.split(".")
        i, rest = int(parts[2]), ".".join(parts[3:])
        base, _, suffix = rest.rpartition(".")
        if rest.startswith("mamba."):
            gname, t = _mamba2(rest[len("mamba."):], t, cfg["mamba_n_groups"])
            out[f"blk.{i}.{gname}"] = t
        elif base.endswith("input_linear"):  # [gate; up] apart
            gate, up = np.split(t, 2, axis=-2)
            kind = "exps" if base.startswith("block_sparse_moe") else (
                "shexp" if experts else "")
            sfx = f"_{kind}" if kind else ""
            out[f"blk.{i}.ffn_gate{sfx}.{suffix}"] = gate
            out[f"blk.{i}.ffn_up{sfx}.{suffix}"] = up
        else:
            if base == "self_attn.q_proj":
                t = _permute(t, nh)
            elif base == "self_attn.k_proj":
                t = _permute(t, nkv)
            out[f"blk.{i}.{per_layer[base]}.{suffix}"] = t
    assert n == len(types)
    return out


def _nemotron_h(w, cfg: dict, sd: dict) -> dict:
    """Nemotron-H's keys and tensors (NemotronHModel; with experts the arch is nemotron_h_moe):
    one mixer a block, its kind told by the per-layer KV heads (attention) and feed-forward
    lengths (MLP / MoE; both 0: mamba); the experts stacked, their choice bias exp_probs_b."""
    types = cfg["layers_block_type"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_context_length(2 ** 20)
    w.add_head_count(nh)
    w.add_head_count_kv([nkv if t == "full_attention" else 0 for t in types])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_feed_forward_length([cfg["intermediate_size"] if t == "mlp" else
                               cfg["moe_intermediate_size"] if t == "moe" else 0 for t in types])
    heads, d_head = cfg["mamba_num_heads"], cfg["mamba_head_dim"]
    w.add_ssm_conv_kernel(cfg["conv_kernel"])
    w.add_ssm_state_size(cfg["ssm_state_size"])
    w.add_ssm_group_count(cfg["n_groups"])
    w.add_ssm_inner_size(heads * d_head)
    w.add_ssm_time_step_rank(heads)
    if "moe" in types:
        w.add_expert_count(cfg["n_routed_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["moe_shared_expert_intermediate_size"])
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    return _nemotron_h_tensors(cfg, sd)


def _nemotron_h_tensors(cfg: dict, sd: dict) -> dict:
    types = cfg["layers_block_type"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    per_layer = {"norm": "attn_norm", "mixer.q_proj": "attn_q", "mixer.k_proj": "attn_k",
                 "mixer.v_proj": "attn_v", "mixer.o_proj": "attn_output",
                 "mixer.up_proj": "ffn_up", "mixer.down_proj": "ffn_down",
                 "mixer.gate": "ffn_gate_inp", "mixer.shared_experts.up_proj": "ffn_up_shexp",
                 "mixer.shared_experts.down_proj": "ffn_down_shexp"}
    top = {"backbone.embeddings.weight": "token_embd.weight",
           "backbone.norm_f.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    out = {}
    for name, t in sd.items():
        if not name.startswith("backbone.layers."):
            out[top[name]] = t
            continue
        parts = name.split(".")
        i, rest = int(parts[2]), ".".join(parts[3:])
        base, _, suffix = rest.rpartition(".")
        if rest.endswith("e_score_correction_bias"):
            out[f"blk.{i}.exp_probs_b.bias"] = t
        elif ".experts." in rest and ".shared_experts." not in rest:
            j, proj = parts[5], parts[6]
            if j == "0":  # the layer's experts stacked [E, rows, cols]
                e = cfg["n_routed_experts"]
                stacked = np.stack([sd[f"backbone.layers.{i}.mixer.experts.{k}.{proj}.weight"]
                                    for k in range(e)])
                out[f"blk.{i}.ffn_{proj.removesuffix('_proj')}_exps.weight"] = stacked
        elif types[i] == "linear_attention" and rest.startswith("mixer."):
            gname, t = _mamba2(rest[len("mixer."):], t, cfg["n_groups"])
            out[f"blk.{i}.{gname}"] = t
        else:
            if base == "mixer.q_proj":
                t = _permute(t, nh)
            elif base == "mixer.k_proj":
                t = _permute(t, nkv)
            out[f"blk.{i}.{per_layer[base]}.{suffix}"] = t
    return out


def _qwen3next(w, cfg: dict, sd: dict) -> dict:
    """Qwen3-Next's keys and tensors (Qwen3NextModel): every (1 + w) RMSNorm stored as w + 1
    (the mixer's gated norm is a plain w), in_proj_qkvz's per-key-head groups regrouped into
    attn_qkv [q; k; v] and attn_gate (z), in_proj_ba kept as ssm_ba, A as -exp(A_log) [heads],
    the experts stacked, the shared expert's gate as ffn_gate_inp_shexp. Qwen3.5 (qwen35,
    qwen35moe): its projections apart already, the value heads reordered from grouped by key
    head to tiled (the converter's _LinearAttentionVReorderBase), the mrope sections key."""
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    rope = cfg.get("rope_parameters") or {}
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_rope_dimension_count(int(cfg["head_dim"] * rope.get("partial_rotary_factor", 0.25)))
    if cfg.get("num_experts"):
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(hk)
    w.add_ssm_time_step_rank(hv)
    w.add_ssm_inner_size(dv * hv)
    w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
    qwen35 = any(k.endswith("linear_attn.in_proj_qkv.weight") for k in sd)  # not _qkvz
    if qwen35:  # interleaved multimodal rope; text positions make it the plain rope
        rot = int(cfg["head_dim"] * rope.get("partial_rotary_factor", 0.25)) // 2
        w.add_rope_dimension_sections([rot - rot // 2, rot // 2, 0, 0])
    per_layer = {"input_layernorm": "attn_norm",
                 "post_attention_layernorm": "post_attention_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
                 "linear_attn.in_proj_ba": "ssm_ba", "linear_attn.out_proj": "ssm_out",
                 "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
                 "linear_attn.in_proj_b": "ssm_beta", "linear_attn.in_proj_a": "ssm_alpha",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
                 "linear_attn.norm": "ssm_norm", "mlp.gate": "ffn_gate_inp",
                 "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
                 **{f"mlp.shared_expert.{n}_proj": f"ffn_{n}_shexp" for n in ("gate", "up", "down")}}
    r = hv // hk

    def tiled(x: np.ndarray, axis: int, d: int) -> np.ndarray:
        """Value heads from grouped (g r + j) to tiled (j hk + g) order along axis, as the
        qwen35 converter stores them for ggml's broadcast."""
        x = np.moveaxis(x, axis, 0)
        x = x.reshape(hk, r, d, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
        return np.moveaxis(x, 0, axis)

    out = {}
    for name, t in sd.items():
        if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + 1
        if qwen35 and ".linear_attn." in name and hk != hv:
            rest = name.split(".linear_attn.")[1]
            if rest == "in_proj_qkv.weight" or rest == "conv1d.weight":
                t = np.concatenate([t[:2 * hk * dk], tiled(t[2 * hk * dk:], 0, dv)])
            elif rest == "in_proj_z.weight":
                t = tiled(t, 0, dv)
            elif rest in ("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias"):
                t = tiled(t, 0, 1)
            elif rest == "out_proj.weight":
                t = tiled(t, 1, dv)
        if not name.startswith("model.layers."):
            out[_TOP[name]] = t
            continue
        parts = name.split(".")
        i, rest = int(parts[2]), ".".join(parts[3:])
        base, _, suffix = rest.rpartition(".")
        if rest == "linear_attn.A_log":
            out[f"blk.{i}.ssm_a"] = -np.exp(t)
        elif rest == "linear_attn.dt_bias":
            out[f"blk.{i}.ssm_dt.bias"] = t
        elif rest == "linear_attn.conv1d.weight":
            out[f"blk.{i}.ssm_conv1d.weight"] = t.reshape(t.shape[0], -1)
        elif rest == "linear_attn.in_proj_qkvz.weight":
            g = t.reshape(hk, 2 * dk + 2 * (hv // hk) * dv, -1)
            q, k, v, z = np.split(g, np.cumsum([dk, dk, hv // hk * dv]), axis=1)
            flat = [x.reshape(-1, t.shape[-1]) for x in (q, k, v, z)]
            out[f"blk.{i}.attn_qkv.weight"] = np.concatenate(flat[:3])
            out[f"blk.{i}.attn_gate.weight"] = flat[3]
        elif ".mlp.experts." in name:
            e, proj = parts[5], parts[6]
            if e == "0":
                stacked = np.stack([sd[f"model.layers.{i}.mlp.experts.{j}.{proj}.weight"]
                                    for j in range(cfg["num_experts"])])
                out[f"blk.{i}.ffn_{proj.removesuffix('_proj')}_exps.weight"] = stacked
        else:
            out[f"blk.{i}.{per_layer[base]}.{suffix}"] = t
    return out


def _falcon_h1(w, cfg: dict, sd: dict) -> dict:
    """Falcon-H1's keys and tensors (FalconH1Model): every muP multiplier folded into the
    matrices (in_proj's z, x, B, C, dt rows each by its ssm_multiplier and all by
    ssm_in_multiplier, the MLP's gate and down, q / k / v / o, the embedding and lm_head)."""
    d_inner = cfg["mamba_d_ssm"]
    gn = cfg["mamba_n_groups"] * cfg["mamba_d_state"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base((cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    w.add_ssm_conv_kernel(cfg["mamba_d_conv"])
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(cfg["mamba_d_state"])
    w.add_ssm_time_step_rank(d_inner // cfg["mamba_d_head"])
    w.add_ssm_group_count(cfg["mamba_n_groups"])

    def m(key):
        return cfg.get(key) if cfg.get(key) is not None else 1.0

    gate_m, down_m = cfg.get("mlp_multipliers") or (1.0, 1.0)
    zxbcdt = cfg.get("ssm_multipliers") or [1.0] * 5
    rows = np.concatenate([np.full(n, f, np.float32) for n, f in
                           zip([d_inner, d_inner, gn, gn, cfg["mamba_n_heads"]], zxbcdt)])
    scale = {"feed_forward.gate_proj": gate_m, "feed_forward.down_proj": down_m,
             "self_attn.q_proj": m("attention_in_multiplier"),
             "self_attn.k_proj": m("attention_in_multiplier") * m("key_multiplier"),
             "self_attn.v_proj": m("attention_in_multiplier"),
             "self_attn.o_proj": m("attention_out_multiplier"),
             "mamba.out_proj": m("ssm_out_multiplier")}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "feed_forward.gate_proj": "ffn_gate", "feed_forward.up_proj": "ffn_up",
                 "feed_forward.down_proj": "ffn_down"}
    top = {"model.embed_tokens.weight": ("token_embd.weight", m("embedding_multiplier")),
           "model.final_layernorm.weight": ("output_norm.weight", 1.0),
           "lm_head.weight": ("output.weight", m("lm_head_multiplier"))}
    out = {}
    for name, t in sd.items():
        if not name.startswith("model.layers."):
            gname, f = top[name]
            out[gname] = t * f
            continue
        parts = name.split(".")
        i, rest = int(parts[2]), ".".join(parts[3:])
        base, _, suffix = rest.rpartition(".")
        if rest == "mamba.in_proj.weight":
            t = t * rows[:, None] * m("ssm_in_multiplier")
        elif suffix == "weight" and base in scale:
            t = t * scale[base]
        if rest.startswith("mamba."):
            gname, t = _mamba2(rest[len("mamba."):], t, cfg["mamba_n_groups"])
            out[f"blk.{i}.{gname}"] = t
        elif rest == "pre_ff_layernorm.weight":  # the converter's table names it whole
            out[f"blk.{i}.ffn_norm"] = t
        else:
            out[f"blk.{i}.{per_layer[base]}.{suffix}"] = t
    return out


_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
_KEEP_F32 = ("norm", "ffn_gate_inp", "ssm_conv1d", "ssm_a", "ssm_d", "ssm_dt")


def write_hybrid_gguf(hf_dir: str, family: str, out_path: str, qtype=None,
                      tokenizer=None) -> str:
    """hf_dir's checkpoint as llama.cpp's GGUF of `family`'s arch (F32, or qtype blocks where
    a tensor's rows are whole blocks); tokenizer(writer): the tokenizer keys (bench/
    hybrid_gguf.py copies SmolLM2's), else the file says no_vocab (the tests pass token ids)."""
    import gguf
    from safetensors.numpy import load_file

    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = FAMILIES[family]
    sd = {k: v.astype(np.float32) for k, v in
          load_file(os.path.join(hf_dir, "model.safetensors")).items()}
    w = gguf.GGUFWriter(out_path, arch)
    w.add_block_count(cfg.get("num_hidden_layers") or len(cfg["layers_block_type"]))
    w.add_embedding_length(cfg["hidden_size"])
    if "layer_norm_epsilon" in cfg:  # Nemotron-H's name: the converter writes it as such
        w.add_layer_norm_eps(cfg["layer_norm_epsilon"])
    else:
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if tokenizer is not None:
        tokenizer(w)
    else:
        w.add_tokenizer_model("no_vocab")
    tensors = {"granitehybrid": _granitehybrid, "nemotron_h_moe": _nemotron_h,
               "nemotron_h": _nemotron_h, "qwen3next": _qwen3next, "qwen35": _qwen3next, "qwen35moe": _qwen3next,
               "falcon-h1": _falcon_h1}[arch](w, cfg, sd)
    for name, t in tensors.items():
        t = np.ascontiguousarray(t, dtype=np.float32)
        block = 0 if qtype is None else gguf.GGML_QUANT_SIZES[qtype][0]
        if (block and t.ndim >= 2 and t.shape[-1] % block == 0
                and not any(k in name for k in _KEEP_F32)):
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
