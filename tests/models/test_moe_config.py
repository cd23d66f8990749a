"""models/moe.py: which layers are sparse (decoder_sparse_step, mlp_only_layers), the config's
MoE fields under either transformers' name, Mixtral's tensor names, and clear refusals."""

from __future__ import annotations

import pytest

from vllmx.models import moe


def qwen3_moe(**kw) -> dict:
    return {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 6,
            "hidden_size": 64, "intermediate_size": 128, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32, **kw}


def test_sparse_layers_follow_step_and_mlp_only_layers():
    cfg = moe.moe_config(qwen3_moe(decoder_sparse_step=2, mlp_only_layers=[3]))
    assert cfg["sparse_layers"] == [False, True, False, False, False, True]
    assert moe.moe_config(qwen3_moe())["sparse_layers"] == [True] * 6


def test_fields_and_defaults():
    cfg = moe.moe_config(qwen3_moe(num_experts=None, num_local_experts=16, norm_topk_prob=True))
    assert (cfg["num_experts"], cfg["moe_intermediate_size"]) == (16, 32)
    assert cfg["norm_topk_prob"] is True
    assert moe.moe_config(qwen3_moe())["norm_topk_prob"] is False  # transformers' default
    mixtral = moe.moe_config({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 2,
                              "intermediate_size": 96, "num_local_experts": 8,
                              "num_experts_per_tok": 2})
    assert (mixtral["moe_intermediate_size"], mixtral["norm_topk_prob"]) == (96, True)


@pytest.mark.parametrize("bad,match", [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"num_experts_per_tok": 9}, "num_experts = 8 and num_experts_per_tok = 9"),
])
def test_refusals_name_the_feature(bad, match):
    with pytest.raises(ValueError, match=match):
        moe.moe_config(qwen3_moe(**bad))


def test_mixtral_names():
    assert (moe.mixtral_name("model.layers.3.block_sparse_moe.experts.7.w1.weight")
            == "model.layers.3.mlp.experts.7.gate_proj.weight")
    assert (moe.mixtral_name("model.layers.3.block_sparse_moe.experts.7.w3.weight")
            == "model.layers.3.mlp.experts.7.up_proj.weight")
    assert (moe.mixtral_name("model.layers.0.block_sparse_moe.gate.weight")
            == "model.layers.0.mlp.gate.weight")
    assert moe.mixtral_name("model.layers.0.self_attn.q_proj.weight") == \
        "model.layers.0.self_attn.q_proj.weight"


def deepseek(arch="DeepseekV3ForCausalLM", **kw) -> dict:
    return {"architectures": [arch], "num_hidden_layers": 6, "hidden_size": 64,
            "intermediate_size": 128, "n_routed_experts": 16, "num_experts_per_tok": 4,
            "moe_intermediate_size": 32, "n_shared_experts": 2, "first_k_dense_replace": 1,
            "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, **kw}


def test_deepseek_and_glm_fields():
    cfg = moe.moe_config(deepseek(moe_layer_freq=2))
    assert cfg["sparse_layers"] == [False, False, True, False, True, False]
    assert (cfg["num_experts"], cfg["shared_intermediate_size"]) == (16, 64)
    r = cfg["routing"]
    assert (r.scoring_func, r.num_expert_group, r.topk_group, r.routed_scaling_factor) == \
        ("sigmoid", 4, 2, 2.5)
    v2 = moe.moe_config(deepseek("DeepseekV2ForCausalLM", topk_method="greedy"))
    assert (v2["routing"].scoring_func, v2["routing"].num_expert_group) == ("softmax", 1)
    v2 = moe.moe_config(deepseek("DeepseekV2ForCausalLM", topk_method="group_limited_greedy"))
    assert (v2["routing"].num_expert_group, v2["routing"].topk_group) == (4, 2)
    glm = moe.moe_config(deepseek("Glm4MoeForCausalLM", n_group=1, topk_group=1))
    assert glm["routing"].scoring_func == "sigmoid" and glm["sparse_layers"][0] is False
    assert moe.moe_config(qwen3_moe())["routing"] is None


def test_unknown_topk_method_is_named():
    with pytest.raises(ValueError, match="topk_method 'auxfree' is not supported"):
        moe.moe_config(deepseek(topk_method="auxfree"))


def glm4moe_gguf(**kw) -> dict:
    """A glm4moe GGUF's metadata (GLM-4.5-Air's keys, small sizes), with a nextn layer."""
    keys = {"block_count": 4, "nextn_predict_layers": 1, "embedding_length": 64,
            "feed_forward_length": 160, "attention.head_count": 4, "expert_count": 16,
            "expert_used_count": 4, "expert_feed_forward_length": 32, "expert_shared_count": 1,
            "leading_dense_block_count": 1, "expert_gating_func": 2,
            "expert_weights_scale": 2.5, "expert_weights_norm": True, **kw}
    return {"general.architecture": "glm4moe", **{f"glm4moe.{k}": v for k, v in keys.items()}}


def test_glm4moe_gguf_fields():
    from vllmx.loader.gguf import gguf_to_hf_config

    cfg = moe.moe_config(gguf_to_hf_config(glm4moe_gguf()))
    assert cfg["num_hidden_layers"] == 3  # the nextn layer past the last one is not run
    assert cfg["sparse_layers"] == [False, True, True]
    assert (cfg["shared_intermediate_size"], cfg["norm_topk_prob"]) == (32, True)
    r = cfg["routing"]
    assert (r.scoring_func, r.num_expert_group, r.routed_scaling_factor) == ("sigmoid", 1, 2.5)
    # llama.cpp's defaults where a key is absent: no renormalization, no scaling, no dense layer
    bare = {k: v for k, v in glm4moe_gguf().items() if not k.endswith(
        ("expert_weights_norm", "expert_weights_scale", "leading_dense_block_count"))}
    cfg = moe.moe_config(gguf_to_hf_config(bare))
    assert (cfg["norm_topk_prob"], cfg["routing"].routed_scaling_factor) == (False, 1.0)
    assert cfg["sparse_layers"] == [True] * 3
    with pytest.raises(ValueError, match="glm4moe: expert_gating_func 1 is not supported"):
        gguf_to_hf_config(glm4moe_gguf(expert_gating_func=1))
