"""k-quants (Q2_K..Q6_K weights, Q8_K activations): dequantization bit-exact with gguf.quants,
Q8_K quantization bit-exact with llama.cpp's quantize_row_q8_K_ref (re-implemented in numpy
below), linear against float64 numpy, fast path vs scalar twin, batch invariance, and every
SIMD level. gguf cannot quantize k-quants, so weights are random block bytes with finite f16
scales (every quant bit pattern and scale value occurs)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from rounding import rounding_rel
from simd_levels import SIMD_LEVELS, run_capped

from vllmx import _C

K_TYPES = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# Byte offsets of the f16 fields (d, dmin) in each block.
F16_FIELDS = {Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
Q8_K_SIZE = 292


def rand_blocks(rng, qtype, rows, k):
    """Random blocks; the f16 fields get sign and low mantissa bits at random and an exponent
    of 2^-3..2^-2, so they are finite and moderate."""
    ts = quants.GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, size=(rows, k // 256, ts), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        b[..., off + 1] = (b[..., off + 1] & 0x83) | 0x30
    return b.reshape(rows, k // 256 * ts)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(1, 256), (7, 768), (3, 2, 512)])
def test_dequantize_bit_exact(qtype, shape, reference):
    rng = np.random.default_rng([int(qtype), shape[-1], len(shape)])
    rows = int(np.prod(shape[:-1]))
    blocks = rand_blocks(rng, qtype, rows, shape[-1]).reshape(shape[:-1] + (-1,))
    want = quants.dequantize(blocks, qtype).astype(np.float32)
    out = np.full(shape, np.nan, dtype=np.float32)
    _C.ops.dequantize(out, (blocks, int(qtype)), reference=reference)
    assert np.array_equal(bits(out), bits(want))


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
def test_dequantize_extreme_blocks(qtype):
    """All-zero and all-ones quant bytes (lowest / highest quants, every high bit set)."""
    rng = np.random.default_rng(int(qtype) + 10)
    blocks = rand_blocks(rng, qtype, 2, 512)
    ts = quants.GGML_QUANT_SIZES[qtype][1]
    per = blocks.reshape(2, 2, ts)
    keep = np.zeros(ts, bool)
    for off in F16_FIELDS[qtype]:
        keep[off:off + 2] = True
    per[0][:, ~keep] = 0
    per[1][:, ~keep] = 0xFF
    want = quants.dequantize(blocks, qtype).astype(np.float32)
    out = np.empty(want.shape, np.float32)
    _C.ops.dequantize(out, (blocks, int(qtype)))
    assert np.array_equal(bits(out), bits(want))


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
def test_embedding_rows(qtype):
    """Embedding lookup of k-quant rows (Gemma's token table is Q6_K in some files)."""
    rng = np.random.default_rng(int(qtype) + 20)
    table = rand_blocks(rng, qtype, 11, 512)
    ids = np.array([3, 0, 10, 3, 7], np.int32)
    out = np.empty((5, 512), np.float32)
    _C.ops.embedding(out, ids, (table, int(qtype)))
    want = quants.dequantize(table, qtype).astype(np.float32)[ids]
    assert np.array_equal(bits(out), bits(want))


# ---- Q8_K activation quantization -----------------------------------------------------------

def np_quantize_q8_K(x):
    """llama.cpp quantize_row_q8_K_ref in f32: iscale = -127 / (signed value of the largest
    magnitude, first on ties), q = min(127, round-half-even(iscale * x)), d = 1 / iscale; an
    all-zero block is all zeros."""
    rows, n = x.shape
    b = x.reshape(rows, n // 256, 256).astype(np.float32)
    idx = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, idx, -1)
    zero = mx == 0
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-127) / np.where(zero, 1, mx))
        d = np.where(zero, np.float32(0), np.float32(1) / np.where(zero, 1, iscale))
    q = np.minimum(np.rint((iscale.astype(np.float32) * b).astype(np.float32)), 127)
    q = q.astype(np.int8)
    bsums = q.reshape(rows, n // 256, 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
    parts = [d.astype(np.float32).view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)]
    return np.concatenate(parts, axis=-1).reshape(rows, -1)


def quantize_q8_K(x, reference=False):
    out = np.zeros((x.shape[0], x.shape[1] // 256 * Q8_K_SIZE), np.uint8)
    _C.ops.quantize((out, int(Q.Q8_K)), x, reference=reference)
    return out


def make_x(rng, t, k, outliers=True):
    x = rng.standard_normal((t, k)).astype(np.float32)
    x *= np.exp(rng.uniform(-1, 1, (t, 1))).astype(np.float32)
    if outliers:  # a few, like real activations
        x[rng.random((t, k)) < 0.005] *= 10
    return x


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("shape", [(1, 256), (5, 768), (33, 2048)])
def test_quantize_q8_K(shape, reference):
    rng = np.random.default_rng(list(shape))
    x = make_x(rng, *shape)
    assert np.array_equal(quantize_q8_K(x, reference), np_quantize_q8_K(x))


@pytest.mark.parametrize("reference", [False, True])
def test_quantize_q8_K_ties_and_zeros(reference):
    """max = -127 gives iscale = 1: x.5 values are exact ties (to even); +127 and -127 both
    present: the first decides the sign; an all-zero block."""
    rng = np.random.default_rng(4)
    a = (rng.integers(-120, 120, 256) + 0.5).astype(np.float32)
    a[:6] = [-127, 0.5, -0.5, 1.5, -2.5, 127]
    b = rng.standard_normal(256).astype(np.float32)
    b[[9, 200]] = [50, -50]
    x = np.stack([np.concatenate([a, b, np.zeros(256, np.float32)]),
                  np.concatenate([-a, np.zeros(256, np.float32), b * np.float32(1e-3)])])
    assert np.array_equal(quantize_q8_K(x, reference), np_quantize_q8_K(x))


# ---- linear ---------------------------------------------------------------------------------

def run(x, w, qtype, bias=None, reference=False):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    _C.ops.linear(out, x, (w, int(qtype)), bias, reference=reference)
    return out


def quantized_x(x):
    """x as the Q8_K activations the kernel multiplies, in f64."""
    blk = quantize_q8_K(x).reshape(x.shape[0], -1, Q8_K_SIZE)
    d = blk[..., 0:4].copy().view(np.float32).astype(np.float64)
    q = blk[..., 4:260].copy().view(np.int8).astype(np.float64)
    return (d * q).reshape(x.shape)


@pytest.mark.parametrize("k", [256, 2048])
@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
def test_linear_vs_numpy(qtype, t, k):
    rng = np.random.default_rng([int(qtype), t, k])
    n = int(rng.choice([1, 7, 33, 97]))
    w = rand_blocks(rng, qtype, n, k)
    w64 = quants.dequantize(w, qtype).astype(np.float64)
    # Without outliers here: one Q8_K scale spans 256 values, so a x10 outlier coarsens the
    # whole block (the f32 check against the Q8_K activations holds either way; see batch tests).
    x = make_x(rng, t, k, outliers=False)
    bias = rng.standard_normal(n).astype(np.float32)
    for b in (None, bias):
        b64 = 0 if b is None else b.astype(np.float64)
        want = x.astype(np.float64) @ w64.T + b64
        xq = quantized_x(x)
        fast = run(x, w, qtype, b)
        ref = run(x, w, qtype, b, reference=True)
        # exact up to f32 rounding against the Q8_K activations the kernel uses ...
        assert rounding_rel(fast, xq, w64, b64) < 1e-5
        # ... and within the activation-quantization error of the exact product (norm-wise
        # over enough outputs that one cancelling dot product does not decide it)
        if n * t >= 32:
            assert np.linalg.norm(fast - want) / np.linalg.norm(want) < 3e-2
        # the integer parts are exact and the f32 part is shared: twins agree bit for bit
        assert np.array_equal(bits(fast), bits(ref))


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
def test_batch_invariance(qtype):
    """Row t of a batched call equals that row computed alone or elsewhere in a bigger batch,
    bit for bit (threaded sizes)."""
    rng = np.random.default_rng(int(qtype) + 200)
    n, k = 515, 2048
    w = rand_blocks(rng, qtype, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    x = make_x(rng, 17, k)
    full = run(x, w, qtype, bias)
    for t in (0, 1, 2, 5, 16):
        alone = run(x[t:t + 1].copy(), w, qtype, bias)
        assert np.array_equal(bits(full[t]), bits(alone[0])), t
    for t, start in ((3, 0), (3, 14), (6, 7)):
        part = run(x[start:start + t].copy(), w, qtype, bias)
        assert np.array_equal(bits(part), bits(full[start:start + t]))
    big = make_x(rng, 40, k)
    big[20:37] = x
    assert np.array_equal(bits(run(big, w, qtype, bias)[20:37]), bits(full))


def test_k_not_whole_blocks_raises():
    rng = np.random.default_rng(1)
    w = rand_blocks(rng, Q.Q4_K, 4, 512)
    with pytest.raises(ValueError, match="linear"):
        run(make_x(rng, 2, 384), w, Q.Q4_K)


_ISA_SCRIPT = r"""
import numpy as np
from gguf import GGMLQuantizationType as Q, quants
from vllmx import _C
F16 = {Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
rng = np.random.default_rng(5)
for qt, offs in F16.items():
    ts = quants.GGML_QUANT_SIZES[qt][1]
    for n, k, t in [(37, 2048, 5), (300, 1024, 1), (5, 256, 9)]:
        w = rng.integers(0, 256, size=(n, k // 256, ts), dtype=np.uint8)
        for off in offs:
            w[..., off + 1] = (w[..., off + 1] & 0x83) | 0x30
        w = w.reshape(n, -1)
        x = rng.standard_normal((t, k)).astype(np.float32)
        outs = []
        for ref in (False, True):
            o = np.empty((t, n), np.float32)
            _C.ops.linear(o, x, (w, int(qt)), None, reference=ref)
            outs.append(o)
        assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), (qt, n, k, t)
        qx = [np.zeros((t, k // 256 * 292), np.uint8) for _ in range(2)]
        _C.ops.quantize((qx[0], int(Q.Q8_K)), x, reference=False)
        _C.ops.quantize((qx[1], int(Q.Q8_K)), x, reference=True)
        assert np.array_equal(qx[0], qx[1])
print("ok")
"""


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_each_isa_matches_reference(isa):
    """Each SIMD level (capped with VLLMX_ISA) agrees with the scalar twin bit for bit."""
    r = run_capped(isa, _ISA_SCRIPT)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
