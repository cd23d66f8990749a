"""Token parity of Gemma 2 against transformers (float32 on the CPU), for tiny random checkpoints
in f32 and bf16 safetensors and as an F32 GGUF laid out as llama.cpp's converter does; each of
Gemma 2's own features (attention and final logit soft-capping, query_pre_attn_scalar, the
alternating sliding layers) is checked to move the logits, so that the parity tests test it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.models.parity import assert_prompt_logits_match, vllmx_prompt_logits
from tests.models.test_gemma3_parity import SEED as PROMPT_SEED  # run_parity's prompts
from tests.models.test_gemma3_parity import random_prompts, run_parity

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, WINDOW = 512, 16
SEED = int.from_bytes(os.urandom(4), "little")
S, F = "sliding_attention", "full_attention"


def gemma2_config(variant: str):
    common = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 160,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "max_position_embeddings": 512, "sliding_window": WINDOW,
              "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
              # caps small enough to bind on a tiny random model (Gemma 2's are 50 and 30)
              "attn_logit_softcapping": 1.5, "final_logit_softcapping": 3.0}
    if variant == "mixed":  # explicit layer_types, a query_pre_attn_scalar apart from head_dim
        return transformers.Gemma2Config(**common, layer_types=[F, S, S, F],
                                         query_pre_attn_scalar=24,
                                         rope_parameters={"rope_type": "default",
                                                          "rope_theta": 5e4})
    # What llama.cpp can express: every other layer sliding, scale head_dim**-0.5.
    return transformers.Gemma2Config(**common, query_pre_attn_scalar=32)


def make_checkpoint(variant: str, dtype: str, out_dir: str) -> str:
    path = os.path.join(out_dir, f"gemma2-{variant}-{dtype}")
    if os.path.exists(path):
        return path
    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(gemma2_config(variant)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:  # random init leaves near-uniform logits; widen them a little
                p.mul_(4.0)
            else:  # Gemma norms start at w = 0 (scale 1 + w); make the +1 matter
                p.normal_(0.0, 0.3)
    model.to(getattr(torch, dtype)).save_pretrained(path)
    return path


GGUF_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def write_gemma2_gguf(hf_dir: str, out_path: str, qtype=None) -> str:
    """A GGUF as llama.cpp's convert_hf_to_gguf writes Gemma 2 (norms stored as 1 + w, Q/K not
    permuted, no layer pattern key), matrices in F32 or `qtype` (gguf's quantizer); token ids
    only (no vocab)."""
    import gguf
    from safetensors.numpy import load_file

    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    w = gguf.GGUFWriter(out_path, "gemma2")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("no_vocab")
    for name, t in load_file(os.path.join(hf_dir, "model.safetensors")).items():
        t = np.ascontiguousarray(t.astype(np.float32))
        if name.endswith("norm.weight"):
            t = t + np.float32(1.0)
        if name.startswith("model.layers."):
            parts = name.split(".")
            gname = f"blk.{parts[2]}.{GGUF_NAMES['.'.join(parts[3:-1])]}.{parts[-1]}"
        else:
            gname = {"model.embed_tokens.weight": "token_embd.weight",
                     "model.norm.weight": "output_norm.weight"}[name]
        if qtype is not None and t.ndim == 2:
            w.add_tensor(gname, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny-gemma2"))


@pytest.mark.parametrize("variant", ["mixed", "pattern2"])
def test_parity_f32(variant, ckpt_dir):
    path = make_checkpoint(variant, "float32", ckpt_dir)
    llm, prompts, oracle = run_parity(path, path)
    assert_prompt_logits_match(llm, prompts, oracle, f"gemma2-{variant} f32", PROMPT_SEED)
    windows = [layer.attn.sliding_window for layer in llm.llm_engine.model.layers]
    assert windows == ([0, WINDOW, WINDOW, 0] if variant == "mixed" else [WINDOW, 0] * 2)


def test_parity_bf16(ckpt_dir):
    path = make_checkpoint("mixed", "bfloat16", ckpt_dir)
    run_parity(path, path)  # oracle: the same bf16 weights, upcast to f32


def test_parity_gguf_f32(ckpt_dir):
    path = make_checkpoint("pattern2", "float32", ckpt_dir)
    gguf_path = write_gemma2_gguf(path, os.path.join(ckpt_dir, "gemma2.gguf"))
    llm, _, _ = run_parity(gguf_path, path)
    model = llm.llm_engine.model
    assert [layer.attn.sliding_window for layer in model.layers] == [WINDOW, 0] * 2
    assert [layer.attn.logits_soft_cap for layer in model.layers] == [1.5] * 4
    assert model.final_logit_softcapping == 3.0


def _rel_change(llm, prompt, change) -> float:
    base = vllmx_prompt_logits(llm, prompt)
    change(llm.llm_engine.model)
    moved = vllmx_prompt_logits(llm, prompt)
    return float(np.abs(moved - base).max() / np.abs(base).max())


@pytest.mark.parametrize("feature", ["attn_softcap", "final_softcap", "scale", "window"])
def test_each_feature_matters(feature, ckpt_dir):
    from vllmx import LLM

    def change(model):
        for layer in model.layers:
            if feature == "attn_softcap":
                layer.attn.logits_soft_cap = 0.0
            elif feature == "scale":
                layer.attn.scale = layer.head_dim ** -0.5
            elif feature == "window":
                layer.attn.sliding_window = 0
        if feature == "final_softcap":
            model.final_logit_softcapping = 0.0

    llm = LLM(make_checkpoint("mixed", "float32", ckpt_dir), skip_tokenizer_init=True)
    prompt = random_prompts(np.random.default_rng(SEED))[0]  # 70 tokens: past the window
    assert _rel_change(llm, prompt, change) > 1e-2, feature


def test_unsupported_config_names_it(ckpt_dir, tmp_path):
    import shutil

    from vllmx import LLM

    path = str(tmp_path / "bidirectional")
    shutil.copytree(make_checkpoint("pattern2", "float32", ckpt_dir), path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["use_bidirectional_attention"] = True
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        LLM(path, skip_tokenizer_init=True)
