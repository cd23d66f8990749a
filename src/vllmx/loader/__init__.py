"""Model loading: resolve the name, read config + weights (safetensors or GGUF), build the
model class registered for the architecture, and the tokenizer beside it."""

from __future__ import annotations

import os

from vllmx.config import ModelConfig
from vllmx.distributed.parallel_state import get_ep_group, get_pp_stage, get_tp_group
from vllmx.distributed.tp_shard import shard_checkpoint
from vllmx.loader.dummy import DummyWeights
from vllmx.loader.gguf import gguf_to_hf_config, load_gguf
from vllmx.loader.model_source import DEFAULT_MODEL, DEFAULT_POOLING_MODEL, resolve_model
from vllmx.loader.quantization import check_requested, dequantize_checkpoint
from vllmx.loader.safetensors import load_safetensors
from vllmx.models.registry import get_model_class
from vllmx.pages import file_mappings, release_free_heap, release_mapping


def _model_class(model_config: ModelConfig):
    check_requested(model_config.quantization, model_config.hf_config, model_config.is_gguf)
    if model_config.runner_type == "pooling":
        from vllmx.models.adapters import pooling_model_class

        return pooling_model_class(model_config.hf_config)
    return get_model_class(model_config.hf_config)


def load_model(model_config: ModelConfig):
    """(model, tokenizer or None). Fills model_config.path / hf_config / gen_config. A
    pooling runner (model_config.runner_type) gets the architecture's pooling model."""
    model_config.path = resolve_model(model_config.model,
                                      weights=model_config.load_format != "dummy")
    tokenizer = None
    fmt = model_config.load_format
    if fmt in ("gguf", "safetensors") and model_config.is_gguf != (fmt == "gguf"):
        raise ValueError(f"load_format={fmt!r} but {model_config.path} is "
                         f"{'a GGUF file' if model_config.is_gguf else 'not a GGUF file'}")
    if fmt == "dummy" and model_config.is_gguf:
        raise ValueError(f"load_format='dummy' builds the model from a config.json; "
                         f"{model_config.path} is a GGUF file")
    if model_config.is_gguf:
        meta, weights = load_gguf(model_config.path)
        model_config.hf_config = {**gguf_to_hf_config(meta), **model_config.hf_overrides}
        model_cls = _model_class(model_config)
        if not model_config.skip_tokenizer_init and model_config.tokenizer is None:
            from vllmx.tokenizer import Tokenizer

            tokenizer = Tokenizer.from_gguf_metadata(meta)
    else:
        model_config.load_hf_config()
        model_cls = _model_class(model_config)
        if fmt == "dummy":
            weights = DummyWeights(model_cls.checkpoint_shapes(model_config.hf_config),
                                   model_config.hf_config, model_config.seed)
        else:
            weights = dequantize_checkpoint(load_safetensors(model_config.path),
                                            model_config.hf_config)
        if not model_config.skip_tokenizer_init and model_config.tokenizer is None:
            from vllmx.tokenizer import Tokenizer

            if os.path.exists(os.path.join(model_config.path, "tokenizer.json")):
                tokenizer = Tokenizer.from_pretrained_dir(model_config.path)
    if model_config.tokenizer is not None and not model_config.skip_tokenizer_init:
        from vllmx.tokenizer import Tokenizer

        tok_path = resolve_model(model_config.tokenizer)
        if tok_path.endswith(".gguf"):
            tokenizer = Tokenizer.from_gguf_file(tok_path)
        else:
            tokenizer = Tokenizer.from_pretrained_dir(tok_path)
    model_config.finalize_max_model_len()
    meta = None  # the vocabulary lists are built into the tokenizer by now
    # max_model_len bounds the positions, hence the rope caches the model builds.
    cfg = {**model_config.hf_config, "max_model_len": model_config.max_model_len}
    if model_config.runner_type == "pooling" and cfg.get("classifier_from_token"):
        cfg["classifier_from_token_ids"] = _token_ids(tokenizer, cfg["classifier_from_token"])
    group = get_tp_group()
    if group is not None or get_pp_stage() is not None:  # (built inside model_parallel)
        cfg, weights = shard_checkpoint(cfg, weights, 0 if group is None else group.rank,
                                        1 if group is None else group.world_size,
                                        get_ep_group() is not None)
    raw = getattr(weights, "raw", weights)  # (a quantized checkpoint's tensors as read)
    mappings = file_mappings(w.data for w in raw.values()) if isinstance(raw, dict) else []
    model = model_cls(cfg, weights)
    if get_pp_stage() is not None and getattr(model, "pp_stage", None) is None:
        raise ValueError(f"pipeline_parallel_size > 1 is not supported for "
                         f"{type(model).__name__} yet (its forward runs every layer)")
    del weights  # what the model keeps it holds itself; a repacked original is freed
    for mapping in mappings:
        release_mapping(mapping)
    release_free_heap()  # the tokenizer's small blocks (Gemma 3: 515k merges into Rust)
    return model, tokenizer


def _token_ids(tokenizer, tokens: list[str]) -> list[int]:
    """hf_overrides' classifier_from_token (a reranker's answer tokens) as vocabulary ids."""
    if tokenizer is None:
        raise ValueError("classifier_from_token needs the model's tokenizer")
    ids = [tokenizer.token_to_id(t) for t in tokens]
    missing = [t for t, i in zip(tokens, ids) if i is None]
    if missing:
        raise ValueError(f"classifier_from_token {missing} not in the vocabulary")
    return ids


__all__ = ["DEFAULT_MODEL", "DEFAULT_POOLING_MODEL", "load_model", "resolve_model"]
