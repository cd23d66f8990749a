"""Packed-panel kernels at the edges of their integer arithmetic, at every SIMD level: the AVX2
kernels sum maddubs pairs in s16, which saturates at +-32767, so weights whose quants are all at
their largest (or Q8_0's -128) against activation blocks of one sign at full scale (+-127, and
Q8_K's -128) must still give the scalar twin's and the unpacked vec_dot's bits. Weights are
random block bytes with finite f16 fields, plus whole rows of extreme quants."""

import pytest
from simd_levels import SIMD_LEVELS, run_capped

_SCRIPT = r"""
import numpy as np
from gguf import GGMLQuantizationType as Q, quants
from vllmx import _C
rng = np.random.default_rng(11)
F16 = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
       Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
def weight(qt, n, k):
    bs, ts = quants.GGML_QUANT_SIZES[qt]
    w = rng.integers(0, 256, size=(n, k // bs, ts), dtype=np.uint8)
    keep = np.zeros(ts, bool)
    for off in F16[qt]:
        keep[off:off + 2] = True
    w[0::4][:, :, ~keep] = 0xFF  # every quant and scale at its highest
    w[1::4][:, :, ~keep] = 0x00  # ... its lowest
    if qt == Q.Q8_0:
        w[2::4][:, :, 2:] = 0x80  # q = -128
    for off in F16[qt]:  # finite scales of either sign, 2^-8 .. 2^-3
        nbk = (n, k // bs)
        h = rng.uniform(2.0**-8, 2.0**-3, size=nbk) * rng.choice([-1, 1], size=nbk)
        w[:, :, off:off + 2] = h.astype(np.float16).view(np.uint8).reshape(n, k // bs, 2)
    return w.reshape(n, -1)
def acts(t, k):
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[0] = 1.0  # every block quantizes to +127 (Q8_0 / Q8_1) or -128 (Q8_K)
    x[1:2] = -1.0
    x[2:3, ::2], x[2:3, 1::2] = 1.0, -1.0
    return x
for qt in F16:
    pt = _C.packed_dtype(int(qt), False)
    for n, k, t in [(48, 512, 11), (35, 1024, 1), (16, 256, 4)]:
        w = weight(qt, n, k)
        wp = np.empty_like(w)
        _C.ops.repack_weight((wp, pt), (w, int(qt)))
        x = acts(t, k)
        outs = []
        for ww, dt, ref in ((w, qt, True), (wp, pt, False), (wp, pt, True)):
            o = np.empty((t, n), np.float32)
            _C.ops.linear(o, x, (ww, int(dt)), None, reference=ref)
            outs.append(o.view(np.uint32))
        f = n // 16 * 16  # panel rows (the tail rows run the row kernels, which round their way)
        assert np.array_equal(outs[1][:, :f], outs[2][:, :f]), (qt.name, n, k, t, "vs its twin")
        if qt in (Q.Q4_K, Q.Q5_K, Q.Q6_K):  # k-quant panels reproduce the vec_dot (repack.h)
            assert np.array_equal(outs[0], outs[1]), (qt.name, n, k, t, "packed vs vec_dot")
        else:  # the 32-element types round per block in their own order: f32 accuracy
            a, b = outs[1].view(np.float32), outs[0].view(np.float32)
            assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), (qt.name, n, k, t)
print("ok")
"""


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_extremes_at_each_isa(isa):
    r = run_capped(isa, _SCRIPT)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
