"""A Hugging Face checkpoint laid out as llama.cpp's convert_hf_to_gguf.py lays it out: GGUF tensor
names, architecture metadata, and the tokenizer. Llama Q/K rows are un-permuted to Meta's
interleaved rope layout (llama, granite, smollm3), llama3 rope scaling becomes a rope_freqs tensor,
Gemma norms are stored as 1 + w, Phi-3's fused tensors stay fused. Tensors are produced lazily
(name, shape, loader) so a writer can stream them."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vllmx.loader.safetensors import load_safetensors
from vllmx.models import gemma3, llama

logger = logging.getLogger(__name__)

# HF architectures -> GGUF architecture (Mistral converts as llama, OLMo 3 as olmo2, as
# llama.cpp does).
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama",
                    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                    "GraniteForCausalLM": "granite", "SmolLM3ForCausalLM": "smollm3",
                    "Phi3ForCausalLM": "phi3", "Glm4ForCausalLM": "glm4",
                    "Olmo2ForCausalLM": "olmo2",
                    "Olmo3ForCausalLM": "olmo2", "Exaone4ForCausalLM": "exaone4",
                    "Gemma2ForCausalLM": "gemma2",
                    "Gemma3ForCausalLM": "gemma3"}
_PERMUTED = ("llama", "granite", "smollm3")  # Q/K rows un-permuted (llama.cpp's LlamaModel)
_ROPE_FREQS_ARCHS = ("llama", "exaone4")  # llama3 rope scaling as a rope_freqs tensor
_GEMMA = ("gemma2", "gemma3")



@dataclass
class SourceTensor:
    name: str  # GGUF name
    shape: tuple[int, ...]  # PyTorch order (rows, cols)
    load: Callable[[], np.ndarray]  # float32 values


def _hf_to_gguf_names(arch: str) -> dict[str, str]:
    """The name tables inverted: the architecture's own names over the common ones."""
    if arch in _GEMMA:
        return {hf: g for g, hf in gemma3.GGUF_TO_HF.items()}
    return ({hf: g for g, hf in llama.GGUF_TO_HF.items()}
            | {hf: g for g, hf in llama.GGUF_ARCH_TO_HF.get(arch, {}).items()})


def _gguf_name(hf_name: str, table: dict[str, str]) -> str | None:
    base, _, suffix = hf_name.rpartition(".")
    parts = base.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) > 2:
        key, i = "model.layers.{i}." + ".".join(parts[3:]), parts[2]
    else:
        key, i = base, ""
    return table[key].format(i=i) + "." + suffix if key in table else None


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half Q/K rows back to Meta's interleaved pairs (llama.cpp's LlamaModel)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """permute_qk's inverse: Meta's interleaved Q/K rows as HF's rotate-half rows."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _rope(cfg: dict) -> tuple[float, dict]:
    """(rope_theta, scaling) from transformers 5's rope_parameters (per layer type: the full
    layers') or 4's rope_theta and rope_scaling."""
    params = dict(cfg.get("rope_parameters") or {})
    params = dict(params.get("full_attention", params))
    scaling = dict(cfg.get("rope_scaling") or params)
    theta = cfg.get("rope_theta") or params.get("rope_theta") or 10000.0
    if scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = {}
    return float(theta), scaling


def llama3_rope_factors(theta: float, scaling: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs for llama3 scaling: the divisor of each rotary frequency."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for f in 1.0 / (theta ** (np.arange(0, head_dim, 2) / head_dim)):
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def read_hf_config(model_dir: str) -> tuple[str, dict]:
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        raise ValueError(f"{model_dir}: no config.json (not a Hugging Face checkpoint directory)")
    with open(path) as f:
        cfg = json.load(f)
    archs = cfg.get("architectures") or []
    arch = next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"{model_dir}: architecture {archs or cfg.get('model_type')} is not "
                         f"supported; supported: {sorted(HF_ARCHITECTURES)}")
    return arch, cfg


def hf_tensors(model_dir: str, arch: str, cfg: dict) -> list[SourceTensor]:
    """The checkpoint's tensors under GGUF names, in llama.cpp's layout."""
    weights = load_safetensors(model_dir)
    table = _hf_to_gguf_names(arch)
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    out: list[SourceTensor] = []
    for hf_name, w in weights.items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        name = _gguf_name(hf_name, table)
        if name is None:
            raise ValueError(f"{model_dir}: tensor {hf_name!r} has no GGUF name for {arch}")

        def load(w=w, hf_name=hf_name):
            t = w.to_float32()
            if arch in _PERMUTED and hf_name.endswith("self_attn.q_proj.weight"):
                t = permute_qk(t, nh)
            elif arch in _PERMUTED and hf_name.endswith("self_attn.k_proj.weight"):
                t = permute_qk(t, nkv)
            elif arch in _GEMMA and hf_name.endswith("norm.weight"):
                t = t + np.float32(1.0)
            return np.ascontiguousarray(t, dtype=np.float32)

        out.append(SourceTensor(name, tuple(w.shape), load))
    theta, scaling = _rope(cfg)
    if arch in _ROPE_FREQS_ARCHS and scaling.get("rope_type", scaling.get("type")) == "llama3":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // nh
        factors = llama3_rope_factors(theta, scaling, head_dim)
        out.insert(0, SourceTensor("rope_freqs.weight", factors.shape, lambda: factors))
    return out


def add_hf_metadata(w, arch: str, cfg: dict) -> None:
    """Architecture hyperparameters under GGUF keys (convert_hf_to_gguf's set_gguf_parameters)."""
    import gguf

    nh = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // nh
    w.add_context_length(cfg.get("max_position_embeddings") or 2048)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(nh)
    w.add_head_count_kv(cfg.get("num_key_value_heads") or nh)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_vocab_size(cfg["vocab_size"])
    if arch == "gemma3":
        _add_gemma3_metadata(w, cfg, head_dim)
        return
    if arch == "gemma2":
        _add_gemma2_metadata(w, cfg, head_dim)
        return
    theta, scaling = _rope(cfg)
    w.add_rope_freq_base(theta)
    partial = (cfg.get("partial_rotary_factor")
               or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0)
    w.add_rope_dimension_count(int(head_dim * partial))
    _add_family_metadata(w, arch, cfg)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(scaling["factor"])
        w.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    elif kind is not None and not (kind == "llama3" and arch in _ROPE_FREQS_ARCHS):
        raise ValueError(f"rope scaling {kind!r} is not supported by vllmx quantize")
    window = cfg.get("sliding_window")
    if window and "MistralForCausalLM" in (cfg.get("architectures") or []):
        logger.warning("sliding_window %s is dropped: llama.cpp's llama architecture has none",
                       window)


def _add_family_metadata(w, arch: str, cfg: dict) -> None:
    """Granite's multipliers; the windows of Phi-3 and OLMo 3; what llama.cpp fixes for SmolLM3
    and OLMo 3 and a file cannot say otherwise."""
    n = cfg["num_hidden_layers"]
    if arch == "granite":
        w.add_embedding_scale(cfg.get("embedding_multiplier") or 1.0)
        w.add_residual_scale(cfg.get("residual_multiplier") or 1.0)
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_logit_scale(cfg.get("logits_scaling") or 1.0)
    elif arch == "phi3" and cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])  # vllmx reads it; llama.cpp ignores it
    elif arch == "smollm3":
        every = cfg.get("no_rope_layer_interval") or 4
        use_rope = cfg.get("no_rope_layers") or [int((i + 1) % every != 0) for i in range(n)]
        if list(use_rope) != [int((i + 1) % 4 != 0) for i in range(n)]:
            raise ValueError("SmolLM3 with no_rope_layers other than every 4th layer cannot be "
                             "expressed in GGUF")
        if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
            raise ValueError("SmolLM3 with sliding windows cannot be expressed in GGUF")
    elif arch == "olmo2" and "sliding_attention" in (cfg.get("layer_types") or []):
        types = ["sliding_attention" if i % 4 < 3 else "full_attention" for i in range(n)]
        if list(cfg["layer_types"]) != types:
            raise ValueError("OLMo 3 with layer_types other than 3 sliding of every 4 cannot be "
                             "expressed in GGUF")
        sliding = (cfg.get("rope_parameters") or {}).get("sliding_attention") or {}
        if sliding.get("rope_type", "default") != "default":
            raise ValueError("OLMo 3 with rope scaling on sliding layers cannot be expressed in "
                             "GGUF")
        w.add_sliding_window(cfg["sliding_window"])
    elif arch == "exaone4" and "sliding_attention" in (cfg.get("layer_types") or []):
        types = ["sliding_attention" if i % 4 < 3 else "full_attention" for i in range(n)]
        if n != 64 or list(cfg["layer_types"]) != types:
            raise ValueError("EXAONE 4 with sliding layers other than 3 of every 4 of 64 layers "
                             "cannot be expressed in GGUF (llama.cpp fixes the 32B's pattern)")
        w.add_sliding_window(cfg["sliding_window"])


def _add_gemma2_metadata(w, cfg: dict, head_dim: int) -> None:
    theta, scaling = _rope(cfg)
    if scaling:
        raise ValueError(f"Gemma 2 with rope scaling {scaling} is not supported by vllmx quantize")
    w.add_rope_freq_base(theta)
    w.add_sliding_window(cfg["sliding_window"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if not cfg.get(key):  # llama.cpp would cap at its defaults (50, 30)
            raise ValueError(f"Gemma 2 without {key} cannot be expressed in GGUF")
    w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    n = cfg["num_hidden_layers"]
    every_other = gemma3.layer_types({"num_hidden_layers": n}, default_pattern=2)
    if gemma3.layer_types(cfg, default_pattern=2) != every_other:
        raise ValueError("Gemma 2 with layer_types other than every other layer sliding cannot "
                         "be expressed in GGUF")
    qpas = cfg.get("query_pre_attn_scalar")
    big = n == 46  # llama.cpp's 27B: hidden / heads
    if qpas and qpas != (cfg["hidden_size"] // cfg["num_attention_heads"] if big else head_dim):
        raise ValueError(f"Gemma 2 with query_pre_attn_scalar {qpas} cannot be expressed in GGUF "
                         f"(llama.cpp derives it)")


def _add_gemma3_metadata(w, cfg: dict, head_dim: int) -> None:
    import gguf

    if cfg.get("attn_logit_softcapping"):
        raise ValueError("Gemma 3 with attn_logit_softcapping cannot be expressed in GGUF")
    ropes = gemma3.rope_parameters(cfg)
    full, local = ropes["full_attention"], ropes["sliding_attention"]
    w.add_rope_freq_base(full["rope_theta"])
    if full.get("rope_type", full.get("type")) == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    if local["rope_theta"] != 10000.0:
        w.add_rope_freq_base_swa(local["rope_theta"])  # llama.cpp assumes 10000
    w.add_sliding_window(cfg["sliding_window"])
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    types = gemma3.layer_types(cfg, default_pattern=6)
    default = gemma3.layer_types({"num_hidden_layers": len(types)}, default_pattern=6)
    if types != default:  # vllmx reads this key; llama.cpp assumes every 6th layer global
        w.add_sliding_window_pattern([t == "sliding_attention" for t in types])
        logger.warning("layer_types differ from llama.cpp's every-6th-global Gemma 3 pattern")
    qpas = cfg.get("query_pre_attn_scalar")
    if qpas and qpas != head_dim and cfg["num_hidden_layers"] != 62:
        logger.warning("query_pre_attn_scalar %s != head_dim %s: llama.cpp uses head_dim",
                       qpas, head_dim)


def _pre_tokenizer_name(tj: dict) -> str | None:
    """tokenizer.ggml.pre for the byte-level pre-tokenizers vllmx and llama.cpp both know."""
    from vllmx.tokenizer.gguf_vocab import BPE_PRE_TOKENIZERS

    pre = tj.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"  # llama.cpp's spelling
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        return "smollm"
    if kinds == ["Split", "ByteLevel"]:
        regex = (steps[0].get("pattern") or {}).get("Regex")
        for name in ("llama-bpe", "qwen2"):
            if (regex,) == BPE_PRE_TOKENIZERS[name].splits:
                return name
    return None


def add_hf_tokenizer(w, model_dir: str, vocab_size: int) -> bool:
    """Writes a byte-level BPE tokenizer.json as tokenizer.ggml.model "gpt2" (tokens, types,
    merges, special ids, chat template). Returns False, with a warning, for other tokenizers."""
    import gguf

    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        logger.warning("%s has no tokenizer.json: writing no tokenizer (llama.cpp needs one)",
                       model_dir)
        return False
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj.get("model") or {}
    decoder = tj.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
        logger.warning("tokenizer.json is not a byte-level BPE tokenizer (model %s, decoder %s): "
                       "writing no tokenizer", model.get("type"), decoder.get("type"))
        return False
    added = {a["id"]: a for a in tj.get("added_tokens", [])}
    n = max([vocab_size, *(i + 1 for i in model["vocab"].values()), *(i + 1 for i in added)])
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for tok, i in model["vocab"].items():
        tokens[i], types[i] = tok, gguf.TokenType.NORMAL
    for i, a in added.items():
        tokens[i] = a["content"]
        types[i] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    w.add_tokenizer_model("gpt2")
    pre = _pre_tokenizer_name(tj)
    if pre is None:
        logger.warning("unrecognised pre-tokenizer: llama.cpp will use its default (GPT-2) one")
    else:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=n).add_to_gguf(w, quiet=True)
    return True
