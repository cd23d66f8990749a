"""A LoRA adapter read into the per-module matrices the LoRA layers apply: A [r, in] and B
[out, r] in f32, B already times the adapter's scaling. Two formats: PEFT's directory
(adapter_config.json + adapter_model.safetensors; scaling lora_alpha / r, or lora_alpha /
sqrt(r) with use_rslora), as vLLM's LoRAModel.from_local_checkpoint reads it, and llama.cpp's
GGUF adapter (a .gguf file of general.type "adapter", adapter.type "lora", as its
convert_lora_to_gguf.py writes: tensors <base tensor>.lora_a / .lora_b, scaling
adapter.lora.alpha / r, q/k B rows in the GGUF base's layout). What vllmx cannot apply is
refused by name."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from vllmx.loader.gguf import load_gguf
from vllmx.loader.safetensors import _read_file
from vllmx.lora.request import LoRARequest
from vllmx.models.llama import GGUF_PERMUTED_QK, gguf_name_to_hf

# The projections a Llama-family decoder layer can carry an adapter on.
SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj")
_TENSOR = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)"
                     r"\.lora_(A|B)\.weight$")
_HF_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.weight$")


@dataclass
class LoRALayerWeights:
    lora_a: np.ndarray  # [r, in] f32
    lora_b: np.ndarray  # [out, r] f32, times the scaling


@dataclass
class LoRAModel:
    id: int
    name: str
    rank: int
    scaling: float
    # (layer index, module name) -> its matrices
    loras: dict[tuple[int, str], LoRALayerWeights]
    # The q/k rows of B: "hf" (PEFT's: Hugging Face's rotate-half rows) or "gguf" (llama.cpp's
    # adapter for an arch of GGUF_PERMUTED_QK: Meta's interleaved rows); the manager permutes
    # them where the base model's rows are the other kind.
    qk_layout: str = "hf"
    gguf_architecture: str | None = None  # a GGUF adapter's (it must be the base model's)

    @classmethod
    def from_local_checkpoint(cls, req: LoRARequest, max_lora_rank: int) -> LoRAModel:
        if req.lora_path.endswith(".gguf"):
            return _from_gguf(req, max_lora_rank)
        cfg = _read_config(req)
        r = int(cfg["r"])
        if r > max_lora_rank:
            raise ValueError(f"LoRA adapter {req.lora_name!r}: rank {r} is greater than "
                             f"max_lora_rank {max_lora_rank}")
        alpha = float(cfg.get("lora_alpha", r))
        scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        path = os.path.join(req.lora_path, "adapter_model.safetensors")
        if not os.path.exists(path):
            raise ValueError(f"LoRA adapter {req.lora_name!r}: {path} not found (vllmx reads "
                             f"PEFT's safetensors adapters; adapter_model.bin is not supported)")
        pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
        for name, w in _read_file(path).items():
            m = _TENSOR.match(name)
            if m is None or m.group(3) not in SUPPORTED_MODULES:
                raise ValueError(f"LoRA adapter {req.lora_name!r}: tensor {name!r} is not "
                                 f"supported; vllmx applies adapters to "
                                 f"{', '.join(SUPPORTED_MODULES)} of the decoder layers only")
            pairs.setdefault((int(m.group(1)), m.group(3)), {})[m.group(4)] = w.to_float32()
        loras = _pairs_to_loras(req.lora_name, pairs, max_lora_rank, lambda _: scaling)
        if not loras:
            raise ValueError(f"LoRA adapter {req.lora_name!r}: {path} holds no LoRA weights")
        return cls(req.lora_int_id, req.lora_name, r, scaling, loras)


def _pairs_to_loras(name: str, pairs: dict, max_lora_rank: int,
                    scaling) -> dict[tuple[int, str], LoRALayerWeights]:
    """{(layer, module): {"A": [r, in], "B": [out, r]}} checked and scaled (scaling(r): B's
    factor for a pair of rank r)."""
    loras = {}
    for key, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name!r}: layer {key[0]} {key[1]} has "
                             f"lora_{''.join(ab)} without its pair")
        a, b = ab["A"], ab["B"]
        if a.shape[0] != b.shape[1] or a.shape[0] > max_lora_rank:
            raise ValueError(f"LoRA adapter {name!r}: layer {key[0]} {key[1]} has "
                             f"lora_A {a.shape} and lora_B {b.shape} (rank at most "
                             f"max_lora_rank {max_lora_rank})")
        loras[key] = LoRALayerWeights(np.ascontiguousarray(a),
                                      np.ascontiguousarray(b * np.float32(scaling(a.shape[0]))))
    return loras


def _from_gguf(req: LoRARequest, max_lora_rank: int) -> LoRAModel:
    """llama.cpp's GGUF LoRA adapter. Its scaling is llama.cpp's: adapter.lora.alpha / r for each
    pair's rank r, 1 where alpha is 0 (or missing)."""
    name, path = req.lora_name, req.lora_path
    if not os.path.isfile(path):
        raise ValueError(f"LoRA adapter {name!r}: {path} not found")
    meta, tensors = load_gguf(path)
    kind = (meta.get("general.type"), meta.get("adapter.type"))
    if kind != ("adapter", "lora"):
        raise ValueError(f"LoRA adapter {name!r}: {path} is a GGUF of general.type "
                         f"{kind[0]!r} and adapter.type {kind[1]!r}, not a LoRA adapter "
                         f"('adapter', 'lora': llama.cpp's convert_lora_to_gguf.py writes those)")
    if "adapter.alora.invocation_tokens" in meta:
        raise ValueError(f"LoRA adapter {name!r}: activated LoRA (aLoRA invocation tokens) is "
                         f"not supported")
    arch = meta.get("general.architecture")
    alpha = float(meta.get("adapter.lora.alpha") or 0.0)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for tname, w in tensors.items():
        base, sep, ab = tname.rpartition(".lora_")
        m = _HF_WEIGHT.match(gguf_name_to_hf(base, arch)) if sep and ab in ("a", "b") else None
        if m is None or m.group(3) not in SUPPORTED_MODULES:
            raise ValueError(f"LoRA adapter {name!r}: tensor {tname!r} is not supported; vllmx "
                             f"applies adapters to the decoder layers' attn_q, attn_k, attn_v, "
                             f"attn_output, ffn_gate, ffn_up and ffn_down")
        pairs.setdefault((int(m.group(1)), m.group(3)), {})[ab.upper()] = w.to_float32()
    if not pairs:
        raise ValueError(f"LoRA adapter {name!r}: {path} holds no LoRA weights")
    loras = _pairs_to_loras(name, pairs, max_lora_rank,
                            lambda r: alpha / r if alpha else 1.0)
    rank = max(w.lora_a.shape[0] for w in loras.values())
    return LoRAModel(req.lora_int_id, name, rank, alpha / rank if alpha else 1.0, loras,
                     qk_layout="gguf" if arch in GGUF_PERMUTED_QK else "hf",
                     gguf_architecture=arch)


def _read_config(req: LoRARequest) -> dict:
    path = os.path.join(req.lora_path, "adapter_config.json")
    if not os.path.isfile(path):
        raise ValueError(f"LoRA adapter {req.lora_name!r}: no adapter_config.json in "
                         f"{req.lora_path!r}")
    with open(path) as f:
        cfg = json.load(f)
    name = req.lora_name
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"LoRA adapter {name!r}: peft_type {cfg['peft_type']!r} is not LORA")
    refused = [("use_dora", "DoRA (use_dora)"), ("modules_to_save", "modules_to_save"),
               ("rank_pattern", "per-module ranks (rank_pattern)"),
               ("alpha_pattern", "per-module alphas (alpha_pattern)"),
               ("fan_in_fan_out", "fan_in_fan_out"),
               ("trainable_token_indices", "trainable_token_indices")]
    for key, what in refused:
        if cfg.get(key):
            raise ValueError(f"LoRA adapter {name!r}: {what} is not supported")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {name!r}: bias={cfg['bias']!r} is not supported "
                         f"(only 'none')")
    targets = cfg.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]  # a regex over module names: the tensors below are checked instead
    bad = [t for t in targets if t in ("embed_tokens", "lm_head")]
    if bad:
        raise ValueError(f"LoRA adapter {name!r}: target module {bad[0]!r} is not supported; "
                         f"vllmx applies adapters to {', '.join(SUPPORTED_MODULES)}")
    return cfg
