"""models/granitemoe.py: GraniteMoe's router is topk_softmax with renormalization, each of
Granite's multipliers and the shared MLP move the logits (so the parity tests in
test_llama_family_parity.py test them), the checkpoint names and config fields, and clear
errors for what is missing or unsupported."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.models.parity import vllmx_prompt_logits
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint
from vllmx import ops
from vllmx.models import granitemoe

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SEED = int.from_bytes(os.urandom(4), "little")


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("granite-moe"))


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_router_is_topk_softmax_renormalized(k):
    """transformers' GraniteMoeTopKRouter (top k of the logits, then a softmax over them) picks
    the experts topk_softmax picks, with the weights it gives when renormalizing."""
    logits = np.random.default_rng(SEED).normal(0, 3, (64, 8)).astype(np.float32)
    top, ids = torch.tensor(logits).topk(k, dim=-1)
    want = torch.softmax(top, dim=-1).numpy()
    weights, got_ids = ops.topk_softmax(logits, k, True)
    assert np.array_equal(got_ids, ids.numpy()), f"seed {SEED}"
    np.testing.assert_allclose(weights, want, rtol=1e-6, atol=1e-7)


def _neutral(model, feature: str) -> None:
    """Sets one of Granite's multipliers to its neutral value, or drops the shared MLP."""
    for layer in model.layers:
        if feature == "residual_multiplier":
            layer.residual_multiplier = 1.0
        elif feature == "attention_multiplier":
            layer.attn.scale = layer.head_dim ** -0.5
        elif feature == "shared_mlp":
            layer.experts.shared_experts = None
    if feature == "embedding_multiplier":
        model.embedding_multiplier = 1.0
    elif feature == "logits_scaling":
        model.logits_scaling = 1.0


@pytest.mark.parametrize("family,feature", [
    ("granite_moe", "embedding_multiplier"), ("granite_moe", "attention_multiplier"),
    ("granite_moe", "residual_multiplier"), ("granite_moe", "logits_scaling"),
    ("granite_moe_shared", "shared_mlp")])
def test_features_matter(family, feature, ckpt_dir):
    from vllmx import LLM

    llm = LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True)
    prompt = np.random.default_rng(SEED).integers(3, VOCAB, size=30).tolist()
    base = vllmx_prompt_logits(llm, prompt)
    _neutral(llm.llm_engine.model, feature)
    moved = vllmx_prompt_logits(llm, prompt)
    assert np.abs(moved - base).max() / np.abs(base).max() > 1e-2, feature


def test_checkpoint_names():
    name = granitemoe.granite_moe_name
    assert (name("model.layers.3.block_sparse_moe.router.layer.weight")
            == "model.layers.3.mlp.gate.weight")
    assert (name("model.layers.3.block_sparse_moe.input_linear.weight")
            == "model.layers.3.mlp.experts.gate_up_proj.weight")
    assert (name("model.layers.0.block_sparse_moe.output_linear.weight")
            == "model.layers.0.mlp.experts.down_proj.weight")
    assert (name("model.layers.0.shared_mlp.input_linear.weight")
            == "model.layers.0.shared_mlp.gate_up_proj.weight")
    assert name("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn.q_proj.weight"


def granite_moe(**kw) -> dict:
    return {"architectures": ["GraniteMoeForCausalLM"], "num_hidden_layers": 3,
            "hidden_size": 64, "intermediate_size": 32, "num_local_experts": 8,
            "num_experts_per_tok": 2, **kw}


def test_config_fields():
    cfg = granitemoe.granite_moe_config(granite_moe())
    assert (cfg["num_experts"], cfg["moe_intermediate_size"]) == (8, 32)
    assert cfg["norm_topk_prob"] is True and cfg["sparse_layers"] == [True] * 3
    assert cfg["shared_intermediate_size"] == 0
    shared = granite_moe(architectures=["GraniteMoeSharedForCausalLM"],
                         shared_intermediate_size=48)
    assert granitemoe.granite_moe_config(shared)["shared_intermediate_size"] == 48
    assert granitemoe.is_granite_moe({"gguf_architecture": "granitemoe"})
    assert not granitemoe.is_granite_moe({"architectures": ["GraniteForCausalLM"]})


def test_refusals(ckpt_dir, tmp_path):
    from safetensors.numpy import load_file, save_file

    from vllmx import LLM

    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        granitemoe.granite_moe_config(granite_moe(hidden_act="gelu"))
    # A GraniteMoeShared checkpoint without a layer's shared MLP names what it lacks.
    src = make_checkpoint("granite_moe_shared", "float32", ckpt_dir)
    broken = tmp_path / "no-shared-mlp"
    broken.mkdir()
    os.symlink(os.path.join(src, "config.json"), broken / "config.json")
    sd = load_file(os.path.join(src, "model.safetensors"))
    del sd["model.layers.1.shared_mlp.output_linear.weight"]
    save_file(sd, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="missing 1 tensors.*layers.1.shared_mlp.down_proj"):
        LLM(str(broken), skip_tokenizer_init=True)
