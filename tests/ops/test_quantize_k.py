"""Weight quantization (`ops.quantize_weight`, csrc/quant/quantize_k.cpp): bit-exact with llama.cpp's
own reference quantizers (its libggml-base, through ctypes) and with gguf-py's where it has one;
decoded by `gguf.quants.dequantize` within llama.cpp's test-quantize-fns error bounds."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from vllmx import _C, ops

BLOCK_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# Relative RMS error on standard normal weights; measured, +10%.
GAUSSIAN_REL_RMS = {"F16": 0.0003, "BF16": 0.002, "Q8_0": 0.006, "Q5_1": 0.042, "Q5_0": 0.047,
                    "Q4_1": 0.086, "Q4_0": 0.095, "Q6_K": 0.0195, "Q5_K": 0.040, "Q4_K": 0.079,
                    "Q3_K": 0.166, "Q2_K": 0.33}


def quantize(x: np.ndarray, name: str) -> np.ndarray:
    return ops.quantize_weight(x, ops.QUANTIZE_TYPES[name])


def dequantize(q: np.ndarray, name: str, shape) -> np.ndarray:
    if name == "F16":
        return q.astype(np.float32).reshape(shape)
    return quants.dequantize(q.view(np.uint8), Q[name]).reshape(shape)


def weights(rng, rows: int, n: int) -> np.ndarray:
    """Rows of varying scale and offset with outliers, plus blocks llama.cpp special-cases."""
    a = rng.standard_normal((rows, n)).astype(np.float32)
    a *= np.exp(rng.uniform(-4, 2, size=(rows, 1))).astype(np.float32)
    a += rng.uniform(-1, 1, size=(rows, 1)).astype(np.float32) * np.abs(a).mean(1, keepdims=True)
    a[rng.random(a.shape) < 0.01] *= 30
    a[0, :256] = 0  # all-zero super-block
    a[1, :256] = 0.5  # constant
    a[2, :256] = -np.abs(a[2, :256])  # all negative
    a[3, 5:256] = 0  # one non-zero value
    a[4, :256] *= 1e-12  # below llama.cpp's GROUP_MAX_EPS
    return a


def llamacpp_quantizer(name: str):
    llama_cpp = pytest.importorskip("llama_cpp")
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    fn = getattr(lib, f"quantize_row_{name.lower().replace('_k', '_K')}_ref")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    return fn


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_bit_exact_with_llamacpp(name):
    fn = llamacpp_quantizer(name)
    x = weights(np.random.default_rng(1), 24, 1024)
    ours = quantize(x, name)
    theirs = np.zeros_like(ours)
    for r in range(x.shape[0]):
        fn(x[r].ctypes.data, theirs[r].ctypes.data, x.shape[1])
    mismatched = np.flatnonzero(~np.all(ours == theirs, axis=1))
    assert mismatched.size == 0, f"{name}: rows {mismatched.tolist()} differ from llama.cpp"


@pytest.mark.parametrize("name", ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_bit_exact_with_gguf_py(name):
    x = weights(np.random.default_rng(2), 16, 512)
    ours = quantize(x, name)
    theirs = quants.quantize(x, Q[name])
    assert np.array_equal(ours.view(np.uint8), theirs.view(np.uint8))


@pytest.mark.parametrize("name", list(GAUSSIAN_REL_RMS))
def test_round_trip_error(name):
    # llama.cpp's test-quantize-fns: 0.1 + 2 cos(i), error sqrt(sum d^2) / n.
    x = (0.1 + 2 * np.cos(np.arange(4096, dtype=np.float32))).astype(np.float32)[None]
    d = dequantize(quantize(x, name), name, x.shape).astype(np.float64)
    bound = {"Q2_K": 0.0075, "Q3_K": 0.0040}.get(name, 0.002)
    assert np.sqrt(((d - x) ** 2).sum()) / x.size < bound
    g = np.random.default_rng(3).standard_normal((32, 2048)).astype(np.float32)
    d = dequantize(quantize(g, name), name, g.shape)
    rel = np.sqrt(np.mean((d - g) ** 2)) / np.sqrt(np.mean(g**2))
    assert rel < GAUSSIAN_REL_RMS[name], f"{name}: {rel:.5f}"
    assert rel > GAUSSIAN_REL_RMS[name] / 2, f"{name}: {rel:.5f} (suspiciously exact)"


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_zero_rows_and_thread_count(name):
    x = weights(np.random.default_rng(4), 64, 512)
    x[7] = 0
    _C.set_num_threads(1)
    try:
        one = quantize(x, name)
    finally:
        _C.set_num_threads(0)
    assert np.array_equal(one, quantize(x, name))
    d = dequantize(one, name, x.shape)
    assert np.all(d[7] == 0) and np.isfinite(d).all()


def test_f32_is_a_copy():
    x = np.random.default_rng(5).standard_normal((3, 40)).astype(np.float32)
    assert np.array_equal(quantize(x, "F32"), x)


def test_errors():
    x = np.zeros((2, 96), np.float32)
    with pytest.raises(ValueError, match="block size 256"):
        quantize(x, "Q4_K")
    out = np.empty((2, 96 // 32 * 36), np.uint8)
    with pytest.raises(ValueError, match="quantize_weight: no quantizer for output dtype Q8_1"):
        _C.ops.quantize_weight((out, 9), x)
    with pytest.raises(ValueError, match="quantize_weight: src must be F32"):
        _C.ops.quantize_weight((np.empty((2, 54), np.uint8), ops.Q4_0), x.astype(np.float16))
    with pytest.raises(ValueError, match="differ in shape"):
        _C.ops.quantize_weight((np.empty((3, 54), np.uint8), ops.Q4_0), x)
