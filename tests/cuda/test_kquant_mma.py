"""The quantized skinny GEMM's Q4_K stage, checked on the CPU (no GPU needed): the warp's
threads run cuda/kquant_mma.cuh's functions (what each reads of a super-block and of x, the A
registers built from the 4-bit codes, each sub-block's scale and min applied to its product)
with every mma.sync emulated from PTX's fragment layouts (kquant_mma_emulated.cpp). Their
output must be the f64 product of gguf's dequantized weights: a thread reading the wrong bytes,
a wrong byte permute, a k order A and B do not share, or a scale on the wrong sub-block is off
by far more than f32 rounding. The GPU tests (test_cuda_linear_attention.py) run the kernel."""

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


def q4k(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K blocks of w by llama.cpp's reference quantizer (vllmx's op), and their values."""
    from vllmx import ops

    blocks = np.ascontiguousarray(ops.quantize_weight(w.astype(np.float32),
                                                      ops.QUANTIZE_TYPES["Q4_K"]), np.uint8)
    q = gguf.GGMLQuantizationType.Q4_K
    return blocks, gguf.quants.dequantize(blocks, q).astype(np.float64)


def run(emulator, blocks: np.ndarray, xbits: np.ndarray, bf16: bool) -> np.ndarray:
    t = xbits.shape[0]
    payload = (np.array([int(bf16), t], np.int32).tobytes() + blocks.tobytes()
               + xbits.astype(np.uint16).tobytes())
    out = subprocess.run([emulator], input=payload, capture_output=True, check=True).stdout
    return np.frombuffer(out, np.float32).reshape(16, t).astype(np.float64)


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "f16"])
@pytest.mark.parametrize("t", [1, 3, 8])
def test_q4k_stage_is_the_dequantized_product(emulator, bf16, t):
    rng = np.random.default_rng([int(bf16), t, int.from_bytes(os.urandom(4), "little")])
    # Rows of different ranges, and an all-positive and an all-negative row (a min of 0 / a
    # large min), so that scales and mins both matter.
    w = rng.standard_normal((16, 256)) * rng.uniform(0.005, 0.2, (16, 1))
    w[3] = np.abs(w[3])
    w[11] = -np.abs(w[11]) - 0.05
    blocks, w64 = q4k(w)
    xbits, x64 = bits16(rng.standard_normal((t, 256)) * 2.0, bf16)
    got = run(emulator, blocks, xbits, bf16)
    want = w64 @ x64.T
    scale = np.abs(w64) @ np.abs(x64).T  # the sum's magnitude, what f32 rounding is relative to
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), np.max(np.abs(got - want) / scale)


def test_a_wrong_mapping_is_seen(emulator):
    """The check above can fail: the same blocks with two codes' nibbles swapped in one row
    (what a thread reading the wrong byte would compute) are far off."""
    rng = np.random.default_rng(7)
    blocks, w64 = q4k(rng.standard_normal((16, 256)) * 0.05)
    xbits, x64 = bits16(rng.standard_normal((1, 256)), True)
    bad = blocks.copy()
    bad[5, 16 + 40] = ((bad[5, 16 + 40] & 0xF) << 4) | (bad[5, 16 + 40] >> 4)
    if bad[5, 56] == blocks[5, 56]:
        bad[5, 56] ^= 0x11
    got = run(emulator, bad, xbits, True)
    want = w64 @ x64.T
    scale = np.abs(w64) @ np.abs(x64).T
    assert np.abs(got - want)[5, 0] > 1e-3 * scale[5, 0]
    assert np.all(np.abs(got - want)[np.arange(16) != 5] <= 1e-5 * scale[np.arange(16) != 5])
