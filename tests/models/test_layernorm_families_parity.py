"""Token parity of the LayerNorm families (GPT-NeoX, StableLM, Starcoder2, GPT-2, Cohere, Cohere 2,
Falcon) against transformers (float32 on the CPU), for tiny random checkpoints in f32 and bf16
safetensors (tests/models/tiny_checkpoints.py; their norm weights and biases random too); what
sets each apart (parallel residual, the norms' biases, per-head q/k LayerNorms, the window,
position embeddings, the layer-scaled attention, interleaved rope, the logit scale, Cohere 2's
NoPE full layers, Falcon's two norms, grouped query_key_value and sequential layers) is checked
to move the logits, so that the parity tests test it."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tests.models.parity import assert_prompt_logits_match, vllmx_prompt_logits
from tests.models.test_llama_family_parity import (
    BF16_WEIGHTS_KV,
    SEED,
    random_prompts,
    run_parity,
)
from tests.models.tiny_checkpoints import make_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FAMILIES = ["gpt_neox", "gpt_neox_seq", "stablelm", "stablelm_parallel", "starcoder2", "gpt2",
            "gpt2_scaled", "cohere", "cohere_bias", "cohere2", "falcon", "falcon_one_norm",
            "falcon_mq", "falcon_seq"]
# Sliding windows per layer where a family has them (cohere2: sliding, then full).
WINDOWS = {"starcoder2": [24, 24], "cohere2": [24, 0]}


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny-layernorm"))


def layers(model) -> list:
    return model.h if hasattr(model, "h") else model.layers  # GPT-2's blocks are h


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_f32(family, ckpt_dir):
    path = make_checkpoint(family, "float32", ckpt_dir)
    llm, prompts, oracle = run_parity(path, path)
    assert_prompt_logits_match(llm, prompts, oracle, family, SEED)
    windows = [layer.attn.sliding_window for layer in layers(llm.llm_engine.model)]
    assert windows == WINDOWS.get(family, [0, 0])


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_bf16(family, ckpt_dir):
    path = make_checkpoint(family, "bfloat16", ckpt_dir)
    run_parity(path, path, BF16_WEIGHTS_KV)  # oracle: the same bf16 weights, upcast to f32


def _perturb(model, family: str, feature: str) -> None:
    """Turns one feature off in a loaded model (host arrays: CPU only)."""
    from vllmx.ops import Weight

    for layer in layers(model):
        if feature == "parallel_residual":
            layer.use_parallel_residual = False
        elif feature == "norm_bias":
            layer.input_layernorm.bias = layer.post_attention_layernorm.bias = None
        elif feature == "qk_layernorm" and family == "stablelm":
            layer.q_layernorm = layer.k_layernorm = None
        elif feature == "qk_layernorm":
            layer.q_norm = layer.k_norm = None
        elif feature == "per_head_weights":  # every head the first head's weight
            for norm in ((layer.q_layernorm, layer.k_layernorm) if family == "stablelm"
                         else (layer.q_norm, layer.k_norm)):
                norm.weight = np.ascontiguousarray(np.broadcast_to(norm.weight[0],
                                                                   norm.weight.shape))
        elif feature == "window":
            layer.attn.sliding_window = 0
        elif feature == "layer_scaled_attention":
            layer.attn.scale = layer.attn.head_size ** -0.5
        elif feature == "nope_full_layers":  # every layer rotated, as Command R's
            layer.rope = model.rope
        elif feature == "two_norms":  # the MLP reads ln_attn's output, as Falcon-7B's
            layer.mlp_norm = None
        elif feature == "sequential":  # attention and MLP in parallel, each its own norm
            layer.parallel = True
    if feature == "norm_bias":
        model.final_layer_norm.bias = None
    elif feature == "position_embeddings":
        model.wpe = Weight.from_numpy(np.zeros(model.wpe.shape, np.float32))
    elif feature == "interleaved_rope":
        model.rope.is_neox_style = True  # the layers share the model's rope
    elif feature == "logit_scale":
        model.logit_scale = 1.0


@pytest.mark.parametrize("family,feature", [
    ("gpt_neox", "parallel_residual"), ("gpt_neox", "norm_bias"), ("stablelm", "qk_layernorm"),
    ("stablelm", "per_head_weights"), ("starcoder2", "window"),
    ("gpt2", "position_embeddings"), ("gpt2_scaled", "layer_scaled_attention"),
    ("cohere", "qk_layernorm"), ("cohere", "per_head_weights"), ("cohere", "interleaved_rope"),
    ("cohere", "logit_scale"), ("cohere2", "window"), ("cohere2", "nope_full_layers"),
    ("cohere2", "logit_scale"), ("falcon", "two_norms"), ("falcon_seq", "sequential")])
def test_each_feature_matters(family, feature, ckpt_dir):
    from vllmx import LLM

    llm = LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True)
    prompt = random_prompts(np.random.default_rng(SEED))[0]  # 70 tokens: past the window
    base = vllmx_prompt_logits(llm, prompt)
    _perturb(llm.llm_engine.model, family, feature)
    moved = vllmx_prompt_logits(llm, prompt)
    assert np.abs(moved - base).max() / np.abs(base).max() > 1e-2, feature


def _edited_config(ckpt_dir: str, tmp_path, family: str, **changes) -> str:
    path = str(tmp_path / f"{family}-edited")
    shutil.copytree(make_checkpoint(family, "float32", ckpt_dir), path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(changes)
    for key in [k for k, v in changes.items() if v is None]:  # None: the key left out
        del cfg[key]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


@pytest.mark.parametrize("family,changes,match", [
    ("gpt_neox", {"hidden_act": "relu"}, "GPT-NeoX with hidden_act 'relu'"),
    ("stablelm", {"hidden_act": "gelu"}, "StableLM with hidden_act 'gelu'"),
    ("starcoder2", {"hidden_act": "relu"}, "Starcoder2 with hidden_act 'relu'"),
    ("gpt2", {"add_cross_attention": True}, "GPT-2 with add_cross_attention"),
    ("cohere", {"hidden_act": "gelu"}, "Cohere with hidden_act 'gelu'"),
    ("falcon", {"activation": "relu"}, "Falcon with activation 'relu'"),
    ("falcon_mq", {"alibi": True}, "Falcon with alibi=True")])
def test_unsupported_config_names_it(family, changes, match, ckpt_dir, tmp_path):
    from vllmx import LLM

    with pytest.raises(ValueError, match=match):
        LLM(_edited_config(ckpt_dir, tmp_path, family, **changes), skip_tokenizer_init=True)


def test_gpt2_checkpoint_names_and_context(ckpt_dir, tmp_path):
    """A GPT-2 checkpoint saved from GPT2Model (openai-community/gpt2: no "transformer." prefix)
    gives the same logits; the context is n_positions (wpe's rows), GPT-2's name for it."""
    from safetensors.numpy import load_file, save_file

    from vllmx import LLM

    path = make_checkpoint("gpt2", "float32", ckpt_dir)
    bare = str(tmp_path / "gpt2-bare-names")
    shutil.copytree(path, bare)
    sd = load_file(os.path.join(path, "model.safetensors"))
    save_file({k.removeprefix("transformer."): v for k, v in sd.items()},
              os.path.join(bare, "model.safetensors"), metadata={"format": "pt"})
    prompt = random_prompts(np.random.default_rng(SEED))[1]
    llms = [LLM(p, skip_tokenizer_init=True) for p in (path, bare)]
    a, b = (vllmx_prompt_logits(llm, prompt) for llm in llms)
    assert np.array_equal(a, b)
    assert llms[0].llm_engine.config.model_config.max_model_len == 512
    with pytest.raises(ValueError, match="n_positions=512"):
        LLM(path, skip_tokenizer_init=True, max_model_len=600)


def test_cohere2_sliding_window_pattern(ckpt_dir, tmp_path):
    """An older Cohere 2 config.json (sliding_window_pattern, no layer_types) gives the same
    layers; without either, every 4th layer is full (here: none of 2)."""
    from vllmx import LLM

    prompt = random_prompts(np.random.default_rng(SEED))[0]
    runs = {}
    for name, changes in (("layer_types", {}),
                          ("pattern", {"layer_types": None, "sliding_window_pattern": 2}),
                          ("default", {"layer_types": None})):
        llm = LLM(_edited_config(ckpt_dir, tmp_path / name, "cohere2", **changes),
                  skip_tokenizer_init=True)
        windows = [layer.attn.sliding_window for layer in llm.llm_engine.model.layers]
        runs[name] = windows, vllmx_prompt_logits(llm, prompt)
    assert runs["layer_types"][0] == runs["pattern"][0] == [24, 0]
    assert np.array_equal(runs["layer_types"][1], runs["pattern"][1])
    assert runs["default"][0] == [24, 24]


def test_falcon_query_key_value_layouts(ckpt_dir, monkeypatch):
    """query_key_value's kv groups: read as if already [q heads; k heads; v heads], Falcon-40B's
    (2 groups of [2 q; k; v]) moves the logits; Falcon-7B's multi-query layout is that already
    (one group: [4 q; k; v]), and its KV cache holds one head though config.json says
    num_kv_heads 4 (transformers ignores it without new_decoder_architecture)."""
    from vllmx import LLM
    from vllmx.models import falcon

    prompt = random_prompts(np.random.default_rng(SEED))[0]
    for family, moves in (("falcon", True), ("falcon_mq", False)):
        path = make_checkpoint(family, "float32", ckpt_dir)
        base = vllmx_prompt_logits(LLM(path, skip_tokenizer_init=True), prompt)
        with monkeypatch.context() as m:
            m.setattr(falcon, "qkv_by_group", lambda w, b, *_: (w, b))
            llm = LLM(path, skip_tokenizer_init=True)
            ungrouped = vllmx_prompt_logits(llm, prompt)
        moved = np.abs(ungrouped - base).max() / np.abs(base).max()
        assert (moved > 1e-2) if moves else moved == 0, (family, moved)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["num_kv_heads"] == 4
    assert llm.llm_engine.kv_caches[0][0].shape[2] == 1
