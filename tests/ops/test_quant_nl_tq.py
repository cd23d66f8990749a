"""Table and ternary block types (IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0): dequantization
bit-exact with gguf.quants, linear against float64 numpy, scalar twin vs every SIMD level, batch
invariance, embedding and the GGUF loader. Weights are fresh random block bytes each run (every
code pattern occurs) with finite, moderate scales; the seed is in every failure message."""
import inspect
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, quants

from rounding import rounding_rel
from simd_levels import SIMD_LEVELS, run_capped

from vllmx import _C, ops
from vllmx.loader.gguf import load_gguf

TYPES = [Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4, Q.TQ1_0, Q.TQ2_0]
# Byte offsets of each block's f16 scale fields (MXFP4's scale is the E8M0 byte 0).
F16_FIELDS = {Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.TQ1_0: [52], Q.TQ2_0: [64], Q.MXFP4: []}
# The activation type each pairs with (as in llama.cpp), and its (block size, block bytes).
ACT = {Q.IQ4_NL: Q.Q8_0, Q.MXFP4: Q.Q8_0, Q.IQ4_XS: Q.Q8_K, Q.TQ1_0: Q.Q8_K, Q.TQ2_0: Q.Q8_K}
ACT_SIZE = {Q.Q8_0: (32, 34), Q.Q8_K: (256, 292)}


def rand_blocks(rng, qtype, rows, k):
    """Random blocks; f16 scales get a random sign and mantissa with an exponent of 2^-3..2^0,
    E8M0 scales 2^-10..2^7 (finite, never zero)."""
    bs, ts = quants.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(rows, k // bs, ts), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        b[..., off + 1] = (b[..., off + 1] & 0x83) | 0x30
    if qtype == Q.MXFP4:
        b[..., 0] = rng.integers(118, 136, size=b.shape[:2])
    return b.reshape(rows, k // bs * ts)


class SeededRng:
    """numpy's Generator with its seed kept for failure messages."""

    def __init__(self, seed):
        self.seed = seed
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self._g, name)


@pytest.fixture
def rng():
    """A fresh generator per test (set VLLMX_TEST_SEED to replay a failure's seed)."""
    return SeededRng(int(os.environ.get("VLLMX_TEST_SEED", np.random.SeedSequence().entropy)))


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def block_size(qtype):
    return quants.GGML_QUANT_SIZES[qtype][0]


def test_type_info_supported():
    for qt in TYPES:
        name, bs, ts, quantized, supported = _C.type_info(int(qt))
        assert (name, (bs, ts), quantized, supported) == (
            qt.name, quants.GGML_QUANT_SIZES[qt], True, True)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(1, 256), (7, 768), (3, 2, 512)])
def test_dequantize_bit_exact(rng, qtype, shape, reference):
    rows = int(np.prod(shape[:-1]))
    blocks = rand_blocks(rng, qtype, rows, shape[-1]).reshape(shape[:-1] + (-1,))
    want = quants.dequantize(blocks, qtype).astype(np.float32)
    out = np.full(shape, np.nan, dtype=np.float32)
    _C.ops.dequantize(out, (blocks, int(qtype)), reference=reference)
    assert np.array_equal(bits(out), bits(want)), rng.seed


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_dequantize_extreme_blocks(rng, qtype):
    """All-zero and all-ones code bytes (first / last table entry, TQ2_0's code 3, every trit
    of TQ1_0 at its largest)."""
    blocks = rand_blocks(rng, qtype, 2, 512)
    ts = quants.GGML_QUANT_SIZES[qtype][1]
    per = blocks.reshape(2, 512 // block_size(qtype), ts)
    keep = np.zeros(ts, bool)
    for off in F16_FIELDS[qtype]:
        keep[off:off + 2] = True
    keep[0] |= qtype == Q.MXFP4
    per[0][:, ~keep] = 0
    per[1][:, ~keep] = 0xFF
    want = quants.dequantize(blocks, qtype).astype(np.float32)
    out = np.empty(want.shape, np.float32)
    _C.ops.dequantize(out, (blocks, int(qtype)))
    assert np.array_equal(bits(out), bits(want)), rng.seed


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_embedding_and_to_float32(rng, qtype):
    table = rand_blocks(rng, qtype, 11, 512)
    want = quants.dequantize(table, qtype).astype(np.float32)
    ids = np.array([3, 0, 10, 3, 7], np.int32)
    w = ops.Weight(table, int(qtype), (11, 512))
    assert np.array_equal(bits(ops.embedding(ids, w)), bits(want[ids])), rng.seed
    assert np.array_equal(bits(w.to_float32()), bits(want)), rng.seed


# ---- linear ---------------------------------------------------------------------------------

def run(x, w, qtype, bias=None, reference=False):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    _C.ops.linear(out, x, (w, int(qtype)), bias, reference=reference)
    return out


def quantized_x(x, act):
    """x as the 8-bit activations the kernel multiplies (Q8_0 or Q8_K), in f64."""
    bs, ts = ACT_SIZE[act]
    blk = np.zeros((x.shape[0], x.shape[1] // bs * ts), np.uint8)
    _C.ops.quantize((blk, int(act)), x)
    blk = blk.reshape(x.shape[0], -1, ts)
    if act == Q.Q8_0:
        d = blk[..., 0:2].copy().view(np.float16).astype(np.float64)
        q = blk[..., 2:34].copy().view(np.int8).astype(np.float64)
    else:
        d = blk[..., 0:4].copy().view(np.float32).astype(np.float64)
        q = blk[..., 4:260].copy().view(np.int8).astype(np.float64)
    return (d * q).reshape(x.shape)


def make_x(rng, t, k):
    x = rng.standard_normal((t, k)).astype(np.float32)
    return x * np.exp(rng.uniform(-1, 1, (t, 1))).astype(np.float32)


@pytest.mark.parametrize("k", [256, 2304])
@pytest.mark.parametrize("t", [1, 3, 17, 64])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_linear_vs_numpy(rng, qtype, t, k):
    n = int(rng.choice([1, 7, 33, 97]))
    w = rand_blocks(rng, qtype, n, k)
    w64 = quants.dequantize(w, qtype).astype(np.float64)
    x = make_x(rng, t, k)
    bias = rng.standard_normal(n).astype(np.float32)
    msg = (rng.seed, n)
    for b in (None, bias):
        b64 = 0 if b is None else b.astype(np.float64)
        want = x.astype(np.float64) @ w64.T + b64
        xq = quantized_x(x, ACT[qtype])
        fast = run(x, w, qtype, b)
        ref = run(x, w, qtype, b, reference=True)
        # Exact up to f32 rounding against the 8-bit activations the kernel uses ...
        assert rounding_rel(fast, xq, w64, b64) < 1e-5, msg
        # ... and within their quantization error of the exact product: each activation is off
        # by at most half a step, d/2 = max|x| / 254 per block, i.e. about 1% of a typical
        # |x| for Gaussian blocks; over n * t >= 32 outputs the norm-wise error is well below 3%.
        if n * t >= 32:
            assert np.linalg.norm(fast - want) / np.linalg.norm(want) < 3e-2, msg
        # Integer parts exact, f32 part in one fixed order: the twins agree bit for bit.
        assert np.array_equal(bits(fast), bits(ref)), msg


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.MXFP4], ids=lambda q: q.name)
def test_linear_odd_block_count(rng, qtype):
    """An odd number of 32-blocks: the AVX-512 path's last pair is half empty."""
    for k in (32, 96, 1056):
        w = rand_blocks(rng, qtype, 9, k)
        x = make_x(rng, 5, k)
        assert np.array_equal(bits(run(x, w, qtype)), bits(run(x, w, qtype, reference=True))), \
            (rng.seed, k)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_batch_invariance(rng, qtype):
    """Row t of a batched call equals that row computed alone or elsewhere in a bigger batch,
    bit for bit (threaded sizes)."""
    n, k = 515, 2048
    w = rand_blocks(rng, qtype, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    x = make_x(rng, 17, k)
    full = run(x, w, qtype, bias)
    for t in (0, 1, 2, 5, 16):
        alone = run(x[t:t + 1].copy(), w, qtype, bias)
        assert np.array_equal(bits(full[t]), bits(alone[0])), (rng.seed, t)
    for t, start in ((3, 0), (3, 14), (6, 7)):
        part = run(x[start:start + t].copy(), w, qtype, bias)
        assert np.array_equal(bits(part), bits(full[start:start + t])), (rng.seed, start)
    big = make_x(rng, 40, k)
    big[20:37] = x
    assert np.array_equal(bits(run(big, w, qtype, bias)[20:37]), bits(full)), rng.seed


def test_ops_linear_facade(rng):
    """The op models call (vllmx.ops.linear on a Weight) serves each type."""
    for qt in TYPES:
        w = rand_blocks(rng, qt, 5, 512)
        x = make_x(rng, 3, 512)
        out = ops.linear(x, ops.Weight(w, int(qt), (5, 512)))
        assert np.array_equal(bits(out), bits(run(x, w, qt))), (rng.seed, qt.name)


_ISA_SCRIPT = r"""
import sys
import numpy as np
from gguf import GGMLQuantizationType as Q, quants
from vllmx import _C
F16_FIELDS = {F16_FIELDS}
RAND_BLOCKS
rng = np.random.default_rng(int(sys.argv[1]))
for qt in F16_FIELDS:
    for n, k, t in [(37, 2048, 5), (300, 1024, 1), (5, 256, 9), (6, 1280, 4)]:
        w = rand_blocks(rng, qt, n, k)
        x = rng.standard_normal((t, k)).astype(np.float32)
        outs = []
        for ref in (False, True):
            o = np.empty((t, n), np.float32)
            _C.ops.linear(o, x, (w, int(qt)), None, reference=ref)
            outs.append(o)
        assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), (qt, n, k, t)
print("ok")
"""


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_each_isa_matches_reference(isa):
    """Each SIMD level (capped with VLLMX_ISA) agrees with the scalar twin bit for bit."""
    seed = int(np.random.SeedSequence().entropy % (1 << 63))
    script = _ISA_SCRIPT.replace("RAND_BLOCKS", inspect.getsource(rand_blocks)).replace(
        "{F16_FIELDS}", "{" + ", ".join(f"Q.{q.name}: {v}" for q, v in F16_FIELDS.items()) + "}")
    r = run_capped(isa, script, str(seed))
    assert r.returncode == 0 and "ok" in r.stdout, (seed, r.stderr[-3000:])


# ---- GGUF loader ----------------------------------------------------------------------------

def test_gguf_loader_accepts(rng, tmp_path):
    """A GGUF holding one tensor of each type loads as block weights that dequantize exactly."""
    path = tmp_path / "types.gguf"
    writer = GGUFWriter(str(path), "llama")
    blocks = {}
    for qt in TYPES:
        blocks[qt] = rand_blocks(rng, qt, 3, 512)
        writer.add_tensor(f"w.{qt.name}", blocks[qt], raw_dtype=qt)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _, weights = load_gguf(str(path))
    for qt in TYPES:
        w = weights[f"w.{qt.name}"]
        assert (w.dtype, w.shape) == (int(qt), (3, 512))
        want = quants.dequantize(blocks[qt], qt).astype(np.float32)
        assert np.array_equal(bits(w.to_float32()), bits(want)), (rng.seed, qt.name)
