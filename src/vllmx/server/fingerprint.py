"""The `system_fingerprint` of responses, as vLLM 0.26's --fingerprint-mode sets it: OpenAI's
field for telling clients which backend configuration answered (a changed fingerprint: results
may differ for the same request and seed).

- full (the default): "vllmx-<version>-<hash8>", hash8 from the configuration that decides what
  a request gets (model and weights, dtypes, context, cache, device, speculative decoding,
  LoRA, structured-output backend); vLLM's mode also names tensor / pipeline / data / expert
  parallelism, which vllmx (one device) does not have, so full and hash agree here;
- hash: the same; custom: --fingerprint-value as given (null if none, as vLLM); none: null.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from vllmx.config import FINGERPRINT_MODES

# ModelConfig fields that identify what answers (not the loaded config.json copies).
_MODEL_FIELDS = ("model", "path", "tokenizer", "max_model_len", "dtype", "load_format",
                 "runner_type", "convert_type", "hf_overrides", "generation_config")


def config_hash(vllm_config) -> str:
    """A stable hex digest of the configuration a response depends on (not of what start-up
    measures: the KV cache's size follows the memory free at the time)."""
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    ident = {"model": {k: getattr(mc, k, None) for k in _MODEL_FIELDS},
             "device": vllm_config.device_config.device,
             "cache": {"block_size": cc.block_size, "kv_cache_dtype": cc.kv_cache_dtype,
                       "enable_prefix_caching": cc.enable_prefix_caching}}
    for name in ("speculative_config", "lora_config", "structured_outputs_config"):
        cfg = getattr(vllm_config, name, None)
        ident[name] = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else cfg
    text = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def build_system_fingerprint(vllm_config, mode: str = "full",
                             custom_value: str | None = None) -> str | None:
    if mode not in FINGERPRINT_MODES:
        raise ValueError(f"fingerprint mode {mode!r}: one of {', '.join(FINGERPRINT_MODES)}")
    if mode == "none":
        return None
    if mode == "custom":
        return custom_value
    from vllmx import __version__

    return f"vllmx-{__version__}-{config_hash(vllm_config)[:8]}"
