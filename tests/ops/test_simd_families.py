"""Every SIMD path of the kernel families whose pickers used to read the CPU's features
directly (KV-cache writes, attention, the sampler, the activations), of MoE routing, of the
grammar mask and of causal_conv1d's silu: run at each level that VLLMX_ISA caps
(tests/ops/simd_levels.py) and compared with the scalar twins on fresh random inputs. The quant / linear families have their own per-level tests beside them."""

import pytest
from simd_levels import SIMD_LEVELS, run_capped

_SCRIPT = r"""
import numpy as np
from vllmx import _C
rng = np.random.default_rng(11)
F16, BF16, F32 = (int(_C.DType[n]) for n in ("F16", "BF16", "F32"))

def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))

# write_kv_cache: every cache dtype, rows a multiple of the vector width and not.
for cd, np_dt in ((F16, np.float16), (BF16, np.uint16), (F32, np.float32)):
    for nkv, d in ((2, 64), (3, 40)):
        T, nb, bs = 13, 6, 16
        k = rng.standard_normal((T, nkv * d)).astype(np.float32)
        v = rng.standard_normal((T, nkv * d)).astype(np.float32)
        slots = rng.choice(nb * bs, T, replace=False).astype(np.int32)
        slots[3] = -1
        outs = []
        for ref in (False, True):
            kc = np.zeros((nb, bs, nkv, d), np_dt); vc = np.zeros_like(kc)
            _C.ops.write_kv_cache(k, v, (kc, cd), (vc, cd), slots, reference=ref)
            outs.append((kc, vc))
        assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1]), cd

# paged_attention: prefill chunks and decodes over an f16 cache, two head sizes.
for d in (64, 128):
    nq, nkv, bs, nb = 4, 2, 16, 12
    kc = rng.standard_normal((nb, bs, nkv, d)).astype(np.float16)
    vc = rng.standard_normal((nb, bs, nkv, d)).astype(np.float16)
    seq_lens = np.array([37, 5, 60], np.int32)
    q_lens = np.array([37, 1, 3], np.int32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    bt = rng.permutation(nb)[:12].reshape(3, 4).astype(np.int32)
    q = rng.standard_normal((int(qsl[-1]), nq * d)).astype(np.float32)
    outs = []
    for ref in (False, True):
        out = np.empty_like(q)
        _C.ops.paged_attention(out, q, (kc, F16), (vc, F16), bt, qsl, seq_lens, d ** -0.5,
                               reference=ref)
        outs.append(out)
    assert rel(outs[0], outs[1]) < 1e-5, ("attention", d, rel(outs[0], outs[1]))

# sample: greedy rows agree exactly; seeded rows advance the generators identically and draw
# from the same kept set (the fast path's float order may differ from the twin's at ties).
B, V = 16, 5000
logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
t = rng.choice([0.0, 0.7, 1.2], B).astype(np.float32)
k = rng.choice([0, 5, 100], B).astype(np.int32)
p = rng.choice([1.0, 0.9], B).astype(np.float32)
m = np.zeros(B, np.float32)
st = (rng.integers(1, 2**63, (B, 2))).astype(np.uint64)
res = []
for ref in (False, True):
    ids = np.empty(B, np.int32); lps = np.empty(B, np.float32); s = st.copy()
    _C.ops.sample(ids, lps, logits.copy(), t, k, p, m, s, reference=ref)
    res.append((ids, lps, s))
assert np.array_equal(res[0][2], res[1][2])
greedy = t == 0
assert np.array_equal(res[0][0][greedy], res[1][0][greedy])
assert np.array_equal(res[0][0][greedy], logits[greedy].argmax(1))
assert np.mean(res[0][0] == res[1][0]) >= 0.9
assert rel(res[0][1], res[1][1]) < 1e-5

# silu / gelu (erf and tanh): widths a multiple of 16 and not.
for n in (256, 77):
    x = (rng.standard_normal((5, 2 * n)) * 3).astype(np.float32)
    for name, extra in (("silu_and_mul", ()), ("gelu_and_mul", (False,)), ("gelu_and_mul", (True,))):
        outs = []
        for ref in (False, True):
            out = np.empty((5, n), np.float32)
            getattr(_C.ops, name)(out, x, *extra, reference=ref)
            outs.append(out)
        assert rel(outs[0], outs[1]) < 1e-5, (name, extra, n, rel(outs[0], outs[1]))
    for tanh in (False, True):  # gelu without the gate (GPT-2, GPT-NeoX, Starcoder2)
        outs = []
        for ref in (False, True):
            out = np.empty((5, 2 * n), np.float32)
            _C.ops.gelu(out, x, tanh, reference=ref)
            outs.append(out)
        assert rel(outs[0], outs[1]) < 1e-5, ("gelu", tanh, n, rel(outs[0], outs[1]))
# softcap: the exp512 tanh and the scalar one, a run a multiple of 16 and not.
for n in (4096, 8197):
    x = (rng.standard_normal((2, n)) * 60).astype(np.float32)
    outs = []
    for ref in (False, True):
        y = x.copy()
        _C.ops.softcap(y, 30.0, reference=ref)
        outs.append(y)
    assert rel(outs[0], outs[1]) < 1e-6 and np.abs(outs[0]).max() <= 30.0, rel(outs[0], outs[1])
# topk_softmax (MoE routing): the AVX-512 softmax denominator and the scalar one.
g = (rng.standard_normal((9, 70)) * 3).astype(np.float32)
for renorm in (False, True):
    outs = []
    for ref in (False, True):
        w = np.empty((9, 6), np.float32); ids = np.empty((9, 6), np.int32)
        _C.ops.topk_softmax(w, ids, g, renorm, reference=ref)
        outs.append((w, ids))
    assert np.array_equal(outs[0][1], outs[1][1]) and rel(outs[0][0], outs[1][0]) < 1e-6
# apply_token_bitmask (structured output's grammar mask): the AVX-512 masked stores and the
# AVX2 blends against the bit-by-bit twin, rows by index, vocabularies a multiple of 32 and not.
for vocab in (7, 64, 1000, 49157):
    logits = (rng.standard_normal((5, vocab)) * 3).astype(np.float32)
    m = rng.integers(0, 2**32, (3, (vocab + 31) // 32), dtype=np.uint64).astype(np.uint32)
    m[0, 0], m[1, -1] = 0xFFFFFFFF, 0
    idx = np.array([4, 1, 2], np.int32)
    outs = []
    for ref in (False, True):
        x = logits.copy()
        _C.ops.apply_token_bitmask(x, m.view(np.int32), idx, reference=ref)
        outs.append(x)
    assert np.array_equal(outs[0], outs[1]), ("bitmask", vocab)
    assert np.array_equal(outs[0][[0, 3]], logits[[0, 3]]) and np.isinf(outs[0][1]).any()
# causal_conv1d's silu (the hybrids' conv ahead of their mixers): the vector exp against the f64
# reference, channel counts a multiple of the vector width and not, history and none.
for D in (64, 300, 45):
    x = (rng.standard_normal((30, D)) * 3).astype(np.float32)
    w = rng.standard_normal((D, 4)).astype(np.float32)
    qsl, idx, init = (np.array(a, np.int32) for a in ([0, 12, 30], [0, 1], [1, 0]))
    st0 = rng.standard_normal((2, D, 3)).astype(np.float32)
    outs = []
    for ref in (False, True):
        o, st = np.empty_like(x), st0.copy()
        _C.ops.causal_conv1d(o, x, w, None, st, qsl, idx, init, None, True, reference=ref)
        outs.append((o, st))
    assert rel(outs[0][0], outs[1][0]) < 1e-5 and np.array_equal(outs[0][1], outs[1][1]), D
print("ok")
"""


@pytest.mark.parametrize("isa", SIMD_LEVELS)
def test_simd_paths(isa):
    """Each SIMD level (capped with VLLMX_ISA) agrees with the scalar twin."""
    r = run_capped(isa, _SCRIPT)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
