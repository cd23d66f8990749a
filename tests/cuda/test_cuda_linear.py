"""CUDA linear (cuda/linear.cu) against the CPU ops and a float64 numpy reference on the same
random inputs, and the helpers the other CUDA kernel tests share (test_cuda_attention.py,
test_cuda_linear_sm90.py). bf16/f16 outputs: max error / max |reference| within the dtype's
tolerance. Skipped without a GPU."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from vllmx import _C, ops


def _cuda_ok() -> bool:
    try:
        return bool(_C.cuda_available()) and _C.ops.linear.has_kernel("cuda")
    except AttributeError:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_ok(), reason="needs a CUDA GPU")]

F32, F16, BF16 = (int(_C.DType[n]) for n in ("F32", "F16", "BF16"))
NAN_BITS = {F16: 0x7E00, BF16: 0x7FC0}
TOL = {F16: 4e-3, BF16: 1e-2}  # rel. error (max-normalized) of a 16-bit output


# ---------------------------------------------------------------- helpers


def device():
    from vllmx.device import DeviceArray

    return DeviceArray


def to_dev(a: np.ndarray, dtype: int | None = None):
    return device().from_numpy(np.ascontiguousarray(a), dtype=dtype)


def nan_out(shape, dt: int):
    """A device array of 16-bit NaNs: every element the op must write is checked."""
    return to_dev(np.full(shape, NAN_BITS[dt], np.uint16), dt)


def to_bits(x: np.ndarray, dt: int) -> np.ndarray:
    """f32 -> the raw uint16 bits of f16 / bf16 (round to nearest even)."""
    x = np.ascontiguousarray(x, np.float32)
    if dt == F16:
        return x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(b: np.ndarray, dt: int) -> np.ndarray:
    """Raw 16-bit bits -> float64 (exact)."""
    b = np.asarray(b)
    if dt == F16:
        return b.view(np.float16).astype(np.float64)
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, np.float64)
    assert np.isfinite(got).all(), "non-finite output (an element left unwritten?)"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


# ---------------------------------------------------------------- linear


def cuda_linear(x_bits, xdt, w, wdt, bias_bits=None):
    out = nan_out((x_bits.shape[0], w.shape[0]), xdt)
    b = None if bias_bits is None else to_dev(bias_bits, xdt)
    _C.ops.linear(out, to_dev(x_bits, xdt), (to_dev(w, wdt), wdt), b)
    return from_bits(out.numpy(), xdt)


def make_dense(rng, n, k, wdt):
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    bits = to_bits(w, wdt)
    return bits, from_bits(bits, wdt)


K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
IQ4 = {Q.IQ4_NL: (32, 18), Q.IQ4_XS: (256, 136)}  # block values, bytes


def make_block(rng, n, k, qtype):
    if qtype in IQ4:  # no quantizer writes them here: random codes and scales, a small f16 d
        values, nbytes = IQ4[qtype]
        blk = rng.integers(0, 256, (n, k // values, nbytes), dtype=np.uint8)
        d = rng.uniform(0.2, 1.0, (n, k // values)) / (np.sqrt(k) * (64 if qtype == Q.IQ4_NL
                                                                     else 2048))
        blk[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
        blocks = blk.reshape(n, -1)
        return blocks, quants.dequantize(blocks, qtype).astype(np.float64)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    w += np.float32(0.02) * rng.standard_normal((n, 1)).astype(np.float32)
    # (gguf-py quantizes the 32-element types; the k-quants by llama.cpp's reference quantizer)
    blocks = (ops.quantize_weight(w, int(qtype)) if qtype in K_QUANTS
              else quants.quantize(w, qtype))
    return blocks, quants.dequantize(blocks, qtype).astype(np.float64)


def make_x(rng, t, k, xdt):
    x = rng.standard_normal((t, k)).astype(np.float32)
    x *= np.exp(rng.uniform(-1, 1, (t, 1))).astype(np.float32)
    bits = to_bits(x, xdt)
    return bits, from_bits(bits, xdt)


T_SIZES = [1, 4, 8, 9, 37, 512]
NK_SIZES = [(576, 576), (77, 1536), (1000, 64), (3, 4096)]


@pytest.mark.parametrize("nk", NK_SIZES, ids=lambda s: f"N{s[0]}K{s[1]}")
@pytest.mark.parametrize("t", T_SIZES)
@pytest.mark.parametrize("xdt,wdt", [(BF16, BF16), (F16, F16), (BF16, F16), (F16, BF16)],
                         ids=["bf16", "f16", "x_bf16_w_f16", "x_f16_w_bf16"])
def test_linear_dense(xdt, wdt, t, nk):
    n, k = nk
    rng = np.random.default_rng([xdt, wdt, t, n, k])
    w, w64 = make_dense(rng, n, k, wdt)
    x, x64 = make_x(rng, t, k, xdt)
    bias = to_bits(rng.standard_normal(n).astype(np.float32) * 0.1, xdt)
    for b in (None, bias):
        want = x64 @ w64.T + (0 if b is None else from_bits(b, xdt))
        got = cuda_linear(x, xdt, w, wdt, b)
        assert rel_err(got, want) < TOL[xdt]
        # The CPU op on the same (upcast) inputs: f32 math.
        cpu = np.empty((t, n), np.float32)
        _C.ops.linear(cpu, x64.astype(np.float32), (w, wdt),
                      None if b is None else from_bits(b, xdt).astype(np.float32))
        assert rel_err(got, cpu.astype(np.float64)) < TOL[xdt]


@pytest.mark.parametrize("t", [1, 3, 8, 37])
def test_linear_dense_large_n(t):
    """A vocabulary-sized projection (many GEMM tiles along N; from T = 3 on Hopper's narrow
    CUTLASS tile)."""
    rng = np.random.default_rng(t)
    n, k = 49152, 576
    w, w64 = make_dense(rng, n, k, BF16)
    x, x64 = make_x(rng, t, k, BF16)
    assert rel_err(cuda_linear(x, BF16, w, BF16), x64 @ w64.T) < TOL[BF16]


@pytest.mark.parametrize("k", [8, 24, 100, 72])
@pytest.mark.parametrize("t", [1, 5, 20])
def test_linear_odd_k(t, k):
    """K not a multiple of 8 takes the generic kernel; multiples of 8 but not of the tile K
    take the tensor-core paths with zero-filled tails."""
    rng = np.random.default_rng([t, k])
    w, w64 = make_dense(rng, 33, k, F16)
    x, x64 = make_x(rng, t, k, F16)
    assert rel_err(cuda_linear(x, F16, w, F16), x64 @ w64.T) < TOL[F16]


@pytest.mark.parametrize("nk", [(576, 576), (130, 4096), (1536, 32)],
                         ids=lambda s: f"N{s[0]}K{s[1]}")
@pytest.mark.parametrize("t", T_SIZES)
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize("xdt", [BF16, F16], ids=["bf16", "f16"])
def test_linear_blocks(xdt, qtype, t, nk):
    """Block weights are dequantized exactly (gguf's numbers); the activations are NOT quantized
    on the GPU (unlike the CPU op), so the oracle is the f64 product of the dequantized weights."""
    check_linear_blocks(xdt, qtype, t, *nk)


def check_linear_blocks(xdt, qtype, t, n, k):
    """linear over a block weight, with and without a bias, against the f64 oracle; returns
    the weight and its exact values."""
    rng = np.random.default_rng([xdt, int(qtype), t, n, k])
    w, w64 = make_block(rng, n, k, qtype)
    x, x64 = make_x(rng, t, k, xdt)
    bias = to_bits(rng.standard_normal(n).astype(np.float32) * 0.1, xdt)
    for b in (None, bias):
        want = x64 @ w64.T + (0 if b is None else from_bits(b, xdt))
        assert rel_err(cuda_linear(x, xdt, w, int(qtype), b), want) < TOL[xdt]
    return w, w64, x64


@pytest.mark.parametrize("nk", [(576, 512), (130, 4096), (1536, 256), (3, 2816)],
                         ids=lambda s: f"N{s[0]}K{s[1]}")
@pytest.mark.parametrize("t", T_SIZES)
@pytest.mark.parametrize("qtype", K_QUANTS + tuple(IQ4), ids=lambda q: q.name)
@pytest.mark.parametrize("xdt", [BF16, F16], ids=["bf16", "f16"])
def test_linear_k_quants(xdt, qtype, t, nk):
    """Q4_K / Q5_K / Q6_K weights (a Q4_K_M or Q5_K_M file's) and IQ4_NL / IQ4_XS through the
    GEMV, the quantized skinny GEMM (T = 4-9), the mma.sync GEMMs (dequantized by 8-element
    chunks of their blocks) and, in f32,
    the generic kernel: each against the f64 product of gguf's dequantized weights, which the
    GPU's dequantization matches bit for bit (the CPU's formulas, no FMA contraction)."""
    n, k = nk
    w, w64, x64 = check_linear_blocks(xdt, qtype, t, n, k)
    if t <= 9:
        x32 = x64.astype(np.float32)
        out = to_dev(np.full((t, n), np.nan, np.float32))
        _C.ops.linear(out, to_dev(x32), (to_dev(w, int(qtype)), int(qtype)))
        assert rel_err(out.numpy(), x32.astype(np.float64) @ w64.T) < 1e-5


@pytest.mark.parametrize("nk", [(4096, 4096), (1000, 2048), (77, 1536), (200, 64), (300, 1000),
                                (130, 4104)],
                         ids=lambda s: f"N{s[0]}K{s[1]}")
@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_linear_skinny(dt, nk):
    """3 <= T <= 32 with x and w of one dtype take the skinny GEMM (split-K where N gives few
    tiles; on Hopper products up to 4096 x 4096, like all of these, and those its TMA kernel
    takes stay on it past T = 11, where the CUTLASS GEMM's narrow swapped tiles take other
    larger ones; 4096 x 4096 is on the TMA kernel there): right against f64 at every
    token tile width, and a row's bits do not depend on the batch around it within the kernel's
    range or on the launch (the split partials are summed in a fixed order); past the range the
    other GEMMs take over, still right."""
    n, k = nk
    rng = np.random.default_rng([dt, n, k])
    w, w64 = make_dense(rng, n, k, dt)
    x, x64 = make_x(rng, 40, k, dt)
    bias = to_bits(rng.standard_normal(n).astype(np.float32) * 0.1, dt)
    want = x64 @ w64.T + from_bits(bias, dt)
    rows = {}
    for t in (3, 4, 5, 8, 11, 12, 16, 17, 24, 32, 33, 40):
        got = cuda_linear(np.ascontiguousarray(x[:t]), dt, w, dt, bias)
        assert rel_err(got, want[:t]) < TOL[dt], t
        rows[t] = got[:3]
    again = cuda_linear(np.ascontiguousarray(x[:17]), dt, w, dt, bias)[:3]
    assert np.array_equal(again, rows[17])
    assert all(np.array_equal(rows[t], rows[5]) for t in (3, 4, 8, 11, 12, 16, 17, 24, 32))


@pytest.mark.parametrize("nk", [(6390, 1024), (4040, 1024), (2000, 4096), (4096, 14336),
                                (6100, 2048)],
                         ids=lambda s: f"N{s[0]}K{s[1]}")
@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_linear_skinny_bulk(dt, nk):
    """The skinny GEMM forced for every T up to 32: on Hopper these shapes (K a multiple of 128,
    tiles x splits filling most SMs) take its bulk-copy kernel (gemm_skinny_bulk_sm90.cu) —
    6390 rows unsplit with a 54-row last tile, 4040 split in two with an 8-row one, 2000 in four
    with 16, the 14336-deep down_proj, and 6100 rows (96 tiles) two CTAs an SM, split in two,
    with 20 — elsewhere the cp.async one. Right against f64, a row's bits the same at every T
    and on a second launch."""
    n, k = nk
    rng = np.random.default_rng([dt, n, k, 1])
    w, w64 = make_dense(rng, n, k, dt)
    x, x64 = make_x(rng, 32, k, dt)
    want = x64 @ w64.T
    rows = {}
    _C.cuda_linear_tuning(path="skinny")
    try:
        for t in (3, 5, 8, 16, 17, 24, 32):
            got = cuda_linear(np.ascontiguousarray(x[:t]), dt, w, dt)
            assert rel_err(got, want[:t]) < TOL[dt], t
            rows[t] = got[:3]
        again = cuda_linear(np.ascontiguousarray(x[:24]), dt, w, dt)[:3]
    finally:
        _C.cuda_linear_tuning()
    assert np.array_equal(again, rows[24])
    assert all(np.array_equal(rows[t], rows[3]) for t in rows)


@pytest.mark.parametrize("nk", [(1000, 4096), (77, 2816)], ids=lambda s: f"N{s[0]}K{s[1]}")
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1] + list(K_QUANTS) + list(IQ4),
                         ids=lambda q: q.name)
@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_linear_skinny_blocks(dt, qtype, nk):
    """2 <= T <= 32 rows (from 1 for Q4_K and Q6_K) over block weights with K a multiple of 256
    take the quantized skinny GEMM (the blocks copied 16 bytes at a time, rows at any offset
    from a 16-byte boundary: Q6_K's 210- and IQ4_XS's 136-byte blocks on 2816-element rows;
    split-K over 4096; 8-, 16- and 32-token tiles): right against f64 at every tile width, and
    a row's bits do not depend on the batch around it (the splits are a function of N, K and
    the block type, summed in order)."""
    n, k = nk
    rng = np.random.default_rng([dt, int(qtype), n, k])
    w, w64 = make_block(rng, n, k, qtype)
    x, x64 = make_x(rng, 33, k, dt)
    bias = to_bits(rng.standard_normal(n).astype(np.float32) * 0.1, dt)
    want = x64 @ w64.T + from_bits(bias, dt)
    rows = {}
    for t in (1, 2, 3, 8, 9, 16, 17, 32, 33):
        got = cuda_linear(np.ascontiguousarray(x[:t]), dt, w, int(qtype), bias)
        assert rel_err(got, want[:t]) < TOL[dt], t
        rows[t] = got[:1]
    # (one row: the GEMV's for the 32-blocks, the skinny GEMM's for Q4_K and Q6_K)
    same = (1, 3, 8, 9, 16, 17, 32) if qtype in (Q.Q4_K, Q.Q6_K) else (3, 8, 9, 16, 17, 32)
    assert all(np.array_equal(rows[t], rows[2]) for t in same)


def test_linear_f32_activations_generic():
    """f32 x/out run the generic kernel (any weight type)."""
    rng = np.random.default_rng(3)
    w, w64 = make_block(rng, 40, 96, Q.Q4_1)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    out = to_dev(np.full((6, 40), np.nan, np.float32))
    _C.ops.linear(out, to_dev(x), (to_dev(w, int(Q.Q4_1)), int(Q.Q4_1)))
    assert rel_err(out.numpy(), x.astype(np.float64) @ w64.T) < 1e-5


def test_linear_bad_args():
    x = to_dev(np.zeros((4, 64), np.uint16), BF16)
    w = to_dev(np.zeros((8, 32), np.uint16), BF16)
    out = nan_out((4, 8), BF16)
    with pytest.raises(ValueError, match="linear"):
        _C.ops.linear(out, x, (w, BF16))
    w = to_dev(np.zeros((8, 64), np.uint16), BF16)
    with pytest.raises(ValueError, match="linear"):
        _C.ops.linear(nan_out((4, 8), F16), x, (w, BF16))  # out dtype != x dtype
    with pytest.raises(ValueError, match="linear"):
        _C.ops.linear(nan_out((4, 9), BF16), x, (w, BF16))
