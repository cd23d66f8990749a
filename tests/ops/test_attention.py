"""paged_attention vs a float64 numpy reference built from the same cache contents, plus batch
invariance (a row's bits do not depend on the batch or on chunked prefill) and argument checks."""
import os

import numpy as np
import pytest
from simd_levels import SIMD_LEVELS, run_capped

from tests.ops.block_tables import make_block_table
from vllmx import _C

F16, BF16 = int(_C.DType.F16), int(_C.DType.BF16)
BLOCK = 16


def upcast(cache, dtype_name):
    if dtype_name == "f32":
        return cache.astype(np.float64)
    if dtype_name == "f16":
        return cache.view(np.float16).astype(np.float64)
    return (cache.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def make_cache(rng, num_blocks, nkv, D, dtype_name, block_size=BLOCK):
    shape = (num_blocks, block_size, nkv, D)
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    if dtype_name == "f32":
        return k, v, -1
    if dtype_name == "f16":
        return k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16), F16
    return (k.view(np.uint32) >> 16).astype(np.uint16), (v.view(np.uint32) >> 16).astype(np.uint16), BF16


def reference(q, kc64, vc64, bt, qsl, seq_lens, scale, window=0, cap=0.0, sinks=None):
    num_blocks, bs, nkv, D = kc64.shape
    T = q.shape[0]
    nq = q.shape[1] // D
    G = nq // nkv
    out = np.zeros((T, nq * D))
    q64 = q.astype(np.float64).reshape(T, nq, D)
    for b in range(len(seq_lens)):
        q_len = qsl[b + 1] - qsl[b]
        L = seq_lens[b]
        pos = np.arange(L)
        slots = bt[b, pos // bs] * bs + pos % bs
        K = kc64.reshape(-1, nkv, D)[slots]  # [L, nkv, D]
        V = vc64.reshape(-1, nkv, D)[slots]
        for i in range(q_len):
            t = qsl[b] + i
            p = L - q_len + i
            lo = max(0, p - window + 1) if window > 0 else 0
            for h in range(nq):
                g = h // G
                s = K[lo:p + 1, g] @ q64[t, h] * scale
                if cap > 0:
                    s = cap * np.tanh(s / cap)
                sink = -np.inf if sinks is None else float(sinks[h])
                m = max(s.max(), sink)
                w = np.exp(s - m)
                out[t, h * D:(h + 1) * D] = (w / (w.sum() + np.exp(sink - m))) @ V[lo:p + 1, g]
    return out


def run(q, kc, vc, bt, qsl, sl, scale, cd, window=0, cap=0.0, ref=False, sinks=None):
    out = np.full(q.shape, np.nan, np.float32)
    _C.ops.paged_attention(out, q, (kc, cd), (vc, cd), bt, np.asarray(qsl, np.int32),
                           np.asarray(sl, np.int32), scale, window, cap, sinks=sinks,
                           reference=ref)
    return out


def rel_err(a, b):
    return np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b))


def scenario(seed, seqs, nq, nkv, D, dtype_name, extra_blocks=3):
    """seqs: list of (seq_len, q_len)."""
    rng = np.random.default_rng(seed)
    seq_lens = [s for s, _ in seqs]
    q_lens = [ql for _, ql in seqs]
    num_blocks = sum((s + BLOCK - 1) // BLOCK for s in seq_lens) + extra_blocks
    kc, vc, cd = make_cache(rng, num_blocks, nkv, D, dtype_name)
    bt = make_block_table(rng, seq_lens, num_blocks)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), nq * D)).astype(np.float32)
    return q, kc, vc, cd, bt, qsl, np.array(seq_lens, np.int32)


def shared_scenario(seed, nq, nkv, D, dtype_name):
    """An encoder's layout: one-token queries posed at the end of a whole sequence, rows 0-4 and
    7-9 over sequence A's cache (70 tokens), row 5 over B's (37), row 6 over a copy of A's
    blocks of another length (A's first 69 tokens): runs of rows sharing a cache, broken."""
    rng = np.random.default_rng(seed)
    kc, vc, cd = make_cache(rng, 5 + 3 + 2, nkv, D, dtype_name)
    perm = rng.permutation(10).astype(np.int32)
    a_row, b_row = perm[:5], np.concatenate([perm[5:8], [-1, -1]]).astype(np.int32)
    bt = np.stack([a_row] * 5 + [b_row, a_row] + [a_row] * 3)
    sl = np.array([70] * 5 + [37, 69] + [70] * 3, np.int32)
    qsl = np.arange(len(sl) + 1, dtype=np.int32)
    q = rng.standard_normal((len(sl), nq * D)).astype(np.float32)
    return q, kc, vc, cd, bt, qsl, sl


CASES = {
    "decode": [(1, 1), (17, 1), (100, 1), (33, 1), (250, 1), (16, 1)],
    "prefill": [(40, 40), (7, 7), (70, 70)],
    "chunked": [(90, 30), (64, 16), (130, 1), (20, 20), (47, 5)],
}


@pytest.mark.parametrize("dtype_name", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("D", [64, 128, 80])
@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (4, 1)])
def test_against_numpy(dtype_name, D, kind, heads):
    nq, nkv = heads
    q, kc, vc, cd, bt, qsl, sl = scenario(D + nq * 7 + nkv, CASES[kind], nq, nkv, D, dtype_name)
    scale = 1.0 / np.sqrt(D)
    exp = reference(q, upcast(kc, dtype_name), upcast(vc, dtype_name), bt, qsl, sl, scale)
    fast = run(q, kc, vc, bt, qsl, sl, scale, cd)
    ref = run(q, kc, vc, bt, qsl, sl, scale, cd, ref=True)
    assert rel_err(fast, exp) < 1e-5
    assert rel_err(ref, exp) < 1e-6
    assert rel_err(fast, ref.astype(np.float64)) < 1e-5


@pytest.mark.parametrize("dtype_name", ["f32", "f16"])
@pytest.mark.parametrize("window,cap", [(8, 0.0), (33, 0.0), (0, 5.0), (20, 3.0), (1, 0.0)])
def test_window_softcap(dtype_name, window, cap):
    seqs = CASES["chunked"] + CASES["decode"][:3]
    q, kc, vc, cd, bt, qsl, sl = scenario(window * 3 + int(cap), seqs, 8, 2, 80, dtype_name)
    q *= 3  # larger logits so the cap matters
    scale = 1.0 / np.sqrt(80)
    exp = reference(q, upcast(kc, dtype_name), upcast(vc, dtype_name), bt, qsl, sl, scale,
                    window, cap)
    fast = run(q, kc, vc, bt, qsl, sl, scale, cd, window, cap)
    ref = run(q, kc, vc, bt, qsl, sl, scale, cd, window, cap, ref=True)
    assert rel_err(fast, exp) < 1e-5
    assert rel_err(ref, exp) < 1e-6


@pytest.mark.parametrize("window", [0, 24])
@pytest.mark.parametrize("heads", [(8, 2), (4, 1)])
def test_sinks(window, heads):
    """gpt-oss's attention sinks: one more logit per head in the softmax denominator, some of
    them far above the scores (the row's weights then sum to almost nothing), some below."""
    nq, nkv = heads
    seqs = CASES["chunked"] + CASES["decode"][:3]
    q, kc, vc, cd, bt, qsl, sl = scenario(window + nq, seqs, nq, nkv, 64, "f16")
    scale = 1.0 / 8.0
    sinks = np.random.default_rng(np.random.SeedSequence().entropy).uniform(
        -4, 12, nq).astype(np.float32)
    exp = reference(q, upcast(kc, "f16"), upcast(vc, "f16"), bt, qsl, sl, scale, window,
                    sinks=sinks)
    fast = run(q, kc, vc, bt, qsl, sl, scale, cd, window, sinks=sinks)
    ref = run(q, kc, vc, bt, qsl, sl, scale, cd, window, ref=True, sinks=sinks)
    assert rel_err(fast, exp) < 1e-5
    assert rel_err(ref, exp) < 1e-6
    plain = reference(q, upcast(kc, "f16"), upcast(vc, "f16"), bt, qsl, sl, scale, window)
    assert rel_err(fast, plain) > 0.1  # the sinks matter
    with pytest.raises(ValueError, match=r"sinks F32\[3\] must have one entry per query head"):
        run(q, kc, vc, bt, qsl, sl, scale, cd, window, sinks=sinks[:3])


@pytest.mark.parametrize("D", [32, 40, 96, 256])
def test_other_head_sizes(D):
    q, kc, vc, cd, bt, qsl, sl = scenario(D, [(35, 3), (18, 1)], 4, 2, D, "f16")
    scale = 0.1
    exp = reference(q, upcast(kc, "f16"), upcast(vc, "f16"), bt, qsl, sl, scale)
    assert rel_err(run(q, kc, vc, bt, qsl, sl, scale, cd), exp) < 1e-5


@pytest.mark.parametrize("ref", [False, True])
@pytest.mark.parametrize("window,cap", [(0, 0.0), (24, 10.0)])
def test_batch_invariance(ref, window, cap):
    """Each row computed in a big mixed batch equals (bitwise) the row computed alone."""
    seqs = [(1, 1), (77, 1), (300, 1), (45, 45), (120, 20), (33, 1), (64, 17)]
    q, kc, vc, cd, bt, qsl, sl = scenario(5, seqs, 8, 2, 128, "f16")
    scale = 1.0 / np.sqrt(128)
    big = run(q, kc, vc, bt, qsl, sl, scale, cd, window, cap, ref)
    for b in range(len(seqs)):
        rows = slice(qsl[b], qsl[b + 1])
        alone = run(np.ascontiguousarray(q[rows]), kc, vc, bt[b:b + 1].copy(),
                    [0, qsl[b + 1] - qsl[b]], sl[b:b + 1], scale, cd, window, cap, ref)
        assert np.array_equal(alone.view(np.uint32), big[rows].view(np.uint32)), b
        # ... and each single query row alone (as a 1-row "decode" of its own position).
        for i in (0, qsl[b + 1] - qsl[b] - 1):
            t = qsl[b] + i
            pos_len = sl[b] - (qsl[b + 1] - qsl[b]) + i + 1
            one = run(np.ascontiguousarray(q[t:t + 1]), kc, vc, bt[b:b + 1].copy(), [0, 1],
                      [pos_len], scale, cd, window, cap, ref)
            assert np.array_equal(one.view(np.uint32), big[t:t + 1].view(np.uint32)), (b, i)


@pytest.mark.parametrize("window,cap", [(0, 0.0), (50, 0.0), (0, 4.0)])
def test_chunked_equals_unchunked(window, cap):
    rng = np.random.default_rng(11)
    L, nq, nkv, D = 203, 6, 2, 64
    kc, vc, cd = make_cache(rng, 20, nkv, D, "f16")
    bt = make_block_table(rng, [L], 20)
    q = rng.standard_normal((L, nq * D)).astype(np.float32)
    scale = 0.125
    whole = run(q, kc, vc, bt, [0, L], [L], scale, cd, window, cap)
    parts, start = [], 0
    for chunk in (64, 100, 1, 38):
        # Chunk batched together with an unrelated decode sequence.
        other_q = rng.standard_normal((1, nq * D)).astype(np.float32)
        qq = np.ascontiguousarray(np.concatenate([other_q, q[start:start + chunk]]))
        bt2 = np.concatenate([bt[::-1][:, ::-1].copy(), bt])  # garbage-free: other seq reuses blocks
        o = run(qq, kc, vc, bt2, [0, 1, 1 + chunk], [5, start + chunk], scale, cd, window, cap)
        parts.append(o[1:])
        start += chunk
    assert start == L
    chunked = np.concatenate(parts)
    assert np.array_equal(chunked.view(np.uint32), whole.view(np.uint32))
    exp = reference(q, upcast(kc, "f16"), upcast(vc, "f16"), bt, np.array([0, L]),
                    np.array([L]), scale, window, cap)
    assert rel_err(whole, exp) < 1e-5


@pytest.mark.parametrize("heads,D", [((9, 3), 64), ((4, 4), 80), ((16, 1), 64), ((32, 2), 48)])
@pytest.mark.parametrize("window,cap", [(0, 0.0), (37, 0.0), (0, 4.0)])
def test_decode_equals_prefill_row(heads, D, window, cap):
    """Decoding token t after a prefill of t tokens gives, bit for bit, row t of one prefill of
    t + 1 tokens: whatever tile of queries the row shared in the prefill, alone or batched."""
    nq, nkv = heads
    L = 150
    rng = np.random.default_rng(nq * 100 + D + window)
    kc, vc, cd = make_cache(rng, 12, nkv, D, "f16")
    bt = make_block_table(rng, [L], 12)
    q = (2 * rng.standard_normal((L, nq * D))).astype(np.float32)
    scale = 1.0 / np.sqrt(D)
    whole = run(q, kc, vc, bt, [0, L], [L], scale, cd, window, cap)
    ts = [0, 1, 14, 15, 16, 17, 31, 32, 33, 47, 64, 100, 127, 128, 149]
    # Every decode alone ...
    for t in ts:
        one = run(np.ascontiguousarray(q[t:t + 1]), kc, vc, bt, [0, 1], [t + 1], scale, cd,
                  window, cap)
        assert np.array_equal(one.view(np.uint32), whole[t:t + 1].view(np.uint32)), t
    # ... and all of them as one decode batch (the same cache blocks, one row per sequence).
    n = len(ts)
    batch = run(np.ascontiguousarray(q[ts]), kc, vc, np.repeat(bt, n, axis=0),
                np.arange(n + 1), [t + 1 for t in ts], scale, cd, window, cap)
    assert np.array_equal(batch.view(np.uint32), whole[ts].view(np.uint32))
    # A prefill of t tokens followed by a chunk of the rest, for a few split points.
    for t in (1, 16, 45):
        rest = run(np.ascontiguousarray(q[t:]), kc, vc, bt, [0, L - t], [L], scale, cd, window,
                   cap)
        assert np.array_equal(rest.view(np.uint32), whole[t:].view(np.uint32)), t
    exp = reference(q, upcast(kc, "f16"), upcast(vc, "f16"), bt, np.array([0, L]), np.array([L]),
                    scale, window, cap)
    assert rel_err(whole, exp) < 1e-5


@pytest.mark.parametrize("dtype_name", ["f16", "bf16"])
@pytest.mark.parametrize("heads,D", [((4, 1), 64), ((12, 12), 32), ((8, 2), 128)])
@pytest.mark.parametrize("window,cap", [(0, 0.0), (20, 30.0)])
def test_one_token_queries_sharing_a_cache(dtype_name, heads, D, window, cap):
    """Rows that share a sequence's cache (an encoder's bidirectional rows) go through one work
    item: right against float64, and each row's bits are those it gets alone."""
    nq, nkv = heads
    q, kc, vc, cd, bt, qsl, sl = shared_scenario(D + nq, nq, nkv, D, dtype_name)
    out = run(q, kc, vc, bt, qsl, sl, 0.2, cd, window, cap)
    want = reference(q, upcast(kc, dtype_name), upcast(vc, dtype_name), bt, qsl, sl, 0.2,
                     window, cap)
    assert rel_err(out, want) < 1e-5
    for t in range(len(sl)):
        alone = run(q[t:t + 1].copy(), kc, vc, bt[t:t + 1], [0, 1], sl[t:t + 1], 0.2, cd, window,
                    cap)
        assert np.array_equal(alone.view(np.uint32), out[t:t + 1].view(np.uint32)), t


def test_empty_and_zero_query_sequences():
    q, kc, vc, cd, bt, qsl, sl = scenario(3, [(10, 0), (20, 2), (5, 0)], 4, 2, 64, "f32")
    exp = reference(q, upcast(kc, "f32"), upcast(vc, "f32"), bt, qsl, sl, 0.1)
    assert rel_err(run(q, kc, vc, bt, qsl, sl, 0.1, cd), exp) < 1e-5
    out = np.zeros((0, 256), np.float32)
    _C.ops.paged_attention(out, out.copy(), kc, vc, np.zeros((0, 2), np.int32),
                           np.zeros(1, np.int32), np.zeros(0, np.int32), 0.1)


def test_bad_inputs():
    q, kc, vc, cd, bt, qsl, sl = scenario(4, [(40, 2), (17, 1)], 4, 2, 64, "f16")
    good = dict(out=np.zeros_like(q), q=q, key_cache=(kc, cd), value_cache=(vc, cd),
                block_table=bt, query_start_loc=qsl, seq_lens=sl, scale=0.1)
    _C.ops.paged_attention(**good)

    def bad(**kw):
        args = dict(good)
        args.update(kw)
        with pytest.raises(ValueError, match="paged_attention"):
            _C.ops.paged_attention(**args)

    bt_bad = bt.copy()
    bt_bad[0, 1] = kc.shape[0]
    bad(block_table=bt_bad)
    bt_neg = bt.copy()
    bt_neg[1, 0] = -1
    bad(block_table=bt_neg)
    bad(block_table=np.ascontiguousarray(bt[:, :1]))  # too narrow for 40 tokens
    bad(block_table=np.ascontiguousarray(bt[:1]))
    bad(seq_lens=np.array([1, 17], np.int32))  # seq_len < q_len
    bad(seq_lens=np.array([40, 17, 3], np.int32))
    bad(query_start_loc=np.array([0, 2, 4], np.int32))  # last != T
    bad(query_start_loc=np.array([1, 2, 3], np.int32))
    bad(query_start_loc=np.array([0, 3, 2], np.int32))
    bad(q=np.zeros((3, 4 * 64 + 1), np.float32), out=np.zeros((3, 4 * 64 + 1), np.float32))
    bad(q=np.zeros((3, 3 * 64), np.float32), out=np.zeros((3, 3 * 64), np.float32))  # 3 % 2
    bad(out=np.zeros((2, 256), np.float32))
    bad(q=q.astype(np.int32))
    bad(value_cache=(vc[:, :8].copy(), cd))
    bad(key_cache=kc.view(np.float16), value_cache=vc.view(np.float16).astype(np.float32))
    bad(key_cache=kc.astype(np.int32), value_cache=vc.astype(np.int32))
    bad(block_table=bt.astype(np.int64))
    bad(scale=float("nan"))


_ISA_SCRIPT = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_attention import CASES, reference, rel_err, run, scenario, shared_scenario, upcast
for i, (kind, dt, D, window, cap) in enumerate([("prefill", "f16", 64, 0, 0.0),
                                                ("chunked", "bf16", 80, 20, 30.0),
                                                ("decode", "f32", 128, 0, 0.0),
                                                ("shared", "f16", 64, 0, 0.0)]):
    if kind == "shared":
        q, kc, vc, cd, bt, qsl, sl = shared_scenario(i, 8, 2, D, dt)
    else:
        q, kc, vc, cd, bt, qsl, sl = scenario(i, CASES[kind], 8, 2, D, dt)
    out = run(q, kc, vc, bt, qsl, sl, 0.1, cd, window, cap)
    want = reference(q, upcast(kc, dt), upcast(vc, dt), bt, qsl, sl, 0.1, window, cap)
    assert rel_err(out, want) < 1e-5, (kind, rel_err(out, want))
    # batch invariance: each sequence alone gives its rows' bits
    for b in range(len(sl)):
        r = slice(int(qsl[b]), int(qsl[b + 1]))
        alone = run(q[r].copy(), kc, vc, bt[b:b + 1], [0, r.stop - r.start], sl[b:b + 1], 0.1, cd,
                    window, cap)
        assert np.array_equal(alone.view(np.uint32), out[r].view(np.uint32)), (kind, b)
print("ok")
"""


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_each_isa(isa):
    """Each SIMD level's path (portable, its AVX2 build, AVX-512) against float64, batch
    invariant."""
    r = run_capped(isa, _ISA_SCRIPT, os.path.dirname(__file__))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
