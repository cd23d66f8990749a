"""The LayerNorm families' tiny checkpoints (tiny_checkpoints.py) as GGUF files laid out the way
llama.cpp's convert_hf_to_gguf.py lays them out: GPT-NeoX's query_key_value regrouped from per
head [q; k; v] and Falcon's from kv groups [the group's q heads; k; v] into [q heads; k heads;
v heads] (Falcon's ln_attn as attn_norm_2, no rope keys, as llama.cpp's converter writes them),
GPT-2's Conv1D weights transposed to [out, in],
StableLM's per-head q/k norms stacked into [heads, head_dim], and each architecture's
hyperparameters under its GGUF keys. No tokenizer (tests run on token ids)."""

from __future__ import annotations

import json
import os

import numpy as np

# family (tiny_checkpoints.py) -> llama.cpp architecture
GGUF_ARCH = {"gpt_neox": "gptneox", "stablelm": "stablelm", "stablelm_parallel": "stablelm",
             "starcoder2_gguf": "starcoder2", "gpt2": "gpt2", "cohere_gguf": "command-r",
             "cohere2_gguf": "cohere2", "falcon": "falcon", "falcon_mq_gguf": "falcon"}

_NAMES = {  # HF names -> GGUF names (per layer names use {i})
    "gptneox": {"gpt_neox.embed_in": "token_embd", "gpt_neox.final_layer_norm": "output_norm",
                "embed_out": "output", "lm_head": "output",
                "gpt_neox.layers.{i}.input_layernorm": "blk.{i}.attn_norm",
                "gpt_neox.layers.{i}.attention.query_key_value": "blk.{i}.attn_qkv",
                "gpt_neox.layers.{i}.attention.dense": "blk.{i}.attn_output",
                "gpt_neox.layers.{i}.post_attention_layernorm": "blk.{i}.ffn_norm",
                "gpt_neox.layers.{i}.mlp.dense_h_to_4h": "blk.{i}.ffn_up",
                "gpt_neox.layers.{i}.mlp.dense_4h_to_h": "blk.{i}.ffn_down"},
    "gpt2": {"transformer.wte": "token_embd", "transformer.wpe": "position_embd",
             "transformer.ln_f": "output_norm", "lm_head": "output",
             "transformer.h.{i}.ln_1": "blk.{i}.attn_norm",
             "transformer.h.{i}.attn.c_attn": "blk.{i}.attn_qkv",
             "transformer.h.{i}.attn.c_proj": "blk.{i}.attn_output",
             "transformer.h.{i}.ln_2": "blk.{i}.ffn_norm",
             "transformer.h.{i}.mlp.c_fc": "blk.{i}.ffn_up",
             "transformer.h.{i}.mlp.c_proj": "blk.{i}.ffn_down"},
    "falcon": {"transformer.word_embeddings": "token_embd", "transformer.ln_f": "output_norm",
               "lm_head": "output", "transformer.h.{i}.input_layernorm": "blk.{i}.attn_norm",
               "transformer.h.{i}.ln_mlp": "blk.{i}.attn_norm",
               "transformer.h.{i}.ln_attn": "blk.{i}.attn_norm_2",
               "transformer.h.{i}.self_attention.query_key_value": "blk.{i}.attn_qkv",
               "transformer.h.{i}.self_attention.dense": "blk.{i}.attn_output",
               "transformer.h.{i}.mlp.dense_h_to_4h": "blk.{i}.ffn_up",
               "transformer.h.{i}.mlp.dense_4h_to_h": "blk.{i}.ffn_down"},
    "decoder": {"model.embed_tokens": "token_embd", "model.norm": "output_norm",
                "lm_head": "output", "model.layers.{i}.input_layernorm": "blk.{i}.attn_norm",
                "model.layers.{i}.self_attn.q_proj": "blk.{i}.attn_q",
                "model.layers.{i}.self_attn.k_proj": "blk.{i}.attn_k",
                "model.layers.{i}.self_attn.v_proj": "blk.{i}.attn_v",
                "model.layers.{i}.self_attn.o_proj": "blk.{i}.attn_output",
                "model.layers.{i}.self_attn.q_norm": "blk.{i}.attn_q_norm",
                "model.layers.{i}.self_attn.k_norm": "blk.{i}.attn_k_norm",
                "model.layers.{i}.self_attn.q_layernorm": "blk.{i}.attn_q_norm",
                "model.layers.{i}.self_attn.k_layernorm": "blk.{i}.attn_k_norm",
                "model.layers.{i}.post_attention_layernorm": "blk.{i}.ffn_norm",
                "model.layers.{i}.mlp.gate_proj": "blk.{i}.ffn_gate",
                "model.layers.{i}.mlp.up_proj": "blk.{i}.ffn_up",
                "model.layers.{i}.mlp.down_proj": "blk.{i}.ffn_down",
                "model.layers.{i}.mlp.c_fc": "blk.{i}.ffn_up",
                "model.layers.{i}.mlp.c_proj": "blk.{i}.ffn_down"},
}


def _gguf_name(hf: str, table: dict[str, str]) -> str:
    base, _, suffix = hf.rpartition(".")
    parts = base.split(".")
    for n, p in enumerate(parts):
        if p.isdigit():
            key = ".".join(parts[:n] + ["{i}"] + parts[n + 1:])
            return table[key].format(i=p) + "." + suffix
    return table[base] + "." + suffix


def _stack_per_head_norms(sd: dict) -> dict:
    """StableLM's q_layernorm.norms.{h}.weight -> q_layernorm.weight [heads, head_dim]."""
    out, heads = {}, {}
    for k, v in sd.items():
        if ".norms." in k:
            prefix, h = k.split(".norms.")
            heads.setdefault(prefix, {})[int(h.split(".")[0])] = v
        else:
            out[k] = v
    for prefix, hs in heads.items():
        out[prefix + ".weight"] = np.stack([hs[h] for h in range(len(hs))])
    return out


def write_layernorm_gguf(hf_dir: str, family: str, out_path: str, qtype=None) -> str:
    """The checkpoint as llama.cpp's converter writes it; 2-D weights in F32 or `qtype`."""
    import gguf
    from safetensors.numpy import load_file

    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = GGUF_ARCH[family]
    sd = {k: v.astype(np.float32) for k, v in
          load_file(os.path.join(hf_dir, "model.safetensors")).items()}
    w = gguf.GGUFWriter(out_path, arch)
    if arch == "gpt2":
        h, nh, layers, ctx = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg["n_positions"]
        ffn, nkv = cfg.get("n_inner") or 4 * h, nh
        eps = cfg["layer_norm_epsilon"]
    elif arch == "falcon":  # kv groups: num_kv_heads (new architecture), else one (multi-query)
        h, nh, layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
        ctx, ffn = cfg["max_position_embeddings"], cfg["ffn_hidden_size"]
        nkv = cfg["num_kv_heads"] if cfg["new_decoder_architecture"] else 1
        eps = cfg["layer_norm_epsilon"]
    else:
        h, nh, layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
        ctx, ffn = cfg["max_position_embeddings"], cfg["intermediate_size"]
        nkv = cfg.get("num_key_value_heads") or nh
        eps = cfg.get("layer_norm_eps") or cfg.get("norm_epsilon")
    d = h // nh
    w.add_context_length(ctx)
    w.add_embedding_length(h)
    w.add_feed_forward_length(ffn)
    w.add_block_count(layers)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_eps(eps)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("no_vocab")
    rope = cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor") or cfg.get("rotary_pct") or cfg.get(
        "partial_rotary_factor") or 1.0
    if arch not in ("gpt2", "falcon"):
        w.add_rope_freq_base(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
        w.add_rope_dimension_count(int(d * partial))
    if arch == "gptneox":
        w.add_parallel_residual(cfg.get("use_parallel_residual", True))
    if arch == "cohere2":
        w.add_sliding_window(cfg["sliding_window"])
    if arch in ("command-r", "cohere2"):
        w.add_logit_scale(cfg["logit_scale"])
    if arch == "stablelm":
        sd = _stack_per_head_norms(sd)
    table = _NAMES.get(arch, _NAMES["decoder"])
    for name, t in sd.items():
        if arch == "gptneox" and ".query_key_value." in name:  # per head [q; k; v] -> [q; k; v]
            t = t.reshape(nh, 3, d, -1).transpose(1, 0, 2, 3).reshape(t.shape)
        if arch == "falcon" and ".query_key_value." in name:  # kv groups -> [q; k; v]
            g = t.reshape(nkv, nh // nkv + 2, d, -1)
            t = np.concatenate([g[:, :-2].reshape(nh * d, -1), g[:, -2].reshape(nkv * d, -1),
                                g[:, -1].reshape(nkv * d, -1)]).reshape(t.shape)
        if arch == "gpt2" and t.ndim == 2 and name.split(".")[-2] in ("c_attn", "c_proj", "c_fc"):
            t = t.T  # Conv1D [in, out] -> [out, in]
        t = np.ascontiguousarray(t)
        gname = _gguf_name(name, table)
        if qtype is not None and t.ndim == 2 and "norm" not in gname:
            w.add_tensor(gname, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
