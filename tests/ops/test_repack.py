"""repack_weight: the packed layout of csrc/repack/repack.h, re-derived in numpy byte for byte; the tail
rows; argument errors; ops.repack_weight and Linear's one packed copy per weight."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from vllmx import _C, ops
from vllmx.layers.linear import Linear

BLOCK_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
# (block bytes, qs offset, qh offset or None, m offset or None) of the GGUF block structs
PARTS = {Q.Q4_0: (18, 2, None, None), Q.Q4_1: (20, 4, None, 2), Q.Q5_0: (22, 6, 2, None),
         Q.Q5_1: (24, 8, 4, 2), Q.Q8_0: (34, 2, None, None)}


def numpy_repack(w, qtype):
    """The layout documented in csrc/repack/repack.h, written independently of the C++."""
    ts, qs_off, qh_off, m_off = PARTS[qtype]
    n, rb = w.shape
    nb = rb // ts
    out = w.copy()
    blk = w[: n // 16 * 16].reshape(n // 16, 16, nb, ts)  # [panel, row, block, byte]
    for p in range(n // 16):
        parts = []
        b = blk[p]
        if qtype == Q.Q8_0:
            qs = b[:, :, qs_off:qs_off + 32] ^ 0x80  # [row, block, 32]
            parts.append(qs.reshape(16, nb, 8, 4).transpose(1, 2, 0, 3).reshape(-1))
        else:
            qs = b[:, :, qs_off:qs_off + 16]
            parts.append(qs.reshape(16, nb, 4, 4).transpose(1, 2, 0, 3).reshape(-1))
        if qh_off is not None:
            qh = b[:, :, qh_off:qh_off + 4].copy().view("<u4")[..., 0]  # [row, block]
            masks = np.zeros((nb, 8), np.uint64)
            for c in range(4):
                for i in range(4):
                    for r in range(16):
                        lo = (qh[r] >> (4 * c + i)) & 1
                        hi = (qh[r] >> (16 + 4 * c + i)) & 1
                        masks[:, 2 * c] |= lo.astype(np.uint64) << np.uint64(4 * r + i)
                        masks[:, 2 * c + 1] |= hi.astype(np.uint64) << np.uint64(4 * r + i)
            parts.append(masks.astype("<u8").view(np.uint8).reshape(-1))
        parts.append(b[:, :, 0:2].transpose(1, 0, 2).reshape(-1))  # d
        if m_off is not None:
            parts.append(b[:, :, m_off:m_off + 2].transpose(1, 0, 2).reshape(-1))
        out[p * 16:(p + 1) * 16] = np.concatenate(parts).reshape(16, rb)
    return out


def make_blocks(rng, qtype, n, k):
    w = rng.standard_normal((n, k)).astype(np.float32)
    w += rng.standard_normal((n, 1)).astype(np.float32)  # nonzero mins for the *_1 types
    return quants.quantize(w, qtype)


@pytest.mark.parametrize("n,k", [(16, 32), (37, 96), (64, 576), (5, 64), (203, 1536)])
@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_layout_matches_spec(qtype, n, k):
    rng = np.random.default_rng([int(qtype), n, k])
    w = make_blocks(rng, qtype, n, k)
    out = np.full_like(w, 0xAB)
    _C.ops.repack_weight((out, _C.packed_dtype(int(qtype), False)), (w, int(qtype)))
    assert np.array_equal(out, numpy_repack(w, qtype))
    assert np.array_equal(out[n // 16 * 16:], w[n // 16 * 16:])  # tail rows as stored


def test_packed_dtypes():
    ids = [_C.packed_dtype(int(q), False) for q in BLOCK_TYPES]
    assert ids == [64, 65, 66, 67, 68]
    for q, pid in zip(BLOCK_TYPES, ids):
        name, bs, ts, quantized, supported = _C.type_info(pid)
        assert (name, bs, quantized, supported) == (q.name + "_X16", 32, True, True)
        assert ts == quants.GGML_QUANT_SIZES[q][1]  # same bytes as the blocks they pack
    for q in (Q.Q8_1, Q.Q2_K, Q.I32):  # (the dense types' panels: test_repack_f32.py)
        assert _C.packed_dtype(int(q), False) == -1


def test_bad_args_raise():
    rng = np.random.default_rng(1)
    w = make_blocks(rng, Q.Q4_0, 32, 64)
    with pytest.raises(ValueError, match="repack_weight: no packed layout"):
        h = np.zeros((32, 64), np.int32)
        _C.ops.repack_weight((np.empty_like(h), int(Q.I32)), (h, int(Q.I32)))
    with pytest.raises(ValueError, match=r"repack_weight: out Q4_0_X16\[16, 64\] must be"):
        _C.ops.repack_weight((np.empty((16, 36), np.uint8), _C.packed_dtype(int(Q.Q4_0), False)),
                             (w, int(Q.Q4_0)))
    with pytest.raises(ValueError, match="Q4_0_X16"):  # packed weights are for linear only
        _C.ops.embedding(np.empty((1, 64), np.float32), np.zeros(1, np.int32),
                         (w, _C.packed_dtype(int(Q.Q4_0), False)))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_ops_repack_weight(qtype):
    rng = np.random.default_rng(2)
    w = ops.Weight(make_blocks(rng, qtype, 40, 128), int(qtype), (40, 128))
    p = ops.repack_weight(w)
    if _C.packed_dtype(int(qtype)) < 0:  # no fast kernel on this CPU: left as is
        assert p is w
        return
    assert p.dtype == _C.packed_dtype(int(qtype)) and p.shape == w.shape
    assert p.data.ctypes.data % 64 == 0
    assert np.array_equal(p.data, numpy_repack(w.data, qtype))
    small = ops.Weight(make_blocks(rng, qtype, 15, 128), int(qtype), (15, 128))
    assert ops.repack_weight(small) is small  # no whole panel
    x = rng.standard_normal((3, 128)).astype(np.float32)
    assert np.abs(ops.linear(x, p) - ops.linear(x, w)).max() < 1e-5 * np.abs(ops.linear(x, w)).max()


def test_linear_shares_one_packed_copy():
    rng = np.random.default_rng(3)
    w = ops.Weight(make_blocks(rng, Q.Q8_0, 48, 64), int(Q.Q8_0), (48, 64))
    a, b = Linear(w), Linear(w)
    assert a.weight is b.weight
    if _C.packed_dtype(int(Q.Q8_0)) >= 0:
        assert a.weight.dtype != w.dtype
