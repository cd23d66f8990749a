"""Tiny EAGLE-1 and EAGLE-3 draft checkpoints (safetensors + config.json, the layouts vLLM reads)
for the tiny Llama target: random heads, and an "aligned" EAGLE-1 head over a target whose
attention and MLP outputs are scaled down (its residual stream stays close to the current
token's embedding, so its next token is nearly a function of the current one): the head's fc
passes the next token's embedding through (times the target's final norm weight) and its layer
adds little, so lm_head over its output proposes what the target would sample after that
token, more often than not."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

HIDDEN, INTER, HEADS, KV_HEADS = 64, 160, 4, 2
HEAD_DIM = HIDDEN // HEADS
TARGET_LAYERS = 4
AUX_LAYERS = [0, 1, 3]  # the tests' eagle_aux_hidden_state_layer_ids (vLLM's default needs 6+)
DRAFT_VOCAB = 256
SCALE = 0.02  # the aligned target's branch outputs (its embeddings' entries are ~0.08)


def _dense(rng, rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)


def _layer(rng, prefix: str, qkv_in: int, damp: float = 1.0) -> dict[str, np.ndarray]:
    """A Llama decoder layer's tensors (no input_layernorm: the callers decide). Its branches
    add about their input's size: a chained draft's un-normed stream grows layer by layer, and
    much faster growth would leave float32's logits too far from float64's to compare."""
    p = prefix
    return {p + "self_attn.q_proj.weight": _dense(rng, HEADS * HEAD_DIM, qkv_in, 2.0),
            p + "self_attn.k_proj.weight": _dense(rng, KV_HEADS * HEAD_DIM, qkv_in, 2.0),
            p + "self_attn.v_proj.weight": _dense(rng, KV_HEADS * HEAD_DIM, qkv_in),
            p + "self_attn.o_proj.weight": _dense(rng, HIDDEN, HEADS * HEAD_DIM, damp),
            p + "post_attention_layernorm.weight": rng.normal(1, 0.3, HIDDEN).astype(np.float32),
            p + "mlp.gate_proj.weight": _dense(rng, INTER, HIDDEN, 2.0),
            p + "mlp.up_proj.weight": _dense(rng, INTER, HIDDEN),
            p + "mlp.down_proj.weight": _dense(rng, HIDDEN, INTER, damp)}


def _config(target: str, arch: str, **extra) -> dict:
    with open(os.path.join(target, "config.json")) as f:
        t = json.load(f)
    rope = {k: t[k] for k in ("rope_theta", "rope_scaling", "rope_parameters") if k in t}
    return {"architectures": [arch], "model_type": "llama", "hidden_size": HIDDEN,
            "intermediate_size": INTER, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1, "vocab_size": VOCAB,
            "rms_norm_eps": t["rms_norm_eps"], "max_position_embeddings": 512,
            "torch_dtype": "float32", **rope, **extra}


def _save(path: str, cfg: dict, tensors: dict[str, np.ndarray]) -> str:
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


def _damp_target(path: str) -> None:
    from safetensors.numpy import load_file, save_file

    f = os.path.join(path, "model.safetensors")
    w = {n: t * SCALE if n.endswith(("o_proj.weight", "down_proj.weight")) else t
         for n, t in load_file(f).items()}
    save_file(w, f, metadata={"format": "pt"})


def eagle_head(path: str, target: str, aligned: bool, seed: int = 0, layers: int = 1) -> str:
    """EAGLE-1 (yuhuili/EAGLE-LLaMA3-Instruct-8B's layout): fc over [embeds; hidden], layers
    (the first without input_layernorm), the target's embeddings and lm_head."""
    from safetensors.numpy import load_file

    rng = np.random.default_rng(seed)
    # (aligned: the layer reads the un-normed embedding, so its branches must add far less)
    w = _layer(rng, "layers.0.", HIDDEN, 1e-3 if aligned else 1.0)
    for j in range(1, layers):
        w.update(_layer(rng, f"layers.{j}.", HIDDEN))
        w[f"layers.{j}.input_layernorm.weight"] = rng.normal(1, 0.3, HIDDEN).astype(np.float32)
    fc = _dense(rng, HIDDEN, 2 * HIDDEN)
    if aligned:  # the hidden state's part small: the normed one's entries are ~1
        norm = load_file(os.path.join(target, "model.safetensors"))["model.norm.weight"]
        fc[:, :HIDDEN] = np.diag(norm)
        fc[:, HIDDEN:] *= 1e-3
    w["fc.weight"] = fc
    return _save(path, _config(target, "LlamaForCausalLM", num_hidden_layers=layers), w)


def eagle3_head(path: str, target: str, seed: int = 0, embed: bool = False, **config) -> str:
    """EAGLE-3 (LlamaForCausalLMEagle3): fc over 3 aux hidden states, midlayer reading 2H, its
    own lm_head over DRAFT_VOCAB tokens mapped to the target's by d2t (the odd target ids), t2d;
    embed: its own embed_tokens too."""
    rng = np.random.default_rng(seed)
    w = _layer(rng, "midlayer.", 2 * HIDDEN)
    w["midlayer.input_layernorm.weight"] = rng.normal(1, 0.3, HIDDEN).astype(np.float32)
    w["midlayer.hidden_norm.weight"] = rng.normal(1, 0.3, HIDDEN).astype(np.float32)
    w["norm.weight"] = rng.normal(1, 0.3, HIDDEN).astype(np.float32)
    w["fc.weight"] = _dense(rng, HIDDEN, 3 * HIDDEN)
    w["lm_head.weight"] = _dense(rng, DRAFT_VOCAB, HIDDEN, 4.0)
    targets = 1 + 2 * np.arange(DRAFT_VOCAB)
    w["d2t"] = (targets - np.arange(DRAFT_VOCAB)).astype(np.int64)
    if embed:
        w["embed_tokens.weight"] = (rng.standard_normal((VOCAB, HIDDEN)) * 0.1).astype(np.float32)
    t2d = np.zeros(VOCAB, dtype=bool)
    t2d[targets] = True
    w["t2d"] = t2d
    cfg = _config(target, "LlamaForCausalLMEagle3", draft_vocab_size=DRAFT_VOCAB,
                  eagle_aux_hidden_state_layer_ids=AUX_LAYERS, **config)
    return _save(path, cfg, w)


def make_eagle_checkpoints(root: str) -> dict[str, str]:
    """name -> path: "target" (the tiny Llama, TARGET_LAYERS layers), "eagle", "eagle3" (random
    heads for it; "eagle_two_layers" with two layers, "eagle3_own" with its own embeddings and
    norm_before_residual),
    "aligned_target" and "aligned_eagle" (the head built to agree with it)."""
    target = make_checkpoint("llama", "float32", root, num_hidden_layers=TARGET_LAYERS)
    aligned = os.path.join(root, "aligned_target")
    shutil.copytree(target, aligned)
    _damp_target(aligned)
    return {"target": target, "aligned_target": aligned,
            "eagle": eagle_head(os.path.join(root, "eagle"), target, aligned=False),
            "eagle_two_layers": eagle_head(os.path.join(root, "eagle_two_layers"), target,
                                           aligned=False, seed=2, layers=2),
            "eagle3": eagle3_head(os.path.join(root, "eagle3"), target),
            "eagle3_own": eagle3_head(os.path.join(root, "eagle3_own"), target, seed=1,
                                      embed=True, norm_before_residual=True),
            "aligned_eagle": eagle_head(os.path.join(root, "aligned_eagle"), aligned,
                                        aligned=True)}
