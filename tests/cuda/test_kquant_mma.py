"""The quantized skinny GEMM's Q4_K, Q5_K and Q6_K stages, checked on the CPU (no GPU
needed): the warp's threads run cuda/kquant_mma.cuh's functions (what each reads of a
super-block and of x, the A registers built from the codes, each sub-block's scale and min
applied to its product) with every mma.sync emulated from PTX's fragment layouts
(kquant_mma_emulated.cpp). Their output must be the f64 product of gguf's dequantized weights:
a thread reading the wrong bytes, a wrong byte permute, a k order A and B do not share, or a
scale on the wrong sub-block is off by far more than f32 rounding. The GPU tests
(test_cuda_linear.py) run the kernel."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA_DIR = os.path.join(HERE, "..", "..", "cuda")
CXX = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler")
    exe = str(tmp_path_factory.mktemp("kq") / "kquant_mma_emulated")
    subprocess.run([CXX, "-std=c++20", "-O1", "-Wall", "-Werror", "-I", CUDA_DIR,
                    os.path.join(HERE, "kquant_mma_emulated.cpp"), "-o", exe], check=True)
    return exe


def bits16(x: np.ndarray, bf16: bool) -> np.ndarray:
    """x's bf16 (round to nearest even) or f16 bits, and the values they hold."""
    if bf16:
        u = x.astype(np.float32).view(np.uint32)
        b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return b, (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    h = x.astype(np.float16)
    return h.view(np.uint16), h.astype(np.float64)


TYPES = {"Q4_K": 0, "Q6_K": 1, "Q5_K": 2}  # the emulator's stage


def quantize(w: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of w by llama.cpp's reference quantizer (vllmx's op), and their values."""
    from vllmx import ops

    blocks = np.ascontiguousarray(ops.quantize_weight(w.astype(np.float32),
                                                      ops.QUANTIZE_TYPES[qtype]), np.uint8)
    q = gguf.GGMLQuantizationType[qtype]
    return blocks, gguf.quants.dequantize(blocks, q).astype(np.float64)


def run(emulator, qtype: str, blocks: np.ndarray, xbits: np.ndarray, bf16: bool) -> np.ndarray:
    t = xbits.shape[0]
    payload = (np.array([TYPES[qtype], int(bf16), t], np.int32).tobytes() + blocks.tobytes()
               + xbits.astype(np.uint16).tobytes())
    out = subprocess.run([emulator], input=payload, capture_output=True, check=True).stdout
    return np.frombuffer(out, np.float32).reshape(16, t).astype(np.float64)


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "f16"])
@pytest.mark.parametrize("t", [1, 3, 8])
@pytest.mark.parametrize("qtype", list(TYPES))
def test_stage_is_the_dequantized_product(emulator, qtype, bf16, t):
    rng = np.random.default_rng([TYPES[qtype], int(bf16), t,
                                 int.from_bytes(os.urandom(4), "little")])
    # Rows of different ranges, and an all-positive and an all-negative row (a min of 0 / a
    # large min), so that scales and mins both matter.
    w = rng.standard_normal((16, 256)) * rng.uniform(0.005, 0.2, (16, 1))
    w[3] = np.abs(w[3])
    w[11] = -np.abs(w[11]) - 0.05
    blocks, w64 = quantize(w, qtype)
    xbits, x64 = bits16(rng.standard_normal((t, 256)) * 2.0, bf16)
    got = run(emulator, qtype, blocks, xbits, bf16)
    want = w64 @ x64.T
    scale = np.abs(w64) @ np.abs(x64).T  # the sum's magnitude, what f32 rounding is relative to
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), np.max(np.abs(got - want) / scale)


@pytest.mark.parametrize("qtype", list(TYPES))
def test_a_wrong_mapping_is_seen(emulator, qtype):
    """The check above can fail: the same blocks with one code byte's nibbles swapped in one
    row (what a thread reading the wrong byte would compute) are far off there, right elsewhere."""
    rng = np.random.default_rng(7)
    blocks, w64 = quantize(rng.standard_normal((16, 256)) * 0.05, qtype)
    xbits, x64 = bits16(rng.standard_normal((1, 256)), True)
    bad = blocks.copy()
    at = {"Q4_K": 56, "Q5_K": 88, "Q6_K": 40}[qtype]  # a byte of qs / ql
    bad[5, at] = ((bad[5, at] & 0xF) << 4) | (bad[5, at] >> 4)
    if bad[5, at] == blocks[5, at]:
        bad[5, at] ^= 0x11
    got = run(emulator, qtype, bad, xbits, True)
    want = w64 @ x64.T
    scale = np.abs(w64) @ np.abs(x64).T
    assert np.abs(got - want)[5, 0] > 10 * 1e-5 * scale[5, 0]  # ten times the tolerance
    assert np.all(np.abs(got - want)[np.arange(16) != 5] <= 1e-5 * scale[np.arange(16) != 5])
