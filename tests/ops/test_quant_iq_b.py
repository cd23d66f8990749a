"""i-quants IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (weights, with Q8_K
activations): dequantization bit-exact with gguf.quants, linear against float64 numpy, the
scalar twin against every SIMD level, batch invariance, GGUF loading. gguf cannot quantize these
types, so weights are random block bytes with finite f16 scales, fresh each run (the seed is in
every failure message): every grid index, sign pattern and scale occurs."""
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from rounding import rounding_rel
from simd_levels import SIMD_LEVELS, run_capped

from vllmx import _C
from vllmx.ops import Weight, embedding, linear

IQ_TYPES = [Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M]
Q8_K_SIZE = 292


def fresh_seed():
    return int(np.random.SeedSequence().entropy % (1 << 63))


def rand_blocks(rng, qtype, rows, k):
    """Random blocks whose f16 scale d gets a random sign, random low mantissa bits and an
    exponent of 2^-3..2^-2: finite, moderate and never zero. IQ1_M keeps d in the top nibbles
    of its four u16 scale words (bytes 48..55): d's high byte is byte 55's and byte 53's."""
    ts = quants.GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, size=(rows, k // 256, ts), dtype=np.uint8)
    if qtype == Q.IQ1_M:
        b[..., 55] = (b[..., 55] & 0x8F) | 0x30  # d bits 15..12: sign, exponent 011
        b[..., 53] &= 0x3F  # d bits 11..10 (exponent low bits) = 0; 9..8 random
    else:
        b[..., 1] = (b[..., 1] & 0x83) | 0x30
    return b.reshape(rows, k // 256 * ts)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def test_type_info_supported():
    for qt in IQ_TYPES:
        name, block_size, type_size, quantized, supported = _C.type_info(int(qt))
        assert (name, block_size, type_size) == (qt.name, *quants.GGML_QUANT_SIZES[qt])
        assert quantized and supported


# ---- dequantization -------------------------------------------------------------------------

@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(1, 256), (9, 1024), (3, 2, 512)])
def test_dequantize_bit_exact(qtype, shape, reference):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = int(np.prod(shape[:-1]))
    blocks = rand_blocks(rng, qtype, rows, shape[-1]).reshape(shape[:-1] + (-1,))
    want = quants.dequantize(blocks, qtype).astype(np.float32)
    assert np.isfinite(want).all() and (want != 0).any()
    out = np.full(shape, np.nan, dtype=np.float32)
    _C.ops.dequantize(out, (blocks, int(qtype)), reference=reference)
    assert np.array_equal(bits(out), bits(want)), f"seed {seed}"


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda q: q.name)
def test_dequantize_extreme_blocks(qtype):
    """All-zero and all-ones bytes around the scale: first and last grid points, all signs and
    shifts negative or positive, smallest and largest sub-block scales."""
    seed = fresh_seed()
    blocks = rand_blocks(np.random.default_rng(seed), qtype, 2, 512)
    ts = quants.GGML_QUANT_SIZES[qtype][1]
    per = blocks.reshape(2, 2, ts)
    if qtype == Q.IQ1_M:  # keep d's nibbles, set everything else
        keep_mask = np.zeros(ts, np.uint8)
        keep_mask[[49, 51, 53, 55]] = 0xF0
    else:
        keep_mask = np.zeros(ts, np.uint8)
        keep_mask[:2] = 0xFF
    per[0] &= keep_mask
    per[1] |= ~keep_mask
    want = quants.dequantize(blocks, qtype).astype(np.float32)
    out = np.empty(want.shape, np.float32)
    _C.ops.dequantize(out, (blocks, int(qtype)))
    assert np.array_equal(bits(out), bits(want)), f"seed {seed}"


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda q: q.name)
def test_embedding_rows(qtype):
    seed = fresh_seed()
    table = rand_blocks(np.random.default_rng(seed), qtype, 11, 512)
    ids = np.array([3, 0, 10, 3, 7], np.int32)
    out = embedding(ids, Weight(table, int(qtype), (11, 512)))
    want = quants.dequantize(table, qtype).astype(np.float32)[ids]
    assert np.array_equal(bits(out), bits(want)), f"seed {seed}"


# ---- linear ---------------------------------------------------------------------------------

def run(x, w, qtype, bias=None, reference=False):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    _C.ops.linear(out, x, (w, int(qtype)), bias, reference=reference)
    return out


def quantized_x(x):
    """x as the Q8_K activations the kernel multiplies, in f64."""
    q8 = np.zeros((x.shape[0], x.shape[1] // 256 * Q8_K_SIZE), np.uint8)
    _C.ops.quantize((q8, int(Q.Q8_K)), x)
    blk = q8.reshape(x.shape[0], -1, Q8_K_SIZE)
    d = blk[..., 0:4].copy().view(np.float32).astype(np.float64)
    q = blk[..., 4:260].copy().view(np.int8).astype(np.float64)
    return (d * q).reshape(x.shape)


def make_x(rng, t, k):
    x = rng.standard_normal((t, k)).astype(np.float32)
    return x * np.exp(rng.uniform(-1, 1, (t, 1))).astype(np.float32)


@pytest.mark.parametrize("k", [256, 2048])
@pytest.mark.parametrize("t", [1, 3, 17, 64])
@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda q: q.name)
def test_linear_vs_numpy(qtype, t, k):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    n = int(rng.choice([7, 33, 97]))
    w = rand_blocks(rng, qtype, n, k)
    w64 = quants.dequantize(w, qtype).astype(np.float64)
    x = make_x(rng, t, k)
    bias = rng.standard_normal(n).astype(np.float32)
    for b in (None, bias):
        b64 = 0 if b is None else b.astype(np.float64)
        want = x.astype(np.float64) @ w64.T + b64
        xq = quantized_x(x)
        fast = linear(x, Weight(w, int(qtype), (n, k)), b)
        ref = run(x, w, qtype, b, reference=True)
        # The integer dot per super-block is exact; only the f32 scaling and the sum over
        # super-blocks round: f32 accuracy against the Q8_K activations the kernel uses ...
        assert rounding_rel(fast, xq, w64, b64) < 1e-5, f"seed {seed}"
        # ... and the activation quantization error against the exact product: Q8_K rounds
        # each x to a step of amax/127 per 256 values (amax ~ 3.5 sigma for Gaussian rows), an
        # RMS error of ~3.5/(127 sqrt(12)) ~ 0.8% of x, and about that norm-wise for the
        # product with random weights; 3e-2 leaves a 4x margin. Norm-wise over >= 32 outputs,
        # so that one dot product that cancels does not decide it.
        if n * t >= 32:
            assert np.linalg.norm(fast - want) / np.linalg.norm(want) < 3e-2, f"seed {seed}"
        # the scalar twin computes the same integers and the same f32 expression
        assert np.array_equal(bits(fast), bits(ref)), f"seed {seed}"


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda q: q.name)
def test_batch_invariance(qtype):
    """Row t of a call of T rows equals the same row computed alone, bit for bit (threaded
    sizes; T = 64 goes through the 4-row kernels and the tiles)."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    n, k = 515, 2048
    w = rand_blocks(rng, qtype, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    x = make_x(rng, 64, k)
    alone = np.stack([run(x[t:t + 1].copy(), w, qtype, bias)[0] for t in range(64)])
    for t in (1, 3, 17, 64):
        assert np.array_equal(bits(run(x[:t].copy(), w, qtype, bias)), bits(alone[:t])), \
            f"T={t} seed {seed}"
    part = run(x[5:22].copy(), w, qtype, bias)
    assert np.array_equal(bits(part), bits(alone[5:22])), f"seed {seed}"


def test_k_not_whole_blocks_raises():
    rng = np.random.default_rng(1)
    w = rand_blocks(rng, Q.IQ2_XXS, 4, 512)
    with pytest.raises(ValueError, match="linear"):
        run(make_x(rng, 2, 384), w, Q.IQ2_XXS)


_ISA_SCRIPT = r"""
import sys
import numpy as np
from gguf import GGMLQuantizationType as Q, quants
from vllmx import _C
sys.path.insert(0, sys.argv[1])
from test_quant_iq_b import IQ_TYPES, rand_blocks
rng = np.random.default_rng(int(sys.argv[2]))
for qt in IQ_TYPES:
    for n, k, t in [(37, 2048, 5), (300, 1024, 1), (5, 256, 9)]:
        w = rand_blocks(rng, qt, n, k)
        x = rng.standard_normal((t, k)).astype(np.float32)
        outs = []
        for ref in (False, True):
            o = np.empty((t, n), np.float32)
            _C.ops.linear(o, x, (w, int(qt)), None, reference=ref)
            outs.append(o)
        assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), (qt, n, k, t)
    want = quants.dequantize(w, qt)
    out = np.empty(want.shape, np.float32)
    _C.ops.dequantize(out, (w, int(qt)))
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), qt
print("ok")
"""


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_each_isa_matches_reference(isa):
    """Each SIMD level (capped with VLLMX_ISA) agrees with the scalar twin bit for bit."""
    seed = fresh_seed()
    r = run_capped(isa, _ISA_SCRIPT, os.path.dirname(__file__), str(seed))
    assert r.returncode == 0 and "ok" in r.stdout, f"seed {seed}: {r.stderr[-3000:]}"


# ---- GGUF loading ---------------------------------------------------------------------------

def test_gguf_loader_accepts_iq_types(tmp_path):
    """The loader takes every one of these types and keeps the blocks as they are."""
    import gguf

    from vllmx.loader.gguf import load_gguf

    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    path = str(tmp_path / "iq.gguf")
    wr = gguf.GGUFWriter(path, "llama")
    blocks = {}
    for qt in IQ_TYPES:
        blocks[qt] = rand_blocks(rng, qt, 3, 512)
        wr.add_tensor(f"{qt.name}.weight", blocks[qt], raw_dtype=qt)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    _, weights = load_gguf(path)
    x = make_x(rng, 2, 512)
    for qt in IQ_TYPES:
        w = weights[f"{qt.name}.weight"]
        assert (w.dtype, w.shape) == (int(qt), (3, 512))
        assert np.array_equal(np.asarray(w.data), blocks[qt])
        assert np.array_equal(bits(linear(x, w)), bits(run(x, blocks[qt], qt, reference=True)))
