"""Packed k-quant weights (Q4_K, Q5_K, Q6_K panels, csrc/repack/repack.h): the layout re-derived in
numpy byte for byte; linear over them equal to the k-quant vec_dot bit for bit for every row
count (fast kernel and scalar twin, panel and tail rows), against float64 numpy, batch invariant,
and at every SIMD level. gguf cannot quantize k-quants: weights are random block bytes with
finite f16 scales, plus blocks of extreme quants (all bits clear / set)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from rounding import rounding_rel
from simd_levels import SIMD_LEVELS, run_capped

from vllmx import _C

K_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
F16_FIELDS = {Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
Q8_K_SIZE = 292


def rand_blocks(rng, qtype, rows, k, extreme=True):
    ts = quants.GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, size=(rows, k // 256, ts), dtype=np.uint8)
    if extreme and rows >= 4:  # rows 1 and 2: every quant / scale at its lowest, highest
        keep = np.zeros(ts, bool)
        for off in F16_FIELDS[qtype]:
            keep[off:off + 2] = True
        b[1][:, ~keep] = 0
        b[2][:, ~keep] = 0xFF
    for off in F16_FIELDS[qtype]:
        b[..., off + 1] = (b[..., off + 1] & 0x83) | 0x30
    return b.reshape(rows, k // 256 * ts)


def chunks(field, starts):
    """[16 rows, nbytes] field -> the 64-byte chunks of repack.h: chunk c holds bytes
    starts[c] .. starts[c] + 3 of each row, row after row."""
    return np.concatenate([field[:, s:s + 4].reshape(-1) for s in starts])


def numpy_repack_k(w, qtype):
    """The layout documented in csrc/repack/repack.h, written independently of the C++."""
    ts = quants.GGML_QUANT_SIZES[qtype][1]
    n, rb = w.shape
    nb = rb // ts
    out = w.copy()
    blk = w[: n // 16 * 16].reshape(n // 16, 16, nb, ts)  # [panel, row, block, byte]
    for p in range(n // 16):
        parts = []
        for s in range(nb):
            b = blk[p, :, s]  # [16, ts]
            if qtype == Q.Q6_K:
                ql, qh, sc, d = b[:, 0:128], b[:, 128:192], b[:, 192:208], b[:, 208:210]
                parts += [chunks(ql, [64 * c + 32 * h + 4 * k for c in range(2) for h in range(2)
                                      for k in range(8)]),
                          chunks(qh, [32 * c + 4 * k for c in range(2) for k in range(8)]),
                          chunks(sc, [4 * w_ for w_ in range(4)]), d.reshape(-1)]
            else:
                qs_off = 16 if qtype == Q.Q4_K else 48
                qs = b[:, qs_off:qs_off + 128]
                parts.append(chunks(qs, [32 * j + 4 * c for j in range(4) for c in range(8)]))
                if qtype == Q.Q5_K:
                    parts.append(chunks(b[:, 16:48], [4 * c for c in range(8)]))
                parts += [chunks(b[:, 4:16], [0, 4, 8]), b[:, 0:2].reshape(-1),
                          b[:, 2:4].reshape(-1)]
        out[p * 16:(p + 1) * 16] = np.concatenate(parts).reshape(16, rb)
    return out


def repack(w, qtype):
    pt = _C.packed_dtype(int(qtype), False)
    out = np.full_like(w, 0xAB)
    _C.ops.repack_weight((out, _C.packed_dtype(int(qtype), False)), (w, int(qtype)))
    return out, pt


def run(x, w, qtype, bias=None, reference=False):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    _C.ops.linear(out, x, (w, int(qtype)), bias, reference=reference)
    return out


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def make_x(rng, t, k):
    x = rng.standard_normal((t, k)).astype(np.float32)
    x *= np.exp(rng.uniform(-1, 1, (t, 1))).astype(np.float32)
    return x


def quantized_x(x):
    """x as the Q8_K activations the kernels multiply, in f64."""
    blk = np.zeros((x.shape[0], x.shape[1] // 256 * Q8_K_SIZE), np.uint8)
    _C.ops.quantize((blk, int(Q.Q8_K)), x)
    blk = blk.reshape(x.shape[0], -1, Q8_K_SIZE)
    d = blk[..., 0:4].copy().view(np.float32).astype(np.float64)
    q = blk[..., 4:260].copy().view(np.int8).astype(np.float64)
    return (d * q).reshape(x.shape)


def test_packed_dtypes():
    for q, pid in zip(K_TYPES, (69, 70, 71)):
        assert _C.packed_dtype(int(q), False) == pid
        name, bs, ts, quantized, supported = _C.type_info(pid)
        assert (name, bs, ts, quantized, supported) == (
            q.name + "_X16", 256, quants.GGML_QUANT_SIZES[q][1], True, True)
    for q in (Q.Q2_K, Q.Q3_K):
        assert _C.packed_dtype(int(q), False) == -1


@pytest.mark.parametrize("n,k", [(16, 256), (37, 512), (203, 1024)])
@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
def test_layout_matches_spec(qtype, n, k):
    rng = np.random.default_rng([int(qtype), n, k])
    w = rand_blocks(rng, qtype, n, k)
    out, _ = repack(w, qtype)
    assert np.array_equal(out, numpy_repack_k(w, qtype))
    assert np.array_equal(out[n // 16 * 16:], w[n // 16 * 16:])  # tail rows as stored


@pytest.mark.parametrize("t", [1, 3, 16, 17, 64, 100])
@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
def test_packed_equals_vec_dot(qtype, t):
    """Every output of the packed kernel and of its scalar twin is the k-quant vec_dot's, bit
    for bit (panel rows and the n % 16 tail rows), with and without bias; and the product is the
    float64 one of the Q8_K activations up to f32 rounding."""
    rng = np.random.default_rng([int(qtype), t])
    n, k = 16 * 5 + 7, 1024
    w = rand_blocks(rng, qtype, n, k)
    wp, pt = repack(w, qtype)
    x = make_x(rng, t, k)
    x[0, :256] = np.where(np.arange(256) % 2 == 0, 127.0, -127.0)  # Q8_K at +-127
    bias = rng.standard_normal(n).astype(np.float32)
    for b in (None, bias):
        want = run(x, w, qtype, b)
        assert np.array_equal(bits(run(x, wp, pt, b)), bits(want))
        assert np.array_equal(bits(run(x, wp, pt, b, reference=True)), bits(want))
        assert np.array_equal(bits(run(x, w, qtype, b, reference=True)), bits(want))
    w64 = quants.dequantize(w, qtype).astype(np.float64)
    assert rounding_rel(run(x, wp, pt), quantized_x(x), w64) < 1e-5


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda q: q.name)
def test_packed_batch_invariance(qtype):
    """A row's output is the same bit for bit whatever batch and position it is computed in
    (threaded sizes; N = 515: 32 panels and 3 tail rows)."""
    rng = np.random.default_rng(int(qtype) + 300)
    n, k = 515, 2048
    wp, pt = repack(rand_blocks(rng, qtype, n, k), qtype)
    bias = rng.standard_normal(n).astype(np.float32)
    x = make_x(rng, 64, k)
    full = run(x, wp, pt, bias)
    for t in (1, 3, 17):
        for start in (0, 64 - t, 5):
            part = run(x[start:start + t].copy(), wp, pt, bias)
            assert np.array_equal(bits(part), bits(full[start:start + t])), (t, start)
    big = make_x(rng, 100, k)
    big[30:94] = x
    assert np.array_equal(bits(run(big, wp, pt, bias)[30:94]), bits(full))


_ISA_SCRIPT = r"""
import numpy as np
from gguf import GGMLQuantizationType as Q, quants
from vllmx import _C
rng = np.random.default_rng(5)
for qt, offs in {Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}.items():
    ts = quants.GGML_QUANT_SIZES[qt][1]
    pt = _C.packed_dtype(int(qt), False)
    for n, k, t in [(37, 2048, 5), (300, 1024, 1), (16, 256, 9)]:
        w = rng.integers(0, 256, size=(n, k // 256, ts), dtype=np.uint8)
        for off in offs:
            w[..., off + 1] = (w[..., off + 1] & 0x83) | 0x30
        w = w.reshape(n, -1)
        wp = np.empty_like(w)
        _C.ops.repack_weight((wp, _C.packed_dtype(int(qt), False)), (w, int(qt)))
        x = rng.standard_normal((t, k)).astype(np.float32)
        outs = []
        for ww, dt, ref in ((w, qt, True), (wp, pt, False), (wp, pt, True)):
            o = np.empty((t, n), np.float32)
            _C.ops.linear(o, x, (ww, int(dt)), None, reference=ref)
            outs.append(o.view(np.uint32))
        assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2]), (qt, n, t)
print("ok")
"""


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_each_isa_matches_vec_dot(isa):
    """The scalar twin, the AVX2 and the VNNI kernels: every level gives the vec_dot's bits."""
    r = run_capped(isa, _ISA_SCRIPT)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
