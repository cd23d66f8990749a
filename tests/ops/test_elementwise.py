"""rms_norm, fused_add_rms_norm, layer_norm, fused_add_layer_norm, rotary, silu_and_mul,
gelu_and_mul, gelu and embedding against numpy float64."""

from __future__ import annotations

import numpy as np
import pytest

from vllmx import _C

rng = np.random.default_rng()


def rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (7, 576), (33, 1000)])
def test_rms_norm(shape, reference):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    out = np.empty_like(x)
    _C.ops.rms_norm(out, x, w, 1e-5, reference=reference)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5) * w
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("reference", [False, True])
def test_fused_add_rms_norm(reference):
    x = rng.standard_normal((9, 256)).astype(np.float32)
    r = rng.standard_normal((9, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    s64 = x.astype(np.float64) + r
    ref = s64 / np.sqrt((s64**2).mean(-1, keepdims=True) + 1e-6) * w
    _C.ops.fused_add_rms_norm(x, r, w, 1e-6, reference=reference)
    assert rel_err(r, s64) < 1e-6
    assert rel_err(x, ref) < 1e-5


def test_rms_norm_rows_are_batch_invariant():
    x = rng.standard_normal((17, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    full = np.empty_like(x)
    _C.ops.rms_norm(full, x, w, 1e-5)
    one = np.empty_like(x[5:6])
    _C.ops.rms_norm(one, np.ascontiguousarray(x[5:6]), w, 1e-5)
    assert np.array_equal(full[5], one[0])


def layer_norm_ref(x, w, b, eps):
    """float64 LayerNorm over groups of w.shape[-1] values (w [D] shared or [G, D])."""
    d = w.shape[-1]
    g = x.astype(np.float64).reshape(x.shape[0], -1, d)
    g = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    g = g * w.reshape(-1, d) + (0.0 if b is None else b.reshape(-1, d))
    return g.reshape(x.shape)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("shape,w_shape", [((1, 64), (64,)), ((7, 576), (576,)),
                                           ((33, 1000), (1000,)),
                                           ((5, 4 * 24), (24,)),  # one weight, every head
                                           ((9, 6 * 40), (6, 40))])  # a weight per head
def test_layer_norm(shape, w_shape, with_bias, reference):
    # An offset mean: a one-pass variance would lose digits to it.
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape).astype(np.float32) if with_bias else None
    out = np.empty_like(x)
    _C.ops.layer_norm(out, x, w, b, 1e-5, reference=reference)
    assert rel_err(out, layer_norm_ref(x, w, b, 1e-5)) < 1e-5


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("with_bias", [True, False])
def test_fused_add_layer_norm(with_bias, reference):
    x = rng.standard_normal((9, 256)).astype(np.float32)
    r = rng.standard_normal((9, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32) if with_bias else None
    s64 = x.astype(np.float64) + r
    _C.ops.fused_add_layer_norm(x, r, w, b, 1e-6, reference=reference)
    assert rel_err(r, s64) < 1e-6
    assert rel_err(x, layer_norm_ref(s64, w, b, 1e-6)) < 1e-5


def test_layer_norm_rows_are_batch_invariant():
    x = rng.standard_normal((17, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    b = rng.standard_normal(576).astype(np.float32)
    full, one = np.empty_like(x), np.empty_like(x[5:6])
    _C.ops.layer_norm(full, x, w, b, 1e-5)
    _C.ops.layer_norm(one, np.ascontiguousarray(x[5:6]), w, b, 1e-5)
    assert np.array_equal(full[5], one[0])


@pytest.mark.parametrize("w_shape,b_shape,match", [
    ((48,), None, "w .* does not split the rows"),  # 100 is not a multiple of 48
    ((4, 24), None, "w .* does not split the rows"),  # 4 groups of 24 != 100
    ((100,), (50,), "b .* must match w"),
])
def test_layer_norm_rejects_bad_shapes(w_shape, b_shape, match):
    x = np.ones((3, 100), np.float32)
    b = None if b_shape is None else np.ones(b_shape, np.float32)
    with pytest.raises(ValueError, match="layer_norm: " + match):
        _C.ops.layer_norm(np.empty_like(x), x, np.ones(w_shape, np.float32), b, 1e-5)
    with pytest.raises(ValueError, match="fused_add_layer_norm: w .* must be \\[H\\]"):
        _C.ops.fused_add_layer_norm(x, x.copy(), np.ones((4, 25), np.float32), None, 1e-5)


def rope_ref(x, pos, cos, sin, head, rot, neox):
    x = x.astype(np.float64).reshape(x.shape[0], -1, head).copy()
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    half = rot // 2
    if neox:
        a, b = x[..., :half].copy(), x[..., half:rot].copy()
        x[..., :half], x[..., half:rot] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., 0:rot:2].copy(), x[..., 1:rot:2].copy()
        x[..., 0:rot:2], x[..., 1:rot:2] = a * c - b * s, b * c + a * s
    return x.reshape(x.shape[0], -1)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("head,rot", [(64, 64), (128, 64), (80, 80)])
def test_rotary(neox, head, rot):
    t, nq, nk, max_pos = 11, 4, 2, 300
    inv = 1.0 / (10000 ** (np.arange(0, rot, 2) / rot))
    freqs = np.outer(np.arange(max_pos), inv)
    cache = np.concatenate([np.cos(freqs), np.sin(freqs)], 1).astype(np.float32)
    pos = rng.integers(0, max_pos, t).astype(np.int32)
    q = rng.standard_normal((t, nq * head)).astype(np.float32)
    k = rng.standard_normal((t, nk * head)).astype(np.float32)
    c64, s64 = cache[:, : rot // 2].astype(np.float64), cache[:, rot // 2:].astype(np.float64)
    q_ref = rope_ref(q, pos, c64, s64, head, rot, neox)
    k_ref = rope_ref(k, pos, c64, s64, head, rot, neox)
    q_alone = q.copy()
    _C.ops.rotary(pos, q, k, cache, head, neox)
    assert rel_err(q, q_ref) < 1e-5 and rel_err(k, k_ref) < 1e-5
    _C.ops.rotary(pos, q_alone, None, cache, head, neox)  # k is optional
    assert np.array_equal(q_alone, q)


def test_rotary_rejects_position_outside_cache():
    cache = rng.standard_normal((8, 16)).astype(np.float32)
    q = rng.standard_normal((1, 32)).astype(np.float32)
    with pytest.raises(ValueError, match="position 8 outside the rotary cache"):
        _C.ops.rotary(np.array([8], np.int32), q, q.copy(), cache, 16, True)


@pytest.mark.parametrize("reference", [False, True])
def test_silu_and_mul(reference):
    x = (rng.standard_normal((5, 2 * 300)) * 4).astype(np.float32)
    x[0, :4] = [-200.0, -90.0, 90.0, 200.0]  # exp under- and overflow in both directions
    out = np.empty((5, 300), np.float32)
    _C.ops.silu_and_mul(out, x, reference=reference)
    g, u = x[:, :300].astype(np.float64), x[:, 300:].astype(np.float64)
    with np.errstate(over="ignore"):
        ref = g / (1 + np.exp(-g)) * u
    assert np.isfinite(out).all()
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", "q4_1"])
def test_embedding(dtype):
    import gguf

    table = rng.standard_normal((50, 64)).astype(np.float32)
    ids = rng.integers(0, 50, 13).astype(np.int32)
    if dtype == "f32":
        data, dt, ref = table, 0, table
    elif dtype == "f16":
        data, dt, ref = table.astype(np.float16), 1, table.astype(np.float16).astype(np.float64)
    elif dtype == "bf16":
        bits = (table.view(np.uint32) >> 16).astype(np.uint16)  # truncation is a valid bf16
        data, dt = bits, 30
        ref = (bits.astype(np.uint32) << 16).view(np.float32)
    else:
        qt = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_1": gguf.GGMLQuantizationType.Q4_1}[dtype]
        data, dt = gguf.quants.quantize(table, qt), int(qt)
        ref = gguf.quants.dequantize(data, qt)
    out = np.empty((13, 64), np.float32)
    _C.ops.embedding(out, ids, (data, dt))
    assert np.array_equal(out, np.asarray(ref, np.float32)[ids])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
def test_embedding_reads_a_packed_table(dtype):
    """A tied lm_head's packed copy (16-row panels, then the rows past the last whole panel as
    stored) looked up row by row gives the stored table's rows bit for bit."""
    import gguf

    table = rng.standard_normal((50, 64)).astype(np.float32)  # 3 panels and 2 rows after
    data, dt = {"f32": (table, 0), "f16": (table.astype(np.float16), 1),
                "bf16": ((table.view(np.uint32) >> 16).astype(np.uint16), 30),
                "q8_0": (gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q8_0), 8)}[dtype]
    pt = _C.packed_dtype(dt, False)
    packed = np.empty_like(data)
    _C.ops.repack_weight((packed, pt), (data, dt))
    assert not np.array_equal(packed, data)  # the rows are interleaved
    ids = np.concatenate([np.arange(50), rng.integers(0, 50, 20)]).astype(np.int32)
    want, got = np.empty((70, 64), np.float32), np.empty((70, 64), np.float32)
    _C.ops.embedding(want, ids, (data, dt))
    _C.ops.embedding(got, ids, (packed, pt))
    assert np.array_equal(got, want)


def test_embedding_refuses_a_packed_table_it_cannot_read_by_row():
    import gguf

    qt = gguf.GGMLQuantizationType.Q4_1
    data = gguf.quants.quantize(rng.standard_normal((32, 64)).astype(np.float32), qt)
    pt = _C.packed_dtype(int(qt), False)
    packed = np.empty_like(data)
    _C.ops.repack_weight((packed, pt), (data, int(qt)))
    with pytest.raises(ValueError, match="not read by row"):
        _C.ops.embedding(np.empty((1, 64), np.float32), np.array([3], np.int32), (packed, pt))


def test_embedding_rejects_out_of_vocab_id():
    out = np.empty((1, 8), np.float32)
    with pytest.raises(ValueError, match="token id 9 out of range"):
        _C.ops.embedding(out, np.array([9], np.int32), np.ones((4, 8), np.float32))


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_and_mul(approximate, reference):
    import math

    x = (rng.standard_normal((7, 2 * 300)) * 4).astype(np.float32)
    out = np.empty((7, 300), np.float32)
    _C.ops.gelu_and_mul(out, x, approximate == "tanh", reference=reference)
    g, u = x[:, :300].astype(np.float64), x[:, 300:].astype(np.float64)
    if approximate == "tanh":
        cdf = 0.5 * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
    else:
        cdf = 0.5 * (1 + np.vectorize(math.erf)(g / math.sqrt(2)))
    assert rel_err(out, g * cdf * u) < 1e-5


@pytest.mark.parametrize("reference", [False, True])
def test_softcap(reference):
    x = (rng.standard_normal((6, 1000)) * 40).astype(np.float32)
    x[0, :3] = [0.0, 1e-4, -3e3]  # identity near 0, saturation far out
    ref = 30.0 * np.tanh(x.astype(np.float64) / 30.0)
    got = x.copy()
    _C.ops.softcap(got, 30.0, reference=reference)
    assert np.abs(got).max() <= 30.0 and rel_err(got, ref) < 1e-6


def test_softcap_rejects_bad_cap():
    with pytest.raises(ValueError, match="softcap: cap must be a positive number"):
        _C.ops.softcap(np.ones((2, 3), np.float32), 0.0)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu(approximate, reference):
    import math

    x = (rng.standard_normal((7, 333)) * 4).astype(np.float32)
    out = np.empty_like(x)
    _C.ops.gelu(out, x, approximate == "tanh", reference=reference)
    g = x.astype(np.float64)
    if approximate == "tanh":
        cdf = 0.5 * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
    else:
        cdf = 0.5 * (1 + np.vectorize(math.erf)(g / math.sqrt(2)))
    assert rel_err(out, g * cdf) < 1e-5
    with pytest.raises(ValueError, match="gelu: out"):
        _C.ops.gelu(np.empty((7, 332), np.float32), x, True)


def test_gelu_and_mul_forms_differ():
    # gelu's two forms differ by up to ~5e-4 near |x| = 2: far above f32 rounding.
    x = np.concatenate([np.linspace(-4, 4, 256), np.ones(256)]).astype(np.float32)[None, :]
    tanh, erf = np.empty((1, 256), np.float32), np.empty((1, 256), np.float32)
    _C.ops.gelu_and_mul(tanh, x, True)
    _C.ops.gelu_and_mul(erf, x, False)
    assert 1e-4 < np.abs(tanh - erf).max() < 1e-3


def test_gelu_and_mul_rejects_bad_shapes():
    with pytest.raises(ValueError, match="gelu_and_mul"):
        _C.ops.gelu_and_mul(np.empty((3, 5), np.float32), np.zeros((3, 12), np.float32), True)
