"""fill_uniform against a numpy re-implementation of its counter-based hash (sampling/rng.h):
the exact values, their range and spread, and f16 / bf16 as the f32 values rounded to nearest
even."""

from __future__ import annotations

import numpy as np
import pytest

from vllmx import _C
from vllmx.device import BF16, F16

rng = np.random.default_rng()
M64 = (1 << 64) - 1


def expected(seed: int, n: int, low: float, high: float) -> np.ndarray:
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = np.uint64(seed & M64) ^ (i * np.uint64(0xD1B54A32D192ED03))
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
    return np.float32(low) + np.float32(high - low) * u


def bf16_bits(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def test_values_and_spread():
    seed = int(rng.integers(0, 2**63))
    out = np.empty((300, 700), np.float32)
    _C.ops.fill_uniform(out, seed, -1e-3, 2e-3)
    want = expected(seed, out.size, -1e-3, 2e-3).reshape(out.shape)
    assert np.array_equal(out, want)
    assert out.min() >= -1e-3 and out.max() < 2e-3
    assert abs(out.mean() - 5e-4) < 1e-5 and abs(out.std() - 3e-3 / np.sqrt(12)) < 1e-5
    other = np.empty_like(out)
    _C.ops.fill_uniform(other, seed + 1, -1e-3, 2e-3)
    assert (other != out).mean() > 0.99


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_half_types_round_the_f32_values(dtype):
    seed = int(rng.integers(0, 2**63))
    out = np.empty((64, 129), np.uint16)
    _C.ops.fill_uniform((out, dtype), seed, -3.0, 5.0)
    f32 = expected(seed, out.size, -3.0, 5.0).reshape(out.shape)
    want = f32.astype(np.float16).view(np.uint16) if dtype == F16 else bf16_bits(f32)
    assert np.array_equal(out, want)


def test_bad_arguments():
    with pytest.raises(ValueError, match="fill_uniform: need finite low <= high"):
        _C.ops.fill_uniform(np.empty(4, np.float32), 0, 1.0, -1.0)
    with pytest.raises(ValueError, match="fill_uniform: out must be f32, f16 or bf16"):
        _C.ops.fill_uniform(np.empty(4, np.int32), 0, 0.0, 1.0)
