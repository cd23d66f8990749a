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
    ({"shared_expert_intermediate_size": 64}, "shared experts are not supported"),
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
