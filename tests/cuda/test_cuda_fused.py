"""The fused CUDA ops of a decode step against the separate ops they replace, on random inputs:
qk_norm_rope_cache (per-head q/k rms_norm + rotary + the KV-cache write), linear_act_and_mul
(gate_up projection + silu/gelu-and-mul) and rms_norm_linear (add + rms_norm + projection),
plus repeated split-KV decodes (the last partition merges, and leaves its counters ready for
the next launch) and the decode-only max_query_len hint."""
import numpy as np
import pytest

from vllmx import _C
from vllmx.device import BF16, F16, F32, DeviceArray

from .test_cuda_attention import attention_case, run_attention
from .test_cuda_ops import (
    Q4_0,
    Q4_1,
    Q8_0,
    as_f32,
    assert_close,
    cos_sin_cache,
    dev,
    host,
    random_blocks,
    rounded,
)

pytestmark = pytest.mark.gpu


def qkv_case(rng, T, nq, nkv, D, dtype, cache_dtype, rot_dim, max_pos, norm):
    qkv = rounded(rng.standard_normal((T, (nq + 2 * nkv) * D)).astype(np.float32), dtype)
    pos = rng.integers(0, max_pos, T).astype(np.int32)
    pos[-1] = max_pos  # out of range: left unrotated, like the rotary op
    num_blocks, bs = 4 + T // 16, 16
    slots = rng.permutation(num_blocks * bs)[:T].astype(np.int32)
    slots[0] = -1  # padding: not written
    init = host(rng.standard_normal((num_blocks, bs, nkv, D)).astype(np.float32), cache_dtype)
    w = None
    if norm:
        w = [(1 + 0.3 * rng.standard_normal(D)).astype(np.float32) for _ in range(2)]
    return qkv, pos, slots, init, w, cos_sin_cache(max_pos, rot_dim)


def separate_ops(case, nq, nkv, D, dtype, cache_dtype, is_neox):
    """The unfused sequence on the GPU: split, rms_norm per head, rotary, write_kv_cache."""
    qkv, pos, slots, init, w, cache = case
    T = len(qkv)
    q, k, v = (dev(np.ascontiguousarray(a), dtype) for a in np.split(
        qkv, [nq * D, (nq + nkv) * D], axis=1))
    if w is not None:
        qn, kn = DeviceArray.empty((T * nq, D), dtype), DeviceArray.empty((T * nkv, D), dtype)
        _C.ops.rms_norm(qn, q.reshape(T * nq, D), DeviceArray.from_numpy(w[0]), 1e-6)
        _C.ops.rms_norm(kn, k.reshape(T * nkv, D), DeviceArray.from_numpy(w[1]), 1e-6)
        q, k = qn.reshape(T, nq * D), kn.reshape(T, nkv * D)
    _C.ops.rotary(DeviceArray.from_numpy(pos), q, k, DeviceArray.from_numpy(cache), D, is_neox)
    kc, vc = DeviceArray.from_numpy(init, cache_dtype), DeviceArray.from_numpy(init, cache_dtype)
    _C.ops.write_kv_cache(k, v, kc, vc, DeviceArray.from_numpy(slots))
    return q.numpy(), kc.numpy(), vc.numpy()


def fused_op(case, nq, nkv, D, dtype, cache_dtype, is_neox):
    qkv, pos, slots, init, w, cache = case
    q = DeviceArray.empty((len(qkv), nq * D), dtype)
    kc, vc = DeviceArray.from_numpy(init, cache_dtype), DeviceArray.from_numpy(init, cache_dtype)
    qn = kn = None
    if w is not None:
        qn, kn = DeviceArray.from_numpy(w[0]), DeviceArray.from_numpy(w[1])
    _C.ops.qk_norm_rope_cache(q, dev(qkv, dtype), DeviceArray.from_numpy(pos),
                              DeviceArray.from_numpy(cache), qn, kn, 1e-6, kc, vc,
                              DeviceArray.from_numpy(slots), nq, nkv, is_neox)
    return q.numpy(), kc.numpy(), vc.numpy()


# (q heads, kv heads, head size, rotary dim): head sizes 64 / 128 / 256 run in registers (64
# with partial rotary, its pairs 16 elements apart: 8 lanes), 80 and a rotary half of 50 (pairs
# not a whole number of lanes apart, neox) through shared memory.
@pytest.mark.parametrize("heads", [(16, 8, 128, 128), (32, 8, 128, 128), (8, 2, 64, 32),
                                   (4, 4, 256, 256), (4, 2, 80, 80), (4, 2, 128, 100)],
                         ids=lambda h: f"{h[0]}q{h[1]}kv{h[2]}r{h[3]}")
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype,cache_dtype", [(BF16, BF16), (F16, F16), (F32, F32), (BF16, F32)])
@pytest.mark.parametrize("T", [1, 3, 40])
def test_qk_norm_rope_cache(rng, T, dtype, cache_dtype, is_neox, norm, heads):
    nq, nkv, D, rot_dim = heads
    case = qkv_case(rng, T, nq, nkv, D, dtype, cache_dtype, rot_dim, 64, norm)
    want = separate_ops(case, nq, nkv, D, dtype, cache_dtype, is_neox)
    got = fused_op(case, nq, nkv, D, dtype, cache_dtype, is_neox)
    if not norm:  # rope and the copies round at the same points: bit-identical
        for g, w_ in zip(got, want):
            np.testing.assert_array_equal(g, w_)
        return
    # The norm's f32 sum runs in another order: at most a rounding apart.
    for g, w_, dt in zip(got, want, (dtype, cache_dtype, cache_dtype)):
        assert_close(as_f32(g, dt), as_f32(w_, dt), dt, "qk_norm_rope_cache")
    # Slots not written keep their bytes.
    slots, init = case[2], case[3]
    untouched = np.ones(init.shape[0] * init.shape[1], bool)
    untouched[slots[slots >= 0]] = False
    for c in got[1:]:
        np.testing.assert_array_equal(c.reshape(-1, *c.shape[2:])[untouched],
                                      init.reshape(-1, *init.shape[2:])[untouched])


def test_qk_norm_rope_cache_bad_args(rng):
    case = qkv_case(rng, 2, 4, 2, 64, BF16, BF16, 64, 16, False)
    qkv, pos, slots, init, _, cache = case
    q = DeviceArray.empty((2, 4 * 64), BF16)
    kc, vc = DeviceArray.from_numpy(init, BF16), DeviceArray.from_numpy(init, BF16)
    args = (DeviceArray.from_numpy(pos), DeviceArray.from_numpy(cache))
    with pytest.raises(ValueError, match="num_heads 3"):  # 3 query heads do not fit
        _C.ops.qk_norm_rope_cache(q, dev(qkv, BF16), *args, None, None, 1e-6, kc, vc,
                                  DeviceArray.from_numpy(slots), 3, 2, True)
    with pytest.raises(ValueError, match="q_norm and k_norm"):
        _C.ops.qk_norm_rope_cache(q, dev(qkv, BF16), *args,
                                  DeviceArray.from_numpy(np.ones(64, np.float32)), None,
                                  1e-6, kc, vc, DeviceArray.from_numpy(slots), 4, 2, True)


def gate_up_weight(rng, n, k, wdt):
    if wdt in (Q8_0, Q4_0, Q4_1):
        return random_blocks(rng, n, k, wdt)
    return host((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), wdt)


@pytest.mark.parametrize("wdt", [BF16, F16, Q8_0, Q4_0, Q4_1],
                         ids=["bf16", "f16", "q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("act", [0, 1, 2], ids=["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("T", [1, 2, 4, 5, 37])
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_linear_act_and_mul_matches_linear_then_act(rng, dtype, T, act, wdt):
    """Every path (the gated GEMV for decode rows, GEMM + act_and_mul otherwise) gives the bits
    of linear followed by the activation op; odd I checks the GEMV's row guards."""
    n_out, k = 515, 256
    w = DeviceArray.from_numpy(gate_up_weight(rng, 2 * n_out, k, wdt), wdt)
    x = dev(rng.standard_normal((T, k)).astype(np.float32), dtype)
    h = DeviceArray.empty((T, 2 * n_out), dtype)
    _C.ops.linear(h, x, w)
    want = DeviceArray.empty((T, n_out), dtype)
    if act == 0:
        _C.ops.silu_and_mul(want, h)
    else:
        _C.ops.gelu_and_mul(want, h, act == 2)
    got = DeviceArray.empty((T, n_out), dtype)
    _C.ops.linear_act_and_mul(got, x, w, DeviceArray.empty((T, 2 * n_out), dtype), act)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_linear_act_and_mul_bad_args(rng):
    w = DeviceArray.from_numpy(gate_up_weight(rng, 64, 64, BF16), BF16)
    x = dev(rng.standard_normal((2, 64)).astype(np.float32), BF16)
    with pytest.raises(ValueError, match="out"):
        _C.ops.linear_act_and_mul(DeviceArray.empty((2, 64), BF16), x, w,
                                  DeviceArray.empty((2, 64), BF16), 0)
    with pytest.raises(ValueError, match="act"):
        _C.ops.linear_act_and_mul(DeviceArray.empty((2, 32), BF16), x, w,
                                  DeviceArray.empty((2, 64), BF16), 7)


def test_split_decode_repeats_identically():
    """The same decode batch three times: the merge counters reset after every launch."""
    seqs = [(1100, 1), (5000, 1), (64, 1), (65, 1), (3000, 1)]
    case = attention_case(3, seqs, 32, 8, 128, BF16, BF16)
    outs = [run_attention(case, 32, 128, BF16, BF16, 128**-0.5) for _ in range(3)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def norm_linear_ref(x, res, g, w, act, dtype):
    """add_rms_norm then linear / linear + act, as separate CUDA ops."""
    T, K = x.shape
    xd, gd = dev(x, dtype), DeviceArray.from_numpy(g)
    y, res_out = DeviceArray.empty((T, K), dtype), DeviceArray.empty((T, K), dtype)
    _C.ops.add_rms_norm(y, res_out if res is not None else None, xd,
                        None if res is None else dev(res, dtype), gd, 1e-6)
    n = w.shape[0]
    h = DeviceArray.empty((T, n), dtype)
    _C.ops.linear(h, y, w)
    if act < 0:
        return h.numpy(), res_out.numpy() if res is not None else None
    out = DeviceArray.empty((T, n // 2), dtype)
    (_C.ops.silu_and_mul(out, h) if act == 0 else _C.ops.gelu_and_mul(out, h, act == 2))
    return out.numpy(), res_out.numpy() if res is not None else None


@pytest.mark.parametrize("wdt", [BF16, Q8_0, Q4_1], ids=["bf16", "q8_0", "q4_1"])
@pytest.mark.parametrize("act", [-1, 0, 2], ids=["none", "silu", "gelu_tanh"])
@pytest.mark.parametrize("with_res", [True, False], ids=["residual", "first_layer"])
@pytest.mark.parametrize("T", [1, 3, 4, 5, 40])
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_rms_norm_linear(rng, dtype, T, with_res, act, wdt):
    K, n = 1024, 2 * 389
    x = rounded(rng.standard_normal((T, K)).astype(np.float32) * 3, dtype)
    res = rounded(rng.standard_normal((T, K)).astype(np.float32), dtype) if with_res else None
    g = (1 + 0.2 * rng.standard_normal(K)).astype(np.float32)
    w = DeviceArray.from_numpy(gate_up_weight(rng, n, K, wdt), wdt)
    want, want_res = norm_linear_ref(x, res, g, w, act, dtype)
    out = DeviceArray.empty((T, n if act < 0 else n // 2), dtype)
    res_out = DeviceArray.empty((T, K), dtype) if with_res else None
    _C.ops.rms_norm_linear(out, res_out, dev(x, dtype), dev(res, dtype) if with_res else None,
                           DeviceArray.from_numpy(g), 1e-6, w, None,
                           DeviceArray.empty((T, K), dtype),
                           DeviceArray.empty((T, n), dtype) if act >= 0 else None, act)
    if with_res:  # x + residual rounds the same way on every path
        np.testing.assert_array_equal(res_out.numpy(), want_res)
    if T > 4 or (T > 2 and wdt == dtype):  # not a GEMV: the separate ops themselves
        np.testing.assert_array_equal(out.numpy(), want)
    else:  # the norm's f32 sum runs in another order
        assert_close(as_f32(out.numpy(), dtype), as_f32(want, dtype), dtype, "rms_norm_linear")


def test_rms_norm_linear_bad_args(rng):
    x = dev(rng.standard_normal((2, 64)).astype(np.float32), BF16)
    w = DeviceArray.from_numpy(gate_up_weight(rng, 32, 64, BF16), BF16)
    tmp = DeviceArray.empty((2, 64), BF16)
    with pytest.raises(ValueError, match="norm weight"):  # norm weight of the wrong size
        _C.ops.rms_norm_linear(DeviceArray.empty((2, 32), BF16), None, x, None,
                               DeviceArray.from_numpy(np.ones(63, np.float32)), 1e-6, w, None, tmp,
                               None, -1)
    with pytest.raises(ValueError, match="go together"):
        _C.ops.rms_norm_linear(DeviceArray.empty((2, 32), BF16), None, x, x,
                               DeviceArray.from_numpy(np.ones(64, np.float32)), 1e-6, w, None, tmp,
                               None, -1)


def test_rms_norm_linear_large_weight_is_the_separate_ops(rng):
    """Above the fusion bound (long products stream w; the norm stays its own kernel) a decode
    row gets exactly add_rms_norm then the GEMV."""
    T, K, n = 2, 4096, 2 * 4104
    x = rounded(rng.standard_normal((T, K)).astype(np.float32), BF16)
    res = rounded(rng.standard_normal((T, K)).astype(np.float32), BF16)
    g = (1 + 0.2 * rng.standard_normal(K)).astype(np.float32)
    w = DeviceArray.from_numpy(gate_up_weight(rng, n, K, BF16), BF16)
    want, _ = norm_linear_ref(x, res, g, w, 0, BF16)
    out = DeviceArray.empty((T, n // 2), BF16)
    _C.ops.rms_norm_linear(out, DeviceArray.empty((T, K), BF16), dev(x, BF16), dev(res, BF16),
                           DeviceArray.from_numpy(g), 1e-6, w, None,
                           DeviceArray.empty((T, K), BF16), DeviceArray.empty((T, n), BF16), 0)
    np.testing.assert_array_equal(out.numpy(), want)


def test_decode_only_hint_skips_nothing_it_needs():
    """max_query_len=1 (a decode-only step: no prefill kernels) gives the same bits as 0."""
    seqs = [(1100, 1), (70, 1), (3000, 1), (1, 1)]
    q, kc, vc, bt, qsl, sl = attention_case(4, seqs, 16, 8, 128, BF16, BF16)
    outs = []
    for hint in (0, 1):
        out = DeviceArray.empty(q.shape, BF16)
        _C.ops.paged_attention(out, dev_bits(q), (dev_bits(kc), BF16), (dev_bits(vc), BF16),
                               DeviceArray.from_numpy(bt), DeviceArray.from_numpy(qsl),
                               DeviceArray.from_numpy(sl), 128**-0.5, 0, 0.0, hint)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="max_query_len"):
        _C.ops.paged_attention(DeviceArray.empty(q.shape, BF16), dev_bits(q), (dev_bits(kc), BF16),
                               (dev_bits(vc), BF16), DeviceArray.from_numpy(bt),
                               DeviceArray.from_numpy(qsl), DeviceArray.from_numpy(sl), 0.1, 0, 0.0,
                               -1)


def dev_bits(a):
    return DeviceArray.from_numpy(a, BF16)
