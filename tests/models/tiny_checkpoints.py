"""Tiny random checkpoints of each supported family, written by transformers (safetensors)
and converted to GGUF with the `gguf` package's writer the way llama.cpp's converter lays
tensors out (Llama Q/K un-permuted to Meta's interleaved layout)."""

from __future__ import annotations

import json
import os

import numpy as np

from tests.models.tiny_configs import VOCAB, family_configs  # noqa: F401 - VOCAB re-exported

# Families whose 1-D tensors (LayerNorm biases, projection biases, norm weights) start random:
# the default init (ones and zeros) would leave them untested.
RANDOM_VECTORS = ("gpt_neox", "gpt_neox_seq", "stablelm", "stablelm_parallel", "starcoder2",
                  "starcoder2_gguf", "gpt2", "gpt2_scaled", "cohere", "cohere_bias",
                  "cohere_gguf", "cohere2", "falcon", "falcon_one_norm", "falcon_mq", "falcon_seq",
                  "falcon_mq_gguf", "cohere2_gguf", "deepseek_v3", "deepseek_v3_yarn", "deepseek_v2",
                  "deepseek_v2_lite", "glm4_moe", "gpt_oss", "gpt_oss_gguf", "qwen3_next", "qwen3_next_gguf", "qwen3_5", "qwen3_5_gguf", "qwen3_5_moe_gguf",
                  "qwen3_5_moe", "granite_moe_hybrid", "granite_hybrid_dense", "nemotron_h",
                  "nemotron_h_moe_gguf", "nemotron_h_dense",
                  "falcon_h1", "falcon_h1_gguf", "falcon_h1_no_norm")
# Their routers' choice bias (a buffer, zero at init) drawn too, so that it steers the pick.
CHOICE_BIAS = ("deepseek_v3", "deepseek_v3_yarn", "glm4_moe", "nemotron_h", "nemotron_h_moe_gguf")

GGUF_ARCH = {"llama": "llama", "llama3": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "granite": "granite", "smollm3_gguf": "smollm3", "phi3": "phi3", "glm4": "glm4",
             "olmo2": "olmo2", "olmo3": "olmo2", "exaone4_gguf": "exaone4",
             "qwen3_moe_gguf": "qwen3moe", "mixtral": "llama", "granite_moe": "granitemoe",
             "granite_moe_shared": "granitemoe", "glm4_moe": "glm4moe",
             "gpt_oss_gguf": "gpt-oss"}
# llama.cpp's converter un-permutes Q/K to Meta's interleaved layout for these.
_PERMUTED = ("llama", "granite", "granitemoe", "smollm3")


def make_checkpoint(family: str, dtype: str, out_dir: str, config_overrides: dict | None = None,
                    **sizes) -> str:
    """The family's tiny checkpoint (sizes: family_configs' keyword arguments; config_overrides:
    fields of the config set after, the checkpoint's folder named after them)."""
    import torch
    import transformers as tf

    cfg = family_configs(**sizes)[family]
    for k, v in (config_overrides or {}).items():
        setattr(cfg, k, v)
    torch.manual_seed(1234)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # random init leaves near-uniform logits; widen them a little
        for name, p in model.named_parameters():
            norm = "norm" in name or ".ln_" in name  # GPT-2's ln_1, ln_2, ln_f
            if family in RANDOM_VECTORS and (norm or p.dim() == 1):
                # norm weights around 1 (Cohere's [heads, head_dim] too), biases around 0
                p.normal_(1.0 if norm and name.endswith(".weight") else 0.0, 0.3)
            elif name.endswith("_proj_bias"):  # gpt-oss's stacked expert biases [E, n]
                p.normal_(0.0, 0.5)
            elif p.dim() in (2, 3):  # 3: transformers' stacked experts
                p.mul_(4.0)
        for name, b in model.named_buffers():
            if family in CHOICE_BIAS and name.endswith("e_score_correction_bias"):
                b.uniform_(-0.2, 0.2)
    model = model.to(getattr(torch, dtype))
    suffix = "".join(f"-{k}{v}" for k, v in (config_overrides or {}).items())
    path = os.path.join(out_dir, f"{family}-{dtype}{suffix}")
    model.save_pretrained(path)
    return path


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    import math

    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _stack_experts(sd: dict, num_experts: int) -> dict:
    """Per-expert MoE tensors (Qwen3-MoE's names; Mixtral's renamed to them) stacked into one
    [E, rows, cols] tensor per layer and projection, as llama.cpp's ffn_*_exps."""
    from vllmx.models.moe import mixtral_name

    sd = {mixtral_name(k): v for k, v in sd.items()}
    layers = {k.split(".")[2] for k in sd if ".mlp.experts." in k}
    for i in layers:
        p = f"model.layers.{i}.mlp.experts."
        for proj in ("gate_proj", "up_proj", "down_proj"):
            sd[f"{p}{proj}.weight"] = np.stack(
                [sd.pop(f"{p}{e}.{proj}.weight") for e in range(num_experts)])
    return sd


def _split_granite_moe(sd: dict, cfg: dict) -> dict:
    """GraniteMoe's stacked experts and shared MLP under the names write_gguf maps, as
    llama.cpp's converter splits them: input_linear's [gate; up] halves apart."""
    from vllmx.models.granitemoe import granite_moe_name

    out = {}
    for name, t in sd.items():
        name = granite_moe_name(name)
        if name.endswith("gate_up_proj.weight"):  # [E, 2 I, H] or the shared [2 S, H]
            gate, up = np.split(t, 2, axis=-2)
            out[name.replace("gate_up_proj", "gate_proj")] = gate
            out[name.replace("gate_up_proj", "up_proj")] = up
        else:
            out[name] = t
    return out


def _split_gpt_oss(sd: dict) -> dict:
    """gpt-oss's tensors under the names write_gguf maps, as llama.cpp's converter splits them:
    the transposed gate_up_proj [E, H, 2 I] (gate and up interleaved) into gate and up [E, I, H]
    and their biases, down_proj [E, I, H] transposed, the router as mlp.gate."""
    out = {}
    for name, t in sd.items():
        name = name.replace(".mlp.router.", ".mlp.gate.")
        if name.endswith("self_attn.sinks"):
            out[name + ".weight"] = t
        elif name.endswith("experts.gate_up_proj"):
            t, p = t.transpose(0, 2, 1), name.removesuffix("gate_up_proj")
            out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = t[:, 0::2], t[:, 1::2]
        elif name.endswith("experts.gate_up_proj_bias"):
            p = name.removesuffix("gate_up_proj_bias")
            out[p + "gate_proj.bias"], out[p + "up_proj.bias"] = t[:, 0::2], t[:, 1::2]
        elif name.endswith("experts.down_proj"):
            out[name + ".weight"] = t.transpose(0, 2, 1)
        elif name.endswith("experts.down_proj_bias"):
            out[name.removesuffix("_bias") + ".bias"] = t
        else:
            out[name] = t
    return out


def _nextn_layer(tensors: dict, n: int, hidden: int, rng) -> dict:
    """A GLM-4.5 multi-token-prediction layer blk.{n} as its converter stores it past the last
    one: a decoder layer (random, shaped as layer n - 1) and the nextn.* projection and norms.
    llama.cpp loads it and never runs it; a reader that ran it would move the logits."""
    out = {}
    for name, t in tensors.items():
        if name.startswith(f"blk.{n - 1}."):
            out[f"blk.{n}." + name.split(".", 2)[2]] = (
                rng.standard_normal(t.shape) * t.std() + t.mean()).astype(np.float32)
    out[f"blk.{n}.nextn.eh_proj.weight"] = rng.standard_normal((hidden, 2 * hidden)).astype(
        np.float32)
    for norm in ("enorm", "hnorm", "shared_head_norm"):
        out[f"blk.{n}.nextn.{norm}.weight"] = rng.normal(1.0, 0.3, hidden).astype(np.float32)
    return out


def _tensor_qtype(gname: str, t: np.ndarray, qtype, expert_qtype):
    """llama-quantize's choice: weight matrices and stacked experts (expert_qtype where given)
    quantized; norms, biases, sinks and routers (ffn_gate_inp) kept F32."""
    if t.ndim < 2 or not gname.endswith(".weight") or ".ffn_gate_inp." in gname:
        return None
    return (expert_qtype or qtype) if t.ndim == 3 else qtype


def write_gguf(hf_dir: str, family: str, out_path: str, qtype=None, window: bool = True,
               expert_qtype=None) -> str:
    """A GGUF of a tiny checkpoint, matrices in F32 or `qtype` (gguf's quantizer; the stacked
    experts in `expert_qtype` where given), as llama.cpp's converter lays it out; no tokenizer
    (tests run on token ids). window=False leaves out a Phi-3 sliding_window (llama.cpp ignores
    it). GLM-4.5's file gets the multi-token-prediction layer its converter appends. DeepSeek
    V2/V3 families: arch deepseek2 (deepseek2_gguf.py)."""
    import gguf
    from safetensors.numpy import load_file

    from tests.models import deepseek2_gguf

    if family in deepseek2_gguf.FAMILIES:
        return deepseek2_gguf.write_deepseek2_gguf(hf_dir, out_path, qtype)
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = GGUF_ARCH[family]
    sd = load_file(os.path.join(hf_dir, "model.safetensors"))
    num_experts = (cfg.get("num_experts") or cfg.get("num_local_experts")
                   or cfg.get("n_routed_experts"))
    nextn = cfg.get("num_nextn_predict_layers", 0) if arch == "glm4moe" else 0
    w = gguf.GGUFWriter(out_path, arch)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // nh
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # OLMo 3's per-type rope: the full layers' one
    w.add_block_count(cfg["num_hidden_layers"] + nextn)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("no_vocab")
    if arch in ("granite", "granitemoe"):
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    if arch == "phi3" and window and cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    if arch in ("olmo2", "exaone4") and "sliding_attention" in (cfg.get("layer_types") or []):
        w.add_sliding_window(cfg["sliding_window"])  # llama.cpp: 3 of every 4 layers slide
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if arch == "gpt-oss":
        sd = _split_gpt_oss(sd)
        w.add_sliding_window(cfg["sliding_window"])
        w.add_expert_feed_forward_length(cfg["intermediate_size"])
    if arch == "glm4moe":
        sd = {k.replace("e_score_correction_bias", "e_score_correction.bias"): v
              for k, v in sd.items()}
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
        w.add_nextn_predict_layers(nextn)
    if arch == "granitemoe":
        sd = _split_granite_moe(sd, cfg)
        if cfg.get("shared_intermediate_size"):
            w.add_expert_shared_feed_forward_length(cfg["shared_intermediate_size"])
    elif num_experts and arch != "gpt-oss":
        sd = _stack_experts(sd, num_experts)
    if num_experts:
        w.add_expert_count(num_experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if cfg.get("moe_intermediate_size"):
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if rope.get("rope_type") == "llama3":  # llama.cpp stores llama3 scaling as frequency factors
        w.add_tensor("rope_freqs.weight", _llama3_rope_factors(rope, head_dim))
    names = {
        "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
        "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
        "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",  # Phi-3's fused ones
        "mlp.gate": "ffn_gate_inp", "mlp.experts.gate_proj": "ffn_gate_exps",
        "mlp.experts.up_proj": "ffn_up_exps", "mlp.experts.down_proj": "ffn_down_exps",
        "shared_mlp.gate_proj": "ffn_gate_shexp", "shared_mlp.up_proj": "ffn_up_shexp",
        "shared_mlp.down_proj": "ffn_down_shexp",  # GraniteMoeShared's
    }
    if arch in ("olmo2", "exaone4"):  # norms after attention and MLP
        per_layer |= {"post_attention_layernorm": "post_attention_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"}
    if arch == "glm4":  # norms on the attention and MLP outputs
        per_layer |= {"post_self_attn_layernorm": "post_attention_norm",
                      "post_mlp_layernorm": "post_ffw_norm"}
    if arch in ("gpt-oss", "glm4moe"):  # the norm before the MLP
        per_layer |= {"post_attention_layernorm": "post_attention_norm",
                      "self_attn.sinks": "attn_sinks", "mlp.gate.e_score_correction": "exp_probs_b",
                      "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
                      "mlp.shared_experts.up_proj": "ffn_up_shexp",
                      "mlp.shared_experts.down_proj": "ffn_down_shexp"}
    tensors = {}
    for name, t in sd.items():
        t = np.ascontiguousarray(t.astype(np.float32))
        if name.startswith("model.layers."):
            parts = name.split(".")
            i, rest, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
            if arch in _PERMUTED and rest == "self_attn.q_proj":
                t = _permute(t, nh)
            elif arch in _PERMUTED and rest == "self_attn.k_proj":
                t = _permute(t, nkv)
            gname = f"blk.{i}.{per_layer[rest]}.{suffix}"
        else:
            gname = names[name]
        tensors[gname] = t
    if nextn:
        tensors |= _nextn_layer(tensors, cfg["num_hidden_layers"], cfg["hidden_size"],
                                np.random.default_rng(0))
    for gname, t in tensors.items():
        tq = _tensor_qtype(gname, t, qtype, expert_qtype)
        if tq is not None:
            w.add_tensor(gname, gguf.quants.quantize(t, tq), raw_dtype=tq)
        else:
            w.add_tensor(gname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


def tiny_gguf(family: str, qname: str, out_dir: str, writer: str = "quantize") -> str:
    """The family's tiny checkpoint as an F32 GGUF, requantized by `vllmx quantize`, or written
    by the gguf package's quantizer (writer "gguf": Q8_0, or MXFP4 experts and F32 rest)."""
    import gguf

    sizes = {"hidden_size": 256, "intermediate_size": 256} if qname == "Q4_K" else {}
    out_dir = os.path.join(out_dir, "h256" if sizes else "h64")
    f32 = os.path.join(out_dir, f"{family}-F32.gguf")
    if not os.path.exists(f32):
        write_gguf(make_checkpoint(family, "float32", out_dir, **sizes), family, f32)
    if qname == "F32":
        return f32
    path = os.path.join(out_dir, f"{family}-{qname}-{writer}.gguf")
    if writer == "gguf":
        qtype = gguf.GGMLQuantizationType[qname]
        src = make_checkpoint(family, "float32", out_dir, **sizes)
        if qname == "MXFP4":
            return write_gguf(src, family, path, expert_qtype=qtype)
        return write_gguf(src, family, path, qtype)
    from vllmx.cli.quantize import quantize_model

    quantize_model(f32, path, qname)
    return path
