"""Token parity of Gemma 3 text models against transformers (float32 on the CPU), for tiny
random checkpoints in f32 and bf16 safetensors and as F32 GGUF laid out as llama.cpp's
converter does (norm weights stored as 1 + w, Q/K not permuted, no layer pattern key)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.models.parity import (
    assert_prompt_logits_match,
    check_positions,
    log_softmax,
    vllmx_prompt_logits,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, WINDOW = 512, 16
NUM_PROMPTS, MAX_TOKENS, DELTA = 8, 32, 0.01
# Prompts the tests do not choose: a fresh seed per run, printed on failure.
SEED = int.from_bytes(os.urandom(4), "little")
S, F = "sliding_attention", "full_attention"


def gemma3_config(variant: str):
    common = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 160,
              "num_attention_heads": 4, "head_dim": 32, "max_position_embeddings": 512,
              "sliding_window": WINDOW, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    if variant == "mixed":  # explicit layer_types, a query_pre_attn_scalar apart from head_dim
        return transformers.Gemma3TextConfig(
            **common, num_hidden_layers=4, num_key_value_heads=2, layer_types=[S, F, S, F],
            query_pre_attn_scalar=24, final_logit_softcapping=3.0,
            rope_parameters={F: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                             S: {"rope_type": "default", "rope_theta": 1e4}})
    # What llama.cpp can express: every 6th layer global, local rope base 10000, scale
    # head_dim**-0.5, no attention soft cap.
    return transformers.Gemma3TextConfig(
        **common, num_hidden_layers=6, num_key_value_heads=1, query_pre_attn_scalar=32,
        final_logit_softcapping=3.0,
        rope_parameters={F: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         S: {"rope_type": "default", "rope_theta": 1e4}})


def make_checkpoint(variant: str, dtype: str, out_dir: str) -> str:
    path = os.path.join(out_dir, f"gemma3-{variant}-{dtype}")
    if os.path.exists(path):
        return path
    cfg = gemma3_config(variant)
    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:  # random init leaves near-uniform logits; widen them a little
                p.mul_(4.0)
            else:  # Gemma norms start at w = 0 (scale 1 + w); make the +1 matter
                p.normal_(0.0, 0.3)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(path)
    return path


def write_gemma3_gguf(hf_dir: str, out_path: str) -> str:
    """An F32 GGUF as llama.cpp's convert_hf_to_gguf writes Gemma 3 (no tokenizer)."""
    import gguf
    from safetensors.numpy import load_file

    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    rope = cfg["rope_parameters"]
    sd = load_file(os.path.join(hf_dir, "model.safetensors"))
    w = gguf.GGUFWriter(out_path, "gemma3")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(rope[F]["rope_theta"])
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(rope[F]["factor"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    w.add_vocab_size(cfg["vocab_size"])
    per_layer = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
        "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }
    for name, t in sd.items():
        t = np.ascontiguousarray(t.astype(np.float32))
        if name.endswith("norm.weight"):
            t = t + np.float32(1.0)  # llama.cpp stores Gemma norms as 1 + w
        if name.startswith("model.layers."):
            parts = name.split(".")
            gname = f"blk.{parts[2]}.{per_layer['.'.join(parts[3:-1])]}.{parts[-1]}"
        else:
            gname = {"model.embed_tokens.weight": "token_embd.weight",
                     "model.norm.weight": "output_norm.weight"}[name]
        w.add_tensor(gname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny-gemma3"))


def random_prompts(rng) -> list[list[int]]:
    lens = rng.integers(3, 40, size=NUM_PROMPTS)
    lens[0] = 70  # several windows long before generation starts
    return [rng.integers(3, VOCAB, size=n).tolist() for n in lens]


def run_parity(model_path: str, hf_path: str):
    from vllmx import LLM, SamplingParams

    prompts = random_prompts(np.random.default_rng(SEED))
    llm = LLM(model_path, skip_tokenizer_init=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    oracle = transformers.AutoModelForCausalLM.from_pretrained(hf_path, dtype=torch.float32).eval()
    for prompt, out in zip(prompts, outs):
        toks = out.outputs[0].token_ids
        assert len(toks) == MAX_TOKENS
        with torch.no_grad():
            logits = oracle(torch.tensor([prompt + toks])).logits[0].double().numpy()
        report = check_positions(log_softmax(logits)[len(prompt) - 1: -1], toks, DELTA)
        assert report.failed == 0, f"{model_path} (seed {SEED}, prompt len {len(prompt)}): {report}"
    return llm, prompts, oracle


@pytest.mark.parametrize("variant", ["mixed", "pattern6"])
def test_parity_f32(variant, ckpt_dir):
    path = make_checkpoint(variant, "float32", ckpt_dir)
    llm, prompts, oracle = run_parity(path, path)
    assert_prompt_logits_match(llm, prompts, oracle, f"gemma3-{variant} f32", SEED)


def test_parity_bf16(ckpt_dir):
    path = make_checkpoint("mixed", "bfloat16", ckpt_dir)
    run_parity(path, path)  # oracle: the same bf16 weights, upcast to f32


def test_parity_gguf_f32(ckpt_dir):
    path = make_checkpoint("pattern6", "float32", ckpt_dir)
    gguf_path = write_gemma3_gguf(path, os.path.join(ckpt_dir, "gemma3.gguf"))
    llm, _, _ = run_parity(gguf_path, path)
    model = llm.llm_engine.model
    windows = [layer.attn.sliding_window for layer in model.layers]
    assert windows == [WINDOW] * 5 + [0]  # llama.cpp's fixed gemma3 pattern


def test_sliding_window_matters(ckpt_dir):
    """The window and the per-type rope are load-bearing: dropping the window changes the
    logits of a prompt longer than it (so the parity tests above do test it)."""
    from vllmx import LLM

    path = make_checkpoint("mixed", "float32", ckpt_dir)
    llm = LLM(path, skip_tokenizer_init=True)
    prompt = np.random.default_rng(SEED).integers(3, VOCAB, size=3 * WINDOW).tolist()
    base = vllmx_prompt_logits(llm, prompt)
    for layer in llm.llm_engine.model.layers:
        layer.attn.sliding_window = 0
    unwindowed = vllmx_prompt_logits(llm, prompt)
    assert np.abs(base[:WINDOW] - unwindowed[:WINDOW]).max() < 1e-5  # within the window: same
    assert np.abs(base[WINDOW:] - unwindowed[WINDOW:]).max() > 1e-2
