"""Reading a deepseek2 GGUF's metadata and tensor names (loader/gguf.py, models/deepseek_v2.py):
llama.cpp's keys and defaults as DeepSeek config fields, YaRN's scales as llama.cpp applies
them, and what vllmx cannot run refused by name. The files themselves run against llama.cpp in
tests/models/test_deepseek2_llamacpp.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vllmx.device import F32
from vllmx.loader.gguf import gguf_to_hf_config
from vllmx.models.deepseek_v2 import gguf_weights
from vllmx.ops import Weight


def meta(**kw) -> dict:
    """A V3-shaped file as the converter writes it now (MLA head sizes under *_mla)."""
    keys = {"block_count": 4, "embedding_length": 64, "feed_forward_length": 160,
            "attention.head_count": 4, "attention.head_count_kv": 1, "vocab_size": 512,
            "attention.kv_lora_rank": 32, "attention.q_lora_rank": 48,
            "attention.key_length": 40, "attention.value_length": 32,
            "attention.key_length_mla": 24, "attention.value_length_mla": 24,
            "rope.dimension_count": 8, "expert_count": 16, "expert_used_count": 4,
            "expert_feed_forward_length": 32, "expert_shared_count": 1,
            "leading_dense_block_count": 1, "expert_weights_scale": 2.5,
            "expert_weights_norm": True, "expert_gating_func": 2, "expert_group_count": 4,
            "expert_group_used_count": 2, **kw}
    return {"general.architecture": "deepseek2",
            **{f"deepseek2.{k}": v for k, v in keys.items() if v is not None}}


def test_fields_from_the_keys():
    cfg = gguf_to_hf_config(meta())
    assert (cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]) == (16, 8, 24)
    assert (cfg["kv_lora_rank"], cfg["q_lora_rank"], cfg["num_hidden_layers"]) == (32, 48, 4)
    assert (cfg["n_routed_experts"], cfg["n_shared_experts"], cfg["first_k_dense_replace"]) == \
        (16, 1, 1)
    assert (cfg["scoring_func"], cfg["norm_topk_prob"], cfg["routed_scaling_factor"]) == \
        ("sigmoid", True, 2.5)
    assert (cfg["n_group"], cfg["topk_group"], cfg["topk_method"]) == \
        (4, 2, "group_limited_greedy")
    # older files: per-head lengths, no query latent, and llama.cpp's defaults (softmax, no
    # renormalization, no scaling, no groups); MTP blocks past the decoder's
    old = gguf_to_hf_config(meta(**{
        "attention.key_length": 24, "attention.value_length": 24, "attention.key_length_mla":
        None, "attention.value_length_mla": None, "attention.q_lora_rank": None,
        "expert_weights_scale": None, "expert_weights_norm": None, "expert_gating_func": None,
        "expert_group_count": None, "expert_group_used_count": None,
        "nextn_predict_layers": 1}))
    assert (old["qk_nope_head_dim"], old["v_head_dim"], old["q_lora_rank"]) == (16, 24, None)
    assert (old["scoring_func"], old["norm_topk_prob"], old["routed_scaling_factor"]) == \
        ("softmax", False, 1.0)
    assert (old["n_group"], old["topk_method"], old["num_hidden_layers"]) == (1, "greedy", 3)


@pytest.mark.parametrize("log_mul,rope_scale,softmax_m", [
    (0.1 * 0.707, 1.0, 0.707),  # mscale_all_dim 0.707 (V2-Lite's): cos/sin as they are
    (None, 0.1 * math.log(40) + 1, 1.0),  # no key: llama.cpp scales both by 0.1 ln f + 1
])
def test_yarn_scales_as_llamacpp_applies_them(log_mul, rope_scale, softmax_m):
    from vllmx.models.deepseek_v2 import _softmax_scale

    cfg = gguf_to_hf_config(meta(**{
        "rope.scaling.type": "yarn", "rope.scaling.factor": 40.0,
        "rope.scaling.original_context_length": 4096,
        "rope.scaling.yarn_log_multiplier": log_mul}))
    scaling = cfg["rope_scaling"]
    assert scaling["attention_factor"] == pytest.approx(rope_scale)
    assert (scaling["beta_fast"], scaling["beta_slow"]) == (32.0, 1.0)
    m = 0.1 * softmax_m * math.log(40) + 1
    assert _softmax_scale(cfg) == pytest.approx(m * m / math.sqrt(24))


@pytest.mark.parametrize("key,value,match", [
    ("expert_gating_func", 3, "expert_gating_func 3 is not supported"),
    ("rope.scaling.type", "linear", "rope scaling 'linear' is not supported"),
    ("attention.temperature_scale", 0.1, "attention.temperature_scale is not supported"),
])
def test_refusals_name_the_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        gguf_to_hf_config(meta(**{key: value}))


def test_tensor_names():
    cfg = {"num_hidden_layers": 2, "n_group": 4, "num_experts": 16, "first_k_dense_replace": 1}
    w = Weight(np.zeros(4, np.float32), F32, (4,))
    names = ["blk.0.attn_k_b.weight", "blk.1.exp_probs_b.bias", "blk.1.ffn_up_shexp.weight",
             "blk.2.nextn.eh_proj.weight"]  # the MTP block is left out
    out = gguf_weights(cfg, dict.fromkeys(names, w))
    assert set(out) == {"model.layers.0.self_attn.k_b_proj.weight",
                        "model.layers.1.mlp.gate.e_score_correction_bias",
                        "model.layers.1.mlp.shared_experts.up_proj.weight"}
    # grouped layers without a choice bias get a zero one (llama.cpp's group scores)
    zero = gguf_weights(cfg, {})["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert zero.shape == (16,) and not np.asarray(zero.data).any()
    for name in ("blk.1.ffn_gate_up_exps.weight", "rope_freqs.weight"):
        with pytest.raises(ValueError, match=f"tensor '{name}' is not supported"):
            gguf_weights(cfg, {name: w})
