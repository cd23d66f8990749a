"""The hybrid models' mixer ops (causal_conv1d, gated_delta_rule, rms_norm_gated, sigmoid_gate)
against float64 numpy recurrences on fresh random inputs: sequences of a varlen batch in their
own state slots, started from zeros or continued from a slot, the fast kernel and its scalar
twin; a sequence split into chunks anywhere (or decoded token by token) gives what one pass
gives; bad arguments name the problem."""

from __future__ import annotations

import numpy as np
import pytest
from simd_levels import run_capped

from vllmx import _C


def fresh_rng():
    return np.random.default_rng(np.random.SeedSequence().entropy)


def conv_ref(x, w, bias, hist, silu):
    """x [n, D], w [D, K], hist [D, K - 1] (oldest first) -> (out [n, D], new hist)."""
    k = w.shape[1]
    xx = np.concatenate([hist.T, x], axis=0).astype(np.float64)  # [K - 1 + n, D]
    out = np.stack([(xx[t:t + k] * w.T).sum(0) for t in range(x.shape[0])])
    if bias is not None:
        out = out + bias
    if silu:
        out = out / (1 + np.exp(-out))
    return out, xx[-(k - 1):].T


def run_conv(x, w, bias, state, qsl, idx, init, silu=True, twin=False, spec=None):
    out = np.full(x.shape, np.nan, np.float32)
    _C.ops.causal_conv1d(out, x, w, bias, state, np.asarray(qsl, np.int32),
                         np.asarray(idx, np.int32), np.asarray(init, np.int32),
                         None if spec is None else np.asarray(spec, np.int32), silu,
                         reference=twin)
    return out


@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
@pytest.mark.parametrize("k", [2, 4])
def test_causal_conv1d_varlen_slots(k, twin):
    rng = fresh_rng()
    d, lens, slots = 24, [5, 1, 9, 0, 3], 8
    x = rng.standard_normal((sum(lens), d)).astype(np.float32)
    w = rng.standard_normal((d, k)).astype(np.float32)
    bias = rng.standard_normal(d).astype(np.float32)
    state = rng.standard_normal((slots, d, k - 1)).astype(np.float32)
    before = state.copy()
    idx, init = [6, 0, 3, 5, 2], [1, 0, 1, 0, 0]
    qsl = np.concatenate([[0], np.cumsum(lens)])
    out = run_conv(x, w, bias, state, qsl, idx, init, twin=twin)
    for s, n in enumerate(lens):
        if n == 0:
            continue
        hist = before[idx[s]] if init[s] else np.zeros((d, k - 1))
        want, new_hist = conv_ref(x[qsl[s]:qsl[s + 1]], w, bias, hist, True)
        assert np.abs(out[qsl[s]:qsl[s + 1]] - want).max() < 1e-5
        assert np.allclose(state[idx[s]], new_hist, atol=0)
    assert np.array_equal(state[[1, 4, 7]], before[[1, 4, 7]])  # other slots untouched
    assert np.array_equal(state[5], before[5])  # an empty sequence leaves its slot


def test_causal_conv1d_chunks_equal_one_pass():
    rng = fresh_rng()
    d, k, n = 16, 4, 23
    x = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal((d, k)).astype(np.float32)
    whole = run_conv(x, w, None, np.zeros((1, d, k - 1), np.float32), [0, n], [0], [0], False)
    state = np.full((1, d, k - 1), np.nan, np.float32)  # a fresh slot's contents are ignored
    parts, cut = [], [0, 1, 2, 9, 10, n]
    for i in range(len(cut) - 1):
        piece = x[cut[i]:cut[i + 1]]
        parts.append(run_conv(piece, w, None, state, [0, len(piece)], [0], [int(i > 0)], False))
    assert np.array_equal(np.concatenate(parts), whole)


def gdr_ref(q, k, v, a, b, a_log, dt_bias, s0):
    """One sequence: q, k [n, Hk, dk], v [n, Hv, dv], a, b [n, Hv], s0 [Hv, dk, dv]."""
    n, hk, dk = q.shape
    hv, dv = v.shape[1:]
    rep = hv // hk
    s = s0.astype(np.float64).copy()
    out = np.zeros((n, hv, dv))
    for t in range(n):
        for h in range(hv):
            qt, kt = q[t, h // rep].astype(np.float64), k[t, h // rep].astype(np.float64)
            qt = qt / np.sqrt((qt * qt).sum() + 1e-6) / np.sqrt(dk)
            kt = kt / np.sqrt((kt * kt).sum() + 1e-6)
            sp = np.log1p(np.exp(a[t, h] + dt_bias[h]))
            s[h] *= np.exp(-np.exp(a_log[h]) * sp)
            beta = 1 / (1 + np.exp(-b[t, h]))
            delta = (v[t, h] - s[h].T @ kt) * beta
            s[h] += np.outer(kt, delta)
            out[t, h] = s[h].T @ qt
    return out, s


def gdr_inputs(rng, n, hk, hv, dk, dv):
    q = rng.standard_normal((n, hk * dk)).astype(np.float32)
    k = rng.standard_normal((n, hk * dk)).astype(np.float32)
    v = rng.standard_normal((n, hv * dv)).astype(np.float32)
    a = rng.standard_normal((n, hv)).astype(np.float32)
    b = rng.standard_normal((n, hv)).astype(np.float32)
    return q, k, v, a, b


def run_gdr(q, k, v, a, b, a_log, dt_bias, state, qsl, idx, init, twin=False, spec=None):
    out = np.full(v.shape, np.nan, np.float32)
    _C.ops.gated_delta_rule(out, state, q, k, v, a, b, a_log, dt_bias,
                            np.asarray(qsl, np.int32), np.asarray(idx, np.int32),
                            np.asarray(init, np.int32),
                            None if spec is None else np.asarray(spec, np.int32), reference=twin)
    return out


@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
@pytest.mark.parametrize("heads", [(2, 2), (2, 4)])
def test_gated_delta_rule_varlen_slots(heads, twin):
    rng = fresh_rng()
    hk, hv = heads
    dk, dv, lens, slots = 16, 8, [7, 1, 0, 12], 6
    q, k, v, a, b = gdr_inputs(rng, sum(lens), hk, hv, dk, dv)
    a_log = rng.uniform(-1, 1, hv).astype(np.float32)
    dt_bias = rng.standard_normal(hv).astype(np.float32)
    state = rng.standard_normal((slots, hv, dk, dv)).astype(np.float32)
    before = state.copy()
    idx, init = [4, 1, 0, 2], [1, 0, 0, 1]
    qsl = np.concatenate([[0], np.cumsum(lens)])
    out = run_gdr(q, k, v, a, b, a_log, dt_bias, state, qsl, idx, init, twin)
    for s, n in enumerate(lens):
        if n == 0:
            continue
        r = slice(qsl[s], qsl[s + 1])
        s0 = before[idx[s]] if init[s] else np.zeros((hv, dk, dv))
        want, s1 = gdr_ref(q[r].reshape(n, hk, dk), k[r].reshape(n, hk, dk),
                           v[r].reshape(n, hv, dv), a[r], b[r], a_log, dt_bias, s0)
        scale = np.abs(want).max()
        assert np.abs(out[r].reshape(n, hv, dv) - want).max() / scale < 1e-5
        assert np.abs(state[idx[s]] - s1).max() / np.abs(s1).max() < 1e-5
    assert np.array_equal(state[[3, 5]], before[[3, 5]])
    assert np.array_equal(state[0], before[0])  # the empty sequence's slot


_GDN_SIMD_SCRIPT = r"""
import hashlib, numpy as np
from vllmx import _C
rng = np.random.default_rng(5)
h = hashlib.sha256()
for hk, hv, dk, dv in ((1, 2, 128, 128), (2, 4, 64, 200), (2, 6, 40, 72)):
    lens = [1, 5, 300, 9]  # in place (under 8 tokens) and through the dense block buffer
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(qsl[-1])
    spec = np.full(T, -1, np.int32)
    spec[[3, 10, 200]] = [5, 6, 6]
    q, k, v = (rng.standard_normal((T, w)).astype(np.float32) for w in (hk * dk, hk * dk, hv * dv))
    a, b = (rng.standard_normal((T, hv)).astype(np.float32) for _ in range(2))
    state = (rng.standard_normal((7, hv, dk, dv)) * 0.3).astype(np.float32)
    out = np.empty((T, hv * dv), np.float32)
    _C.ops.gated_delta_rule(out, state, q, k, v, a, b, rng.uniform(-1, 1, hv).astype(np.float32),
                            rng.standard_normal(hv).astype(np.float32), qsl,
                            np.array([0, 1, 2, 3], np.int32), np.array([1, 0, 1, 1], np.int32),
                            spec)
    h.update(out.tobytes() + state.tobytes())
print(h.hexdigest())
"""


_MAMBA2_SIMD_SCRIPT = r"""
import hashlib, numpy as np
from vllmx import _C
rng = np.random.default_rng(6)
h = hashlib.sha256()
for H, G, P, N in ((8, 1, 32, 128), (4, 2, 8, 20), (2, 2, 40, 33)):  # N: whole vectors or not
    lens = [1, 5, 60]
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(qsl[-1])
    spec = np.full(T, -1, np.int32)
    spec[[3, 20]] = [4, 5]
    x, dt = (rng.standard_normal((T, w)).astype(np.float32) for w in (H * P, H))
    B, C = (rng.standard_normal((T, G * N)).astype(np.float32) for _ in range(2))
    state = (rng.standard_normal((6, H, P, N)) * 0.3).astype(np.float32)
    out = np.empty((T, H * P), np.float32)
    _C.ops.mamba2_scan(out, state, x, dt, B, C, rng.uniform(0, 2, H).astype(np.float32),
                       rng.standard_normal(H).astype(np.float32),
                       rng.uniform(-4, -2, H).astype(np.float32), qsl,
                       np.array([0, 1, 2], np.int32), np.array([1, 0, 1], np.int32), spec, 0.0,
                       float("inf"))
    h.update(out.tobytes() + state.tobytes())
print(h.hexdigest())
"""


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("script", [_GDN_SIMD_SCRIPT, _MAMBA2_SIMD_SCRIPT],
                         ids=["gated_delta_rule", "mamba2_scan"])
def test_recurrence_simd_paths_give_the_scalar_bits(script, isa):
    """The recurrences' vector paths round exactly as their scalar loops (no FMA contraction),
    spec saves and tails included: the same output and state bits at every level. The gated
    delta rule: the AVX-512 kernel of a 64-column block and the AVX2 build of the column loop,
    in place and through the block buffer, column tails. mamba2_scan: the AVX2 token step (its 8
    partial sums a register's lanes), at N a whole number of vectors and not."""
    runs = [run_capped(i, script) for i in ("scalar", isa)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    assert runs[0].stdout == runs[1].stdout


def test_gated_delta_rule_decode_equals_prefill():
    """A prompt in chunks and then token by token gives the one-pass outputs bit for bit."""
    rng = fresh_rng()
    hk, hv, dk, dv, n = 1, 2, 32, 16, 20
    q, k, v, a, b = gdr_inputs(rng, n, hk, hv, dk, dv)
    a_log = rng.uniform(-1, 1, hv).astype(np.float32)
    dt_bias = rng.standard_normal(hv).astype(np.float32)
    one = np.zeros((1, hv, dk, dv), np.float32)
    whole = run_gdr(q, k, v, a, b, a_log, dt_bias, one, [0, n], [0], [0])
    state = np.full((2, hv, dk, dv), np.nan, np.float32)
    parts, cut = [], [0, 5, 6, 13] + list(range(14, n + 1))
    for i in range(len(cut) - 1):
        r = slice(cut[i], cut[i + 1])
        parts.append(run_gdr(q[r], k[r], v[r], a[r], b[r], a_log, dt_bias, state,
                             [0, cut[i + 1] - cut[i]], [1], [int(i > 0)]))
    assert np.array_equal(np.concatenate(parts), whole)
    assert np.array_equal(state[1], one[0])


@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
def test_rms_norm_gated(twin):
    rng = fresh_rng()
    x = (rng.standard_normal((7, 48)) * 3 + 1).astype(np.float32)
    z = rng.standard_normal((7, 48)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    out = np.full(x.shape, np.nan, np.float32)
    _C.ops.rms_norm_gated(out, x, z, w, 1e-6, 16, True, reference=twin)
    x3 = x.astype(np.float64).reshape(7, 3, 16)
    want = x3 / np.sqrt((x3 ** 2).mean(-1, keepdims=True) + 1e-6) * w
    want = want.reshape(7, 48) * (z / (1 + np.exp(-z.astype(np.float64))))
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-6


@pytest.mark.parametrize("per_row", [False, True])
def test_sigmoid_gate(per_row):
    rng = fresh_rng()
    x = rng.standard_normal((5, 12)).astype(np.float32)
    gate = rng.standard_normal((5, 1 if per_row else 12)).astype(np.float32) * 3
    want = x.astype(np.float64) / (1 + np.exp(-gate.astype(np.float64)))
    _C.ops.sigmoid_gate(x, gate)
    assert np.abs(x - want).max() < 1e-6


def test_bad_arguments_name_the_problem():
    x = np.zeros((4, 8), np.float32)
    state = np.zeros((2, 8, 3), np.float32)
    with pytest.raises(ValueError, match=r"conv_state F32\[2, 8, 3\] must be \[slots, 8, 2\]"):
        run_conv(x, np.zeros((8, 3), np.float32), None, state, [0, 4], [0], [0])
    with pytest.raises(ValueError, match=r"state_indices\[0\] = 2 is not a slot"):
        run_conv(x, np.zeros((8, 4), np.float32), None, state, [0, 4], [2], [0])
    with pytest.raises(ValueError, match="must have len\\(state_indices\\) \\+ 1 entries"):
        run_conv(x, np.zeros((8, 4), np.float32), None, state, [0, 2, 4], [0], [0])
    q = np.zeros((3, 16), np.float32)
    with pytest.raises(ValueError, match="A_log and dt_bias must be F32\\[4\\]"):
        run_gdr(q, q, np.zeros((3, 32), np.float32), np.zeros((3, 4), np.float32),
                np.zeros((3, 4), np.float32), np.zeros(3, np.float32), np.zeros(4, np.float32),
                np.zeros((1, 4, 8, 8), np.float32), [0, 3], [0], [0])
    with pytest.raises(ValueError, match=r"gate F32\[5, 2\] must be \[T, N\] or \[T, 1\]"):
        _C.ops.sigmoid_gate(np.zeros((5, 4), np.float32), np.zeros((5, 2), np.float32))


def mamba2_ref(x, dt, B, C, a_log, D, dt_bias, s0, dt_min=0.0, dt_max=np.inf):
    """One sequence: x [n, H, P], dt [n, H], B, C [n, G, N], s0 [H, P, N]."""
    n, H, P = x.shape
    G = B.shape[1]
    s = s0.astype(np.float64).copy()
    out = np.zeros((n, H, P))
    for t in range(n):
        for h in range(H):
            g = h // (H // G)
            step = np.clip(np.log1p(np.exp(dt[t, h] + dt_bias[h])), dt_min, dt_max)
            s[h] = s[h] * np.exp(-np.exp(a_log[h]) * step) + step * np.outer(x[t, h], B[t, g])
            out[t, h] = s[h] @ C[t, g] + D[h] * x[t, h]
    return out, s


def run_mamba2(x, dt, B, C, a_log, D, dt_bias, state, qsl, idx, init, twin=False,
               dt_min=0.0, dt_max=float("inf"), spec=None):
    out = np.full(x.shape, np.nan, np.float32)
    _C.ops.mamba2_scan(out, state, x, dt, B, C, a_log, D, dt_bias, np.asarray(qsl, np.int32),
                       np.asarray(idx, np.int32), np.asarray(init, np.int32),
                       None if spec is None else np.asarray(spec, np.int32), dt_min, dt_max,
                       reference=twin)
    return out


@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
@pytest.mark.parametrize("groups,limits", [(1, (0.0, np.inf)), (2, (0.05, 2.0))])
def test_mamba2_scan_varlen_slots(groups, limits, twin):
    rng = fresh_rng()
    H, P, N, lens, slots = 4, 8, 16, [6, 1, 0, 11], 5
    T = sum(lens)
    x = rng.standard_normal((T, H * P)).astype(np.float32)
    dt = rng.standard_normal((T, H)).astype(np.float32)
    B = rng.standard_normal((T, groups * N)).astype(np.float32)
    C = rng.standard_normal((T, groups * N)).astype(np.float32)
    a_log = rng.uniform(-1, 1, H).astype(np.float32)
    D = rng.standard_normal(H).astype(np.float32)
    dt_bias = rng.standard_normal(H).astype(np.float32)
    state = rng.standard_normal((slots, H, P, N)).astype(np.float32)
    before = state.copy()
    idx, init = [3, 0, 1, 4], [1, 0, 0, 1]
    qsl = np.concatenate([[0], np.cumsum(lens)])
    out = run_mamba2(x, dt, B, C, a_log, D, dt_bias, state, qsl, idx, init, twin, *limits)
    for s, n in enumerate(lens):
        if n == 0:
            continue
        r = slice(qsl[s], qsl[s + 1])
        s0 = before[idx[s]] if init[s] else np.zeros((H, P, N))
        want, s1 = mamba2_ref(x[r].reshape(n, H, P), dt[r], B[r].reshape(n, groups, N),
                              C[r].reshape(n, groups, N), a_log, D, dt_bias, s0, *limits)
        assert np.abs(out[r].reshape(n, H, P) - want).max() / np.abs(want).max() < 1e-5
        assert np.abs(state[idx[s]] - s1).max() / np.abs(s1).max() < 1e-5
    assert np.array_equal(state[[1, 2]], before[[1, 2]])


def test_mamba2_scan_chunks_equal_one_pass():
    rng = fresh_rng()
    H, P, N, n = 2, 4, 8, 17
    x = rng.standard_normal((n, H * P)).astype(np.float32)
    dt = rng.standard_normal((n, H)).astype(np.float32)
    B = rng.standard_normal((n, N)).astype(np.float32)
    C = rng.standard_normal((n, N)).astype(np.float32)
    a_log, D, dt_bias = (rng.standard_normal(H).astype(np.float32) for _ in range(3))
    whole = run_mamba2(x, dt, B, C, a_log, D, dt_bias, np.zeros((1, H, P, N), np.float32),
                       [0, n], [0], [0])
    state = np.full((1, H, P, N), np.nan, np.float32)
    parts, cut = [], [0, 3, 4, 12, n]
    for i in range(len(cut) - 1):
        r = slice(cut[i], cut[i + 1])
        parts.append(run_mamba2(x[r], dt[r], B[r], C[r], a_log, D, dt_bias, state,
                                [0, cut[i + 1] - cut[i]], [0], [int(i > 0)]))
    assert np.array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize("shared_weight", [True, False])
def test_rms_norm_gated_after_gate(shared_weight):
    """Mamba2's form: the norm of x * silu(z) over groups, times w (one per group or the row)."""
    rng = fresh_rng()
    x = rng.standard_normal((5, 32)).astype(np.float32)
    z = rng.standard_normal((5, 32)).astype(np.float32)
    w = rng.standard_normal(16 if shared_weight else 32).astype(np.float32)
    out = np.full(x.shape, np.nan, np.float32)
    _C.ops.rms_norm_gated(out, x, z, w, 1e-5, 16, False)
    y = (x * (z / (1 + np.exp(-z.astype(np.float64))))).reshape(5, 2, 16)
    want = (y / np.sqrt((y ** 2).mean(-1, keepdims=True) + 1e-5)).reshape(5, 32)
    want = want * (np.tile(w, 2) if shared_weight else w)
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-6


def _spec_case(rng, run, make_state, lens):
    """run(state, qsl, idx, init, spec) -> out over sequences of `lens` rows continuing slots 0
    and 1; every row but each sequence's last also saves its state into an extra slot (and one
    row saves none: -1). Each saved state must be, bit for bit, the state that running the
    sequence only up to that row leaves, and the outputs and final states those of a run
    without spec_state_indices."""
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(qsl[-1])
    spec = np.full(T, -1, np.int32)
    extra = iter(range(2, 2 + T))
    for s, n in enumerate(lens):
        for i in range(n - 1):
            spec[qsl[s] + i] = next(extra)
    spec[qsl[1]] = -1  # the second sequence's first row saves nothing
    start = make_state(2 + T)
    state = start.copy()
    out = run(state, qsl, [0, 1], [1, 1], spec)
    plain = start.copy()
    assert np.array_equal(run(plain, qsl, [0, 1], [1, 1], None), out)
    assert np.array_equal(state[:2], plain[:2])
    for s, n in enumerate(lens):
        for i in range(n):
            r = qsl[s] + i
            if spec[r] < 0:
                continue
            upto = start.copy()
            rows = np.array([0, i + 1], np.int32)  # the sequence's rows up to r alone
            run(upto, qsl[s] + rows, [s], [1], None, rows=slice(qsl[s], r + 1))
            assert np.array_equal(state[spec[r]], upto[s]), (s, i)
    unused = [j for j in range(2, 2 + T) if j not in set(spec.tolist())]
    assert np.array_equal(state[unused], start[unused])


def test_spec_state_indices_save_each_rows_state():
    rng = fresh_rng()
    lens = [4, 3]
    T = sum(lens)
    d, k = 12, 4
    x = rng.standard_normal((T, d)).astype(np.float32)
    w = rng.standard_normal((d, k)).astype(np.float32)

    def conv(state, qsl, idx, init, spec, rows=slice(None)):
        return run_conv(x[rows], w, None, state, np.asarray(qsl) - np.asarray(qsl)[0], idx,
                        init, spec=spec)
    _spec_case(rng, conv, lambda n: rng.standard_normal((n, d, k - 1)).astype(np.float32), lens)

    hk, hv, dk, dv = 1, 2, 8, 4
    q, kk, v, a, b = gdr_inputs(rng, T, hk, hv, dk, dv)
    a_log = rng.uniform(-1, 1, hv).astype(np.float32)
    dt_bias = rng.standard_normal(hv).astype(np.float32)

    def gdr(state, qsl, idx, init, spec, rows=slice(None)):
        return run_gdr(q[rows], kk[rows], v[rows], a[rows], b[rows], a_log, dt_bias, state,
                       np.asarray(qsl) - np.asarray(qsl)[0], idx, init, spec=spec)
    _spec_case(rng, gdr, lambda n: rng.standard_normal((n, hv, dk, dv)).astype(np.float32),
               lens)

    H, P, N = 2, 4, 8
    xs = rng.standard_normal((T, H * P)).astype(np.float32)
    dt = rng.standard_normal((T, H)).astype(np.float32)
    B = rng.standard_normal((T, N)).astype(np.float32)
    C = rng.standard_normal((T, N)).astype(np.float32)
    al, D, db = (rng.standard_normal(H).astype(np.float32) for _ in range(3))

    def scan(state, qsl, idx, init, spec, rows=slice(None)):
        return run_mamba2(xs[rows], dt[rows], B[rows], C[rows], al, D, db, state,
                          np.asarray(qsl) - np.asarray(qsl)[0], idx, init, spec=spec)
    _spec_case(rng, scan, lambda n: rng.standard_normal((n, H, P, N)).astype(np.float32), lens)


def test_spec_state_indices_bad_arguments():
    x = np.ones((3, 8), np.float32)
    state = np.zeros((2, 8, 3), np.float32)
    with pytest.raises(ValueError, match="spec_state_indices"):
        run_conv(x, np.zeros((8, 4), np.float32), None, state, [0, 3], [0], [0], spec=[1, 2, -1])
    with pytest.raises(ValueError, match="spec_state_indices"):
        run_conv(x, np.zeros((8, 4), np.float32), None, state, [0, 3], [0], [0], spec=[1, -1])
