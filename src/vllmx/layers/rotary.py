"""Rotary embeddings: the cos/sin cache for each rope flavour (vLLM's get_rope). The native op
applies it; only the cache differs between default, linear, dynamic-NTK, llama3, YaRN and
longrope scaling. get_rope reads a checkpoint's rope from its config.json."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vllmx import ops
from vllmx.device import F32
from vllmx.layers import placement


def _inv_freq(base: float, rotary_dim: int) -> np.ndarray:
    return 1.0 / (base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))


def _llama3_inv_freq(inv_freq: np.ndarray, s: dict[str, Any]) -> np.ndarray:
    factor = s["factor"]
    low, high = s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)


def _yarn_inv_freq(base: float, rotary_dim: int, s: dict[str, Any],
                   max_position: int) -> tuple[np.ndarray, float]:
    """YaRN (arXiv 2309.00071): frequencies below the correction range interpolated by factor,
    those above kept, a linear ramp between; returns them and the attention factor that scales
    cos and sin (from the config, else 0.1 ln(factor) + 1, DeepSeek's mscale ratio)."""
    orig = s["original_max_position_embeddings"]
    factor = s.get("factor") or max_position / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = s.get("attention_factor")
    if attn is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: extrapolate (the base frequency), 0: interpolate (divided by factor)
    inv_freq = _inv_freq(base, rotary_dim)
    return inv_freq / factor * (1 - keep) + inv_freq * keep, float(attn)


class RotaryEmbedding:
    """Applies rope to q and k in place; `cos_sin_cache` is f32 [positions, rotary_dim].
    num_positions: the positions the engine can reach (max_model_len), default all the scaling
    defines; a 32k-context Gemma 3 would otherwise hold 64 MB of cache for a 1k max_model_len."""

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float,
                 is_neox_style: bool, rope_scaling: dict[str, Any] | None = None,
                 freq_factors: np.ndarray | None = None, num_positions: int | None = None):
        self.head_size = head_size
        self.is_neox_style = is_neox_style
        # longrope: (original context, row offset) — a request whose prompt is longer than the
        # original context reads its rows at position + offset (the long factors throughout)
        self.long_prompt_offset: tuple[int, int] | None = None
        s = dict(rope_scaling or {})
        rope_type = s.get("rope_type", s.get("type", "default"))
        inv_freq = _inv_freq(base, rotary_dim)
        n = (1 << 62) if num_positions is None else int(num_positions)  # rows to compute
        positions = np.arange(min(n, max_position), dtype=np.float64)
        if freq_factors is not None:  # GGUF llama3: rope_freqs.weight divides the frequencies
            inv_freq = inv_freq / freq_factors.astype(np.float64)
        cos_sin_scale = 1.0
        if rope_type in ("default", None):
            pass
        elif rope_type == "linear":
            positions = positions / s["factor"]
        elif rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, s)
        elif rope_type == "yarn":
            inv_freq, cos_sin_scale = _yarn_inv_freq(base, rotary_dim, s, max_position)
        elif rope_type == "longrope":
            # Phi-3's: short_factor divides the frequencies up to the original context, and
            # long_factor from there on, per position; a sequence whose prompt is longer than
            # the original context takes long_factor at every position (transformers switches a
            # whole forward once it reaches past the original context: its prefill of such a
            # prompt, and each decode step after; the KV cache of earlier keys of a sequence
            # that crosses it later cannot follow). Those rows follow the per-position ones:
            # the runner offsets such a request's positions by long_prompt_offset[1].
            orig = s["original_max_position_embeddings"]
            factor = s.get("factor") or max_position / orig
            cos_sin_scale = s.get("attention_factor") or (
                1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig)))
            short = np.outer(positions[:orig], inv_freq / np.asarray(s["short_factor"]))
            long_freqs = np.outer(positions[orig:], inv_freq / np.asarray(s["long_factor"]))
        elif rope_type == "dynamic":
            # Dynamic NTK: positions within the trained length keep the base frequencies; beyond
            # it the base grows with the length (as transformers does for a sequence that long).
            factor, orig = s["factor"], max_position
            max_len = int(orig * factor)
            ntk_base = base * ((factor * max_len / orig) - (factor - 1)) ** (
                rotary_dim / (rotary_dim - 2))
            long_pos = np.arange(orig, max(orig, min(max_len, n)), dtype=np.float64)
            long_freqs = np.outer(long_pos, _inv_freq(ntk_base, rotary_dim))
            positions = np.arange(min(orig, n), dtype=np.float64)
        else:
            raise ValueError(f"rope_scaling type {rope_type!r} is not supported yet")
        freqs = np.outer(positions, inv_freq)
        if rope_type == "dynamic":
            freqs = np.concatenate([freqs, long_freqs])
        elif rope_type == "longrope":
            all_long = np.outer(positions, inv_freq / np.asarray(s["long_factor"]))
            freqs = np.concatenate([short, long_freqs, all_long])
            self.long_prompt_offset = (orig, len(positions))
        self.cos_sin_cache = placement.upload_vector(np.ascontiguousarray(
            np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1) * cos_sin_scale,
            dtype=np.float32), F32)

    def identity(self) -> RotaryEmbedding:
        """This layout with every angle 0 (cos 1, sin 0): a layer without rope (SmolLM3's NoPE
        layers) runs the same fused op, which then leaves q and k exactly as they are."""
        nope = object.__new__(RotaryEmbedding)
        nope.head_size, nope.is_neox_style = self.head_size, self.is_neox_style
        rows, dim = self.cos_sin_cache.shape
        cache = np.zeros((rows, dim), dtype=np.float32)
        cache[:, :dim // 2] = 1.0
        nope.cos_sin_cache = placement.upload_vector(cache, F32)
        return nope

    def __call__(self, positions: np.ndarray, q: np.ndarray, k: np.ndarray) -> None:
        ops.rotary(positions, q, k, self.cos_sin_cache, self.head_size, self.is_neox_style)


def get_rope(cfg: dict, head_dim: int, is_neox_style: bool = True,
             rotary_dim: int | None = None) -> RotaryEmbedding:
    """The rope a config.json describes: transformers 5's rope_parameters (rope_theta,
    partial_rotary_factor, the scaling) or the older top-level rope_theta, partial_rotary_factor
    and rope_scaling; rope over the first rotary_dim (default head_dim * partial_rotary_factor)
    dims of a head."""
    params = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    theta = params.pop("rope_theta", None) or cfg.get("rope_theta") or 1e4
    partial = params.pop("partial_rotary_factor", None) or cfg.get("partial_rotary_factor") or 1.0
    kind = params.get("rope_type", params.get("type", "default"))
    scaling = None if kind == "default" else params
    return RotaryEmbedding(head_dim, rotary_dim or int(head_dim * partial),
                           int(cfg.get("max_position_embeddings") or 2048), float(theta),
                           is_neox_style, scaling, num_positions=cfg.get("max_model_len"))
