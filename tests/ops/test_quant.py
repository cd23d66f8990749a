"""GGUF block types: dequantization bit-exact with gguf.quants, and Q8_0/Q8_1 activation
quantization bit-exact with llama.cpp's reference (re-implemented in numpy below)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from vllmx import _C

BLOCK_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]


def rand(rng, shape):
    """Rows of varying scale, with a few outliers and negative/positive skew (never zeros)."""
    a = rng.standard_normal(shape).astype(np.float32)
    a *= np.exp(rng.uniform(-3, 3, size=shape[:-1] + (1,))).astype(np.float32)
    a += rng.uniform(-0.5, 0.5, size=shape[:-1] + (1,)).astype(np.float32) * np.abs(a).mean()
    mask = rng.random(shape) < 0.01
    a[mask] *= 20
    return a


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(1, 32), (7, 256), (3, 5, 96), (64, 2048)])
def test_dequantize_bit_exact(qtype, shape, reference):
    rng = np.random.default_rng([int(qtype), shape[-1], len(shape), reference])
    blocks = quants.quantize(rand(rng, shape), qtype)
    want = quants.dequantize(blocks, qtype)
    out = np.full(shape, np.nan, dtype=np.float32)
    _C.ops.dequantize(out, (blocks, int(qtype)), reference=reference)
    assert np.array_equal(bits(out), bits(want.astype(np.float32)))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_dequantize_random_bytes(qtype):
    """Arbitrary block bytes (any nibble, qh pattern, scale, incl. Q8_0's -128)."""
    rng = np.random.default_rng(int(qtype) + 100)
    _, ts = quants.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(9, 8 * ts), dtype=np.uint8)
    # keep the f16 scales finite and moderate: exponent bits in range
    per = blocks.reshape(9, 8, ts)
    nscale = 2 if qtype in (Q.Q4_0, Q.Q5_0, Q.Q8_0) else 4
    for off in range(0, nscale, 2):
        per[:, :, off + 1] = (per[:, :, off + 1] & 0x83) | 0x30
    want = quants.dequantize(blocks, qtype)
    for reference in (False, True):
        out = np.empty(want.shape, np.float32)
        _C.ops.dequantize(out, (blocks, int(qtype)), reference=reference)
        assert np.array_equal(bits(out), bits(want.astype(np.float32)))


@pytest.mark.parametrize("reference", [False, True])
def test_dequantize_f16_bf16_f32(reference):
    rng = np.random.default_rng(7)
    a = rand(rng, (6, 100))
    h = a.astype(np.float16)
    out = np.empty_like(a)
    _C.ops.dequantize(out, (h, int(Q.F16)), reference=reference)
    assert np.array_equal(bits(out), bits(quants.dequantize(h, Q.F16)))

    b = quants.quantize(a, Q.BF16).view(np.uint16)  # round-to-nearest-even bf16 bits
    out = np.empty_like(a)
    _C.ops.dequantize(out, (b, int(Q.BF16)), reference=reference)
    want = quants.dequantize(b.view(np.uint8), Q.BF16)
    assert np.array_equal(bits(out), bits(want))

    out = np.empty_like(a)
    _C.ops.dequantize(out, (a, int(Q.F32)), reference=reference)
    assert np.array_equal(bits(out), bits(a))


# ---- activation quantization ----------------------------------------------------------------

def np_quantize_q8(x, with_sum):
    """llama.cpp quantize_row_q8_0_ref / q8_1_ref, in f32 arithmetic."""
    rows, n = x.shape
    b = x.reshape(rows, n // 32, 32).astype(np.float32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * idv).astype(np.float32)
    q = np.trunc(v.astype(np.float64) + np.copysign(0.5, v)).astype(np.int8)  # roundf
    parts = [d.astype(np.float16).view(np.uint8)]
    if with_sum:
        s = (q.astype(np.int32).sum(axis=-1, keepdims=True).astype(np.float32) * d)
        parts.append(s.astype(np.float32).astype(np.float16).view(np.uint8))
    parts.append(q.view(np.uint8))
    return np.concatenate(parts, axis=-1).reshape(rows, -1)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q8_1], ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(1, 32), (5, 320), (33, 2048)])
def test_quantize_q8(qtype, shape, reference):
    rng = np.random.default_rng([int(qtype), shape[0], shape[1]])
    x = rand(rng, shape)
    want = np_quantize_q8(x, qtype == Q.Q8_1)
    ts = 34 if qtype == Q.Q8_0 else 36
    out = np.zeros((shape[0], shape[1] // 32 * ts), np.uint8)
    _C.ops.quantize((out, int(qtype)), x, reference=reference)
    assert np.array_equal(out, want)
    if qtype == Q.Q8_0:  # also agrees with gguf's own Q8_0 quantizer
        assert np.array_equal(out, quants.quantize(x, Q.Q8_0))


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q8_1], ids=lambda q: q.name)
def test_quantize_q8_ties(qtype, reference):
    """amax = 127 gives d = 1, so x.5 values are exact ties: roundf rounds them away from 0."""
    rng = np.random.default_rng(3)
    row = np.concatenate([[127.0], rng.integers(-120, 120, 31) + 0.5]).astype(np.float32)
    row[5], row[6], row[7], row[8] = 0.5, -0.5, 1.5, -2.5
    x = np.stack([row, -row[::-1], row * np.float32(0.25)])
    x = np.concatenate([x, x[:, ::-1]], axis=1).copy()
    want = np_quantize_q8(x, qtype == Q.Q8_1)
    out = np.zeros((3, 2 * (34 if qtype == Q.Q8_0 else 36)), np.uint8)
    _C.ops.quantize((out, int(qtype)), x, reference=reference)
    assert np.array_equal(out, want)


def test_quantize_all_zero_block():
    x = np.zeros((1, 64), np.float32)
    x[0, 32:] = np.linspace(-1, 1, 32, dtype=np.float32) + 0.01
    out = np.full((1, 72), 7, np.uint8)
    _C.ops.quantize((out, int(Q.Q8_1)), x)
    assert np.array_equal(out, np_quantize_q8(x, True))


# ---- errors ---------------------------------------------------------------------------------

def test_unsupported_type_raises():
    src = np.zeros((2, 256), np.int8)
    out = np.empty((2, 256), np.float32)
    with pytest.raises(ValueError, match="I8"):
        _C.ops.dequantize(out, (src, int(Q.I8)))
    x = np.ones((1, 32), np.float32)
    with pytest.raises(ValueError, match="Q4_0"):
        _C.ops.quantize((np.zeros((1, 18), np.uint8), int(Q.Q4_0)), x)


def test_bad_shapes_raise():
    rng = np.random.default_rng(1)
    blocks = quants.quantize(rand(rng, (4, 64)), Q.Q4_0)
    with pytest.raises(ValueError, match="dequantize"):
        _C.ops.dequantize(np.empty((4, 32), np.float32), (blocks, int(Q.Q4_0)))
    with pytest.raises(ValueError, match="dequantize"):
        _C.ops.dequantize(np.empty((4, 64), np.float16), (blocks, int(Q.Q4_0)))
    x = rand(rng, (2, 48))  # not whole blocks
    with pytest.raises(ValueError, match="quantize: out"):
        _C.ops.quantize((np.zeros((2, 68), np.uint8), int(Q.Q8_0)), x)
    with pytest.raises(ValueError, match="quantize"):
        _C.ops.quantize((np.zeros((3, 68), np.uint8), int(Q.Q8_0)), rand(rng, (2, 64)))
