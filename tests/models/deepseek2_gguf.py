"""The DeepSeek V2/V3 tiny checkpoints (tiny_checkpoints.py) as GGUF arch deepseek2, laid out the
way llama.cpp's convert_hf_to_gguf.py (DeepseekV2Model) lays them out: MLA as MQA with one KV
head (key_length kv_lora_rank + qk_rope_head_dim, value_length kv_lora_rank, the decompressed
head sizes under key_length_mla / value_length_mla), kv_b_proj split per head into attn_k_b
(W_UK transposed, [heads, kv_lora_rank, qk_nope_head_dim]) and attn_v_b ([heads, v_head_dim,
kv_lora_rank]), the experts stacked, the choice bias as exp_probs_b.bias, YaRN's mscale_all_dim
as 0.1 * rope.scaling.yarn_log_multiplier. legacy=True writes what converters before the split
wrote: attn_kv_b whole, per-head key/value lengths, as many KV heads as heads, and no
expert_gating_func (llama.cpp then takes softmax). No tokenizer (tests run on token ids)."""

from __future__ import annotations

import json
import os

import numpy as np

FAMILIES = ("deepseek_v2", "deepseek_v2_lite", "deepseek_v3", "deepseek_v3_yarn")
_NAMES = {  # HF names (per layer: after model.layers.{i}.) -> GGUF names
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa", "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp", "mlp.experts.gate_proj": "ffn_gate_exps",
    "mlp.experts.up_proj": "ffn_up_exps", "mlp.experts.down_proj": "ffn_down_exps",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp", "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}


def write_deepseek2_gguf(hf_dir: str, out_path: str, qtype=None, legacy: bool = False) -> str:
    """A GGUF of a DeepSeek V2/V3 tiny checkpoint: matrices (routers aside, which llama.cpp
    keeps f32) in `qtype` (gguf's quantizer) where their rows are whole blocks, else F32. The
    tiny attn_k_b's rows of 16 and attn_q_b's of 48 stay F32: llama-quantize refuses such rows
    for Q8_0, and `vllmx quantize`'s F16 fallback would have llama.cpp round their inputs to
    f16 (real models' rows, 128 and 1536, are whole blocks)."""
    import gguf
    from safetensors.numpy import load_file

    from tests.models.tiny_checkpoints import _stack_experts

    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    nh, r = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    v3 = "DeepseekV3ForCausalLM" in cfg["architectures"]
    rope = cfg.get("rope_parameters") or {}
    w = gguf.GGUFWriter(out_path, "deepseek2")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nh)
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("no_vocab")
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        if rope.get("mscale_all_dim") is not None:  # llama.cpp divides it by 0.1 again
            w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    w.add_rope_dimension_count(dr)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    # The converter writes q_lora_rank only where there is one; llama.cpp reads it for any
    # model but 26/27-layer (V2-Lite's) ones, so a 3-layer model without a query latent says 0.
    w.add_q_lora_rank(cfg.get("q_lora_rank") or 0)
    w.add_kv_lora_rank(r)
    if legacy:
        w.add_head_count_kv(nh)
        w.add_key_length(dn + dr)
        w.add_value_length(dv)
    else:
        w.add_head_count_kv(1)
        w.add_key_length(r + dr)
        w.add_value_length(r)
        w.add_key_length_mla(dn + dr)
        w.add_value_length_mla(dv)
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    if not legacy:  # the published configs say scoring_func; transformers' defaults imply it
        sigmoid = cfg.get("scoring_func", "sigmoid" if v3 else "softmax") == "sigmoid"
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if sigmoid
                                 else gguf.ExpertGatingFuncType.SOFTMAX)
    sd = _stack_experts(load_file(os.path.join(hf_dir, "model.safetensors")),
                        cfg["n_routed_experts"])
    tensors = {}
    for name, t in sd.items():
        t = np.ascontiguousarray(t.astype(np.float32))
        if not name.startswith("model.layers."):
            tensors[{"model.embed_tokens.weight": "token_embd.weight",
                     "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]] = t
            continue
        parts = name.split(".")
        i, rest, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
        if name.endswith("mlp.gate.e_score_correction_bias"):
            tensors[f"blk.{i}.exp_probs_b.bias"] = t
        elif rest == "self_attn.kv_b_proj" and not legacy:
            kv_b = t.reshape(nh, dn + dv, r)
            tensors[f"blk.{i}.attn_k_b.weight"] = np.ascontiguousarray(
                kv_b[:, :dn].transpose(0, 2, 1))
            tensors[f"blk.{i}.attn_v_b.weight"] = np.ascontiguousarray(kv_b[:, dn:])
        else:
            tensors[f"blk.{i}.{_NAMES[rest]}.{suffix}"] = t
    for name, t in tensors.items():
        block = 0 if qtype is None else gguf.GGML_QUANT_SIZES[qtype][0]
        if block and t.ndim >= 2 and t.shape[-1] % block == 0 and "ffn_gate_inp" not in name:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
