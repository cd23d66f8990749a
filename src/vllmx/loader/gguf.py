"""GGUF files through the `gguf` package: hyperparameters become an HF-style config, tensors
stay in their block format (memory-mapped), the tokenizer comes from the metadata."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from vllmx import _C
from vllmx.loader.gguf_file import GGUFFile
from vllmx.models.hybrid_gguf import HYBRID_GGUF_ARCHS, hybrid_config
from vllmx.ops import BF16, F16, F32, Weight, dtype_name, is_supported

# Dense dtypes as numpy reads them (bf16 as its raw uint16); block types stay uint8 rows.
_DENSE = {F32: "<f4", F16: "<f2", BF16: "<u2", 26: "<i4", 27: "<i8"}  # 26, 27: I32, I64


def gguf_to_hf_config(meta: dict[str, Any]) -> dict[str, Any]:
    """The HF `config.json` fields that the model code reads, from GGUF metadata."""
    arch = meta.get("general.architecture")
    if arch is None:
        raise ValueError("GGUF file has no general.architecture")

    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    num_heads = get("attention.head_count")
    hidden = get("embedding_length")
    vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    cfg: dict[str, Any] = {
        "gguf_architecture": arch,
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": get("attention.head_count_kv", num_heads),
        "head_dim": get("attention.key_length", hidden // num_heads if num_heads else None),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 2048),
        "vocab_size": vocab,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "sliding_window": get("attention.sliding_window"),
        "rope_local_base_freq": get("rope.freq_base_swa"),
        "attn_logit_softcapping": get("attn_logit_softcapping"),
        "final_logit_softcapping": get("final_logit_softcapping"),
        # Granite's multipliers
        "embedding_multiplier": get("embedding_scale"),
        "residual_multiplier": get("residual_scale"),
        "attention_multiplier": get("attention.scale"),
        "logits_scaling": get("logit_scale"),
        "logit_scale": get("logit_scale"),  # Command-R multiplies by it
    }
    eps = get("attention.layer_norm_epsilon")
    if eps is not None:  # the LayerNorm families' names for it
        cfg.update(layer_norm_eps=eps, norm_epsilon=eps, layer_norm_epsilon=eps)
    if get("use_parallel_residual") is not None:  # gptneox
        cfg["use_parallel_residual"] = bool(get("use_parallel_residual"))
    if arch in HYBRID_GGUF_ARCHS:  # per-layer KV heads among them (0: a recurrent layer)
        cfg.update(hybrid_config(arch, get, cfg))
    if isinstance(cfg["num_key_value_heads"], list):
        raise ValueError(f"GGUF {arch}: per-layer head counts are not supported")
    if get("expert_count"):  # MoE: qwen3moe, Mixtral as llama, granitemoe
        cfg["num_experts"] = get("expert_count")
        cfg["num_experts_per_tok"] = get("expert_used_count")
        cfg["moe_intermediate_size"] = get("expert_feed_forward_length")
    if arch == "granitemoe":  # GraniteMoeShared's shared MLP (none without the key)
        cfg["shared_intermediate_size"] = get("expert_shared_feed_forward_length")
    if arch == "glm4moe":
        cfg.update(_glm4moe_config(arch, get))
    rot = get("rope.dimension_count")
    if rot and cfg["head_dim"]:  # 1.0 too: GPT-NeoX and StableLM default to partial rope
        cfg["partial_rotary_factor"] = rot / cfg["head_dim"]
    pattern = get("attention.sliding_window_pattern")  # a period, or per layer: True = sliding
    if isinstance(pattern, list):
        cfg["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    elif pattern:
        cfg["sliding_window_pattern"] = int(pattern)
    scaling = get("rope.scaling.type")
    if scaling in ("linear", "yarn"):
        cfg["rope_scaling"] = {
            "rope_type": scaling,
            "factor": get("rope.scaling.factor", 1.0),
            "original_max_position_embeddings": get("rope.scaling.original_context_length"),
        }
        if scaling == "yarn":  # llama.cpp's defaults (32, 1) are transformers' too
            cfg["rope_scaling"].update(beta_fast=get("rope.scaling.yarn_beta_fast", 32.0),
                                       beta_slow=get("rope.scaling.yarn_beta_slow", 1.0))
    if arch == "deepseek2":
        cfg.update(_deepseek2_config(get, cfg))
    return cfg


# llama.cpp's expert_gating_func values (LLAMA_EXPERT_GATING_FUNC_TYPE_*) vllmx routes with.
_GATING = {1: "softmax", 2: "sigmoid"}


def _deepseek2_config(get, cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek V2/V3 (llama.cpp's deepseek2) as DeepseekV2/V3Config fields, read the way
    llama.cpp reads them: the MLA head sizes from key_length_mla / value_length_mla (older files:
    key_length / value_length), softmax routing unless expert_gating_func says sigmoid, no
    renormalization unless expert_weights_norm, and YaRN's scales as llama.cpp applies them."""
    for key in ("attention.temperature_scale", "rope.scaling.attn_factor",
                "rope.scaling.yarn_ext_factor"):
        if get(key):
            raise ValueError(f"GGUF deepseek2: {key} is not supported")
    gating = get("expert_gating_func")
    if gating is None:  # llama.cpp's default for files without the key (GLM-4.7-Flash: sigmoid)
        gating = 2 if get("block_count") in (47, 48) and cfg["vocab_size"] == 154880 else 1
    if gating not in _GATING:
        raise ValueError(f"GGUF deepseek2: expert_gating_func {gating} is not supported "
                         f"(softmax 1, sigmoid 2)")
    rot = get("rope.dimension_count")
    n_group = int(get("expert_group_count") or 1)
    out = {
        # V3's multi-token-prediction blocks follow the decoder's in block_count
        "num_hidden_layers": get("block_count") - int(get("nextn_predict_layers") or 0),
        "kv_lora_rank": get("attention.kv_lora_rank"),
        "q_lora_rank": get("attention.q_lora_rank") or None,
        "qk_rope_head_dim": rot,
        "qk_nope_head_dim": get("attention.key_length_mla", get("attention.key_length")) - rot,
        "v_head_dim": get("attention.value_length_mla", get("attention.value_length")),
        "partial_rotary_factor": None,
        "n_routed_experts": get("expert_count"),
        "n_shared_experts": int(get("expert_shared_count") or 0),
        "first_k_dense_replace": int(get("leading_dense_block_count") or 0),
        "norm_topk_prob": bool(get("expert_weights_norm", False)),
        "routed_scaling_factor": float(get("expert_weights_scale") or 1.0),
        "scoring_func": _GATING[gating],
        "n_group": n_group,
        "topk_group": int(get("expert_group_used_count") or 1),
        "topk_method": "group_limited_greedy" if n_group > 1 else "greedy",
    }
    scaling = cfg.get("rope_scaling")
    if scaling and scaling["rope_type"] != "yarn":
        raise ValueError(f"GGUF deepseek2: rope scaling {scaling['rope_type']!r} is not "
                         f"supported (YaRN only)")
    if scaling:
        # llama.cpp takes mscale to equal mscale_all_dim (M, 10 x yarn_log_multiplier): cos and
        # sin unscaled and the softmax scaled by (0.1 M ln factor + 1)^2. Without the key it
        # scales cos/sin and, again, the softmax by 0.1 ln factor + 1 (M = 1 below).
        m_all = 10 * float(get("rope.scaling.yarn_log_multiplier") or 0.0)
        factor = scaling["factor"]
        out["rope_scaling"] = {
            **scaling, "beta_fast": get("rope.scaling.yarn_beta_fast", 32.0),
            "beta_slow": get("rope.scaling.yarn_beta_slow", 1.0), "mscale_all_dim": m_all or 1.0,
            "attention_factor": 1.0 if m_all or factor <= 1 else 0.1 * math.log(factor) + 1.0}
    return out


def _glm4moe_config(arch: str, get) -> dict[str, Any]:
    """GLM-4.5's MoE keys under Glm4MoeForCausalLM's config names. block_count counts the
    multi-token-prediction (nextn) layers stored after the last one, which llama.cpp loads but
    never runs; leading_dense_block_count and expert_weights_norm default as in llama.cpp, which
    reads no expert groups for glm4moe (GLM-4.5 has one)."""
    gating = get("expert_gating_func", 2)
    if gating != 2:  # llama.h's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, what the converter writes
        raise ValueError(f"GGUF {arch}: expert_gating_func {gating} is not supported (2: sigmoid)")
    return {"num_hidden_layers": get("block_count") - get("nextn_predict_layers", 0),
            "n_shared_experts": get("expert_shared_count", 0),
            "first_k_dense_replace": get("leading_dense_block_count", 0),
            "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
            "norm_topk_prob": bool(get("expert_weights_norm", False)),
            "routed_scaling_factor": get("expert_weights_scale") or 1.0}


def load_gguf(path: str) -> tuple[dict[str, Any], dict[str, Weight]]:
    """(metadata, tensors by GGUF name). Tensor shapes are [rows, cols] (PyTorch order); the
    data are read-only views of the file's mapping."""
    try:
        f = GGUFFile(path)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the GGUF file ({e})") from e
    weights: dict[str, Weight] = {}
    for t in f.tensors:
        dtype = t.ggml_type
        if not is_supported(dtype):
            raise ValueError(
                f"{path}: tensor {t.name!r} has GGUF type {_type_name(dtype)}, which vllmx does "
                f"not support yet"
            )
        shape = tuple(reversed(t.dims)) or (1,)  # ggml lists dims fastest-first
        _, block_size, type_size, quantized, _ = _C.type_info(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        if shape[-1] % block_size:
            raise ValueError(f"{path}: tensor {t.name!r} has rows of {shape[-1]} elements, not a "
                             f"multiple of the {dtype_name(dtype)} block size {block_size}")
        nbytes = n // block_size * type_size
        if quantized:  # rows of blocks
            data = f.view(t.offset, nbytes).reshape(int(np.prod(shape[:-1], dtype=np.int64)), -1)
        else:
            data = f.view(t.offset, nbytes, _DENSE[dtype]).reshape(shape)
        weights[t.name] = Weight(data, dtype, shape)
    return f.metadata, weights


def _type_name(dtype: int) -> str:
    try:
        return GGMLQuantizationType(dtype).name
    except ValueError:
        return f"id {dtype}"


__all__ = ["gguf_to_hf_config", "load_gguf", "dtype_name"]
