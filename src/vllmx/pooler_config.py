"""Which runner a checkpoint gets (vLLM's --runner / --convert) and how a pooling model pools
(vLLM's PoolerConfig), from the architecture and a sentence-transformers checkpoint's
modules.json / pooling config."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify")
POOLING_TYPES = ("CLS", "MEAN", "LAST")

# sentence-transformers' Pooling config keys -> vLLM's pooling types.
_ST_MODES = {"pooling_mode_cls_token": "CLS", "pooling_mode_mean_tokens": "MEAN",
             "pooling_mode_lasttoken": "LAST"}
_ST_MODE_NAMES = {"cls": "CLS", "mean": "MEAN", "lasttoken": "LAST"}
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens")


@dataclass
class PoolerConfig:
    """pooling_type: CLS / MEAN / LAST (None: the model's default); normalize: the embed
    task's default (a request's PoolingParams.normalize wins)."""

    pooling_type: str | None = None
    normalize: bool = True

    def __post_init__(self):
        if self.pooling_type is not None:
            self.pooling_type = self.pooling_type.upper()
            if self.pooling_type not in POOLING_TYPES:
                raise ValueError(f"pooling_type {self.pooling_type!r} is not one of "
                                 f"{', '.join(POOLING_TYPES)}")


def _is_classifier(archs: list[str]) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in archs)


def _is_generative(archs: list[str]) -> bool:
    return any(a.endswith(("ForCausalLM", "ForConditionalGeneration", "LMHeadModel"))
               for a in archs)


def resolve_runner(archs: list[str], runner: str = "auto", convert: str = "auto"
                   ) -> tuple[str, str]:
    """(runner_type, convert_type) as vLLM resolves them: 'generate' with convert 'none', or
    'pooling' with convert 'embed' / 'classify'. archs: config.json's architectures (empty for
    a GGUF file)."""
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r} is not one of {', '.join(RUNNERS)}")
    if convert not in CONVERTS:
        raise ValueError(f"convert {convert!r} is not one of {', '.join(CONVERTS)}")
    if runner == "auto":
        pooling_arch = archs and not _is_generative(archs)
        runner = "pooling" if convert in ("embed", "classify") or pooling_arch else "generate"
    if runner == "generate":
        if convert not in ("auto", "none"):
            raise ValueError(f"convert={convert!r} needs runner='pooling' (got runner="
                             f"'generate')")
        if archs and not _is_generative(archs):
            raise ValueError(f"architecture {archs} is a pooling model and cannot generate; "
                             f"use runner='pooling' (--runner pooling)")
        return "generate", "none"
    if convert in ("auto", "none"):
        convert = "classify" if _is_classifier(archs) else "embed"
    elif convert == "classify" and not _is_classifier(archs):
        raise ValueError(f"convert='classify' needs a checkpoint with a classifier head "
                         f"(*ForSequenceClassification); {archs or 'this GGUF'} has none")
    return "pooling", convert


def load_pooler_config(path: str) -> PoolerConfig | None:
    """The pooling of a sentence-transformers checkpoint (modules.json: its Pooling module's
    mode, and whether a Normalize module follows), or None when the checkpoint has none."""
    modules_path = os.path.join(path, "modules.json")
    if not os.path.isfile(modules_path):
        return None
    with open(modules_path) as f:
        modules = json.load(f)
    types = {m.get("type", "").rsplit(".", 1)[-1]: m for m in modules}
    for kind in types:
        if kind not in ("Transformer", "Pooling", "Normalize"):
            raise ValueError(f"{modules_path}: sentence-transformers module {kind!r} is not "
                             f"supported (vllmx reads Transformer, Pooling and Normalize)")
    if "Pooling" not in types:
        return PoolerConfig(None, "Normalize" in types)
    with open(os.path.join(path, types["Pooling"].get("path", ""), "config.json")) as f:
        st = json.load(f)
    if st.get("include_prompt") is False:
        raise ValueError("sentence-transformers pooling with include_prompt=false (an "
                         "instruction left out of the pooling) is not supported")
    if "pooling_mode" in st:  # sentence-transformers >= 6: a mode name or a list of them
        named = st["pooling_mode"]
        named = [named] if isinstance(named, str) else list(named)
        bad = [m for m in named if m not in _ST_MODE_NAMES]
        modes = [_ST_MODE_NAMES[m] for m in named if m in _ST_MODE_NAMES]
    else:
        bad = [k for k in _ST_UNSUPPORTED if st.get(k)]
        modes = [mode for key, mode in _ST_MODES.items() if st.get(key)]
    if bad:
        raise ValueError(f"sentence-transformers pooling {bad[0]!r} is not supported (vllmx "
                         f"pools CLS, MEAN or LAST)")
    if len(modes) != 1:
        raise ValueError(f"sentence-transformers pooling config {st} must name exactly one "
                         f"pooling mode (cls, mean or lasttoken)")
    return PoolerConfig(modes[0], "Normalize" in types)


def sentence_transformers_max_seq_length(path: str) -> int | None:
    """sentence_bert_config.json's max_seq_length (vLLM caps max_model_len by it)."""
    p = os.path.join(path, "sentence_bert_config.json")
    if not os.path.isfile(p):
        return None
    with open(p) as f:
        return json.load(f).get("max_seq_length")


def checkpoint_architectures(path: str) -> list[str]:
    """config.json's architectures of a resolved checkpoint directory ([] for a GGUF file)."""
    cfg_path = os.path.join(path, "config.json")
    if path.endswith(".gguf") or not os.path.isfile(cfg_path):
        return []
    with open(cfg_path) as f:
        return list(json.load(f).get("architectures") or [])

