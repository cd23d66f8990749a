"""Token parity of the post-norm decoders (OLMo 2, OLMo 3, EXAONE 4) against transformers (float32
on the CPU), for tiny random checkpoints in f32 and bf16 safetensors (tests/models/
tiny_checkpoints.py); what sets them apart from Llama (OLMo's q/k norm over the whole projection
width, OLMo 3's windows and full-layer-only rope scaling, EXAONE 4's rope-less full layers) is
checked to move the logits, so that the parity tests test it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.parity import assert_prompt_logits_match, vllmx_prompt_logits
from tests.models.test_llama_family_parity import BF16_WEIGHTS_KV, SEED, random_prompts, run_parity
from tests.models.tiny_checkpoints import make_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# olmo2_bias: attention biases (llama.cpp's olmo2 has none, so the GGUF tests leave them out)
FAMILIES = ["olmo2", "olmo2_bias", "olmo3", "exaone4"]


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny-olmo"))


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_f32(family, ckpt_dir):
    path = make_checkpoint(family, "float32", ckpt_dir)
    llm, prompts, oracle = run_parity(path, path)
    assert_prompt_logits_match(llm, prompts, oracle, family, SEED)
    windows = [layer.attn.sliding_window for layer in llm.llm_engine.model.layers]
    assert windows == ([24, 24, 24, 0] if family in ("olmo3", "exaone4") else [0, 0])


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_bf16(family, ckpt_dir):
    path = make_checkpoint(family, "bfloat16", ckpt_dir)
    run_parity(path, path, BF16_WEIGHTS_KV)  # oracle: the same bf16 weights, upcast to f32


class PerHeadNorm:
    """The same weight applied per head instead of over the whole width (numpy, host only)."""

    def __init__(self, norm, head_dim: int):
        self.w, self.eps, self.d = np.asarray(norm.weight), norm.eps, head_dim

    def __call__(self, x):
        h = x.reshape(x.shape[0], -1, self.d).astype(np.float64)
        h = h / np.sqrt((h * h).mean(-1, keepdims=True) + self.eps)
        return np.ascontiguousarray((h.reshape(x.shape) * self.w).astype(np.float32))


@pytest.mark.parametrize("family,feature", [("olmo2", "qk_norm_per_head"),
                                            ("olmo3", "window"), ("olmo3", "full_rope"),
                                            ("exaone4", "window"), ("exaone4", "full_rope")])
def test_each_feature_matters(family, feature, ckpt_dir):
    from vllmx import LLM

    llm = LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True)
    model = llm.llm_engine.model
    prompt = random_prompts(np.random.default_rng(SEED))[0]  # 70 tokens: past the window
    base = vllmx_prompt_logits(llm, prompt)
    for layer in model.layers:
        if feature == "qk_norm_per_head":
            layer.q_norm = PerHeadNorm(layer.q_norm, layer.head_dim)
            layer.k_norm = PerHeadNorm(layer.k_norm, layer.head_dim)
        elif feature == "window":
            layer.attn.sliding_window = 0
        elif family == "olmo3":  # the full layer's scaled rope on every layer
            layer.rope = model.layers[-1].rope
        else:  # EXAONE 4: the sliding layers' rope on the NoPE full layer too
            layer.rope = model.layers[0].rope
    moved = vllmx_prompt_logits(llm, prompt)
    assert np.abs(moved - base).max() / np.abs(base).max() > 1e-2, feature


def test_unsupported_config_names_it(ckpt_dir, tmp_path):
    import json
    import os
    import shutil

    from vllmx import LLM

    path = str(tmp_path / "gelu")
    shutil.copytree(make_checkpoint("olmo2", "float32", ckpt_dir), path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["hidden_act"] = "gelu"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        LLM(path, skip_tokenizer_init=True)


def test_olmo3_older_config_scales_full_layers_only(ckpt_dir, tmp_path):
    """An OLMo 3 config.json as transformers 4 wrote it (rope_theta and rope_scaling at the top,
    no per-type rope_parameters) gives the same logits: the scaling stays on the full layers."""
    import json
    import os
    import shutil

    from vllmx import LLM

    path = make_checkpoint("olmo3", "float32", ckpt_dir)
    old = str(tmp_path / "olmo3-old-config")
    shutil.copytree(path, old)
    with open(os.path.join(old, "config.json")) as f:
        cfg = json.load(f)
    full = dict(cfg.pop("rope_parameters")["full_attention"])
    cfg["rope_theta"] = full.pop("rope_theta")
    cfg["rope_scaling"] = full
    with open(os.path.join(old, "config.json"), "w") as f:
        json.dump(cfg, f)
    prompt = random_prompts(np.random.default_rng(SEED))[0]
    a, b = (vllmx_prompt_logits(LLM(p, skip_tokenizer_init=True), prompt) for p in (path, old))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("pattern", [4, "LLLG"])
def test_exaone4_pattern_without_layer_types(pattern, ckpt_dir, tmp_path):
    """A config.json with sliding_window_pattern (a period or an L/G string) and no layer_types
    slides the same layers."""
    import json
    import os
    import shutil

    from vllmx import LLM

    path = str(tmp_path / "exaone4-pattern")
    shutil.copytree(make_checkpoint("exaone4", "float32", ckpt_dir), path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    del cfg["layer_types"]
    cfg["sliding_window_pattern"] = pattern
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    model = LLM(path, skip_tokenizer_init=True).llm_engine.model
    assert [layer.attn.sliding_window for layer in model.layers] == [24, 24, 24, 0]
