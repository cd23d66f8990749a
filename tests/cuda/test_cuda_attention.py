"""CUDA paged_attention (cuda/attention.cu, attention_decode.cu, attention_prefill_sm90.cu,
attention_mla.cu) against a float64 numpy reference and the CPU op on the same random inputs:
decode, prefill and chunked batches, windows, soft caps, sinks, dtypes, block sizes, MLA's
shape and the generic kernel's head sizes (256: the tensor-core kernels on Hopper). bf16/f16 outputs: max error / max |reference| within the dtype's tolerance. Skipped
without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from tests.cuda.test_cuda_linear import (
    BF16,
    F16,
    F32,
    TOL,
    _cuda_ok,
    from_bits,
    nan_out,
    rel_err,
    to_bits,
    to_dev,
)
from tests.ops.block_tables import make_block_table
from vllmx import _C

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_ok(), reason="needs a CUDA GPU")]


def attention_reference(q64, k64, v64, bt, qsl, seq_lens, scale, window=0, cap=0.0, sinks=None):
    """float64, vectorized per sequence. q64 [T, nq, D]; caches [blocks, bs, nkv, D]; sinks
    [nq]: one more logit per head in each row's denominator."""
    _, bs, nkv, D = k64.shape
    T, nq, _ = q64.shape
    G = nq // nkv
    out = np.zeros((T, nq, D))
    for b in range(len(seq_lens)):
        ql, L = int(qsl[b + 1] - qsl[b]), int(seq_lens[b])
        if ql == 0:
            continue
        pos = np.arange(L)
        slots = bt[b, pos // bs].astype(np.int64) * bs + pos % bs
        K = np.repeat(k64.reshape(-1, nkv, D)[slots], G, axis=1)  # [L, nq, D]
        V = np.repeat(v64.reshape(-1, nkv, D)[slots], G, axis=1)
        qp = L - ql + np.arange(ql)  # absolute positions of the queries
        # matmul, not einsum: BLAS takes the long prompts' products in a fraction of the time
        s = np.matmul(q64[qsl[b]:qsl[b + 1]].transpose(1, 0, 2), K.transpose(1, 2, 0)) * scale
        if cap > 0:
            s = cap * np.tanh(s / cap)
        visible = pos[None, :] <= qp[:, None]
        if window > 0:
            visible &= pos[None, :] > qp[:, None] - window
        s = np.where(visible[None], s, -np.inf)
        sink = (np.full(nq, -np.inf) if sinks is None else sinks.astype(np.float64))[:, None, None]
        top = np.maximum(s.max(-1, keepdims=True), sink)
        p = np.exp(s - top)
        p /= p.sum(-1, keepdims=True) + np.exp(sink - top)
        out[qsl[b]:qsl[b + 1]] = np.matmul(p, V.transpose(1, 0, 2)).transpose(1, 0, 2)
    return out


def attention_case(seed, seqs, nq, nkv, D, qdt, cdt, block_size=16, q_scale=1.0):
    """seqs: [(seq_len, q_len)]. Returns host arrays (bits) and their exact f64 values."""
    rng = np.random.default_rng(seed)
    seq_lens = np.array([s for s, _ in seqs], np.int32)
    qsl = np.concatenate([[0], np.cumsum([ql for _, ql in seqs])]).astype(np.int32)
    num_blocks = int(sum((s + block_size - 1) // block_size for s in seq_lens)) + 3
    shape = (num_blocks, block_size, nkv, D)
    kc = to_bits(rng.standard_normal(shape).astype(np.float32), cdt)
    vc = to_bits(rng.standard_normal(shape).astype(np.float32), cdt)
    q = to_bits(q_scale * rng.standard_normal((int(qsl[-1]), nq * D)).astype(np.float32), qdt)
    bt = make_block_table(rng, seq_lens, num_blocks, block_size=block_size, spare=2)
    return q, kc, vc, bt, qsl, seq_lens


def run_attention(case, nq, D, qdt, cdt, scale, window=0, cap=0.0, sinks=None,
                  max_query_len=0):
    q, kc, vc, bt, qsl, sl = case
    out = nan_out(q.shape, qdt)
    _C.ops.paged_attention(out, to_dev(q, qdt), (to_dev(kc, cdt), cdt), (to_dev(vc, cdt), cdt),
                           to_dev(bt), to_dev(qsl), to_dev(sl), scale, window, cap,
                           max_query_len, None if sinks is None else to_dev(sinks))
    return from_bits(out.numpy(), qdt)


def check_attention(seqs, heads, D, qdt=BF16, cdt=BF16, window=0, cap=0.0, block_size=16,
                    seed=0, q_scale=1.0, cpu_oracle=True, sinks=None, max_query_len=0):
    nq, nkv = heads
    case = attention_case(seed, seqs, nq, nkv, D, qdt, cdt, block_size, q_scale)
    q, kc, vc, bt, qsl, sl = case
    scale = 1.0 / np.sqrt(D)
    got = run_attention(case, nq, D, qdt, cdt, scale, window, cap, sinks, max_query_len)
    q64 = from_bits(q, qdt)
    want = attention_reference(q64.reshape(len(q), nq, D), from_bits(kc, cdt), from_bits(vc, cdt),
                               bt, qsl, sl, scale, window, cap, sinks).reshape(len(q), nq * D)
    tol = TOL[BF16] if BF16 in (qdt, cdt) else TOL[F16]
    assert rel_err(got, want) < tol
    if cpu_oracle:  # the CPU op on the same inputs (q upcast to f32; the same cache bits)
        cpu = np.empty(q.shape, np.float32)
        _C.ops.paged_attention(cpu, q64.astype(np.float32), (kc, cdt), (vc, cdt), bt, qsl, sl,
                               scale, window, cap, sinks=sinks)
        assert rel_err(got, cpu.astype(np.float64)) < tol
    return got


DECODE = [(1, 1), (17, 1), (100, 1), (129, 1), (700, 1), (2500, 1), (5000, 1)]
PREFILL = [(40, 40), (7, 7), (300, 300), (129, 129), (2, 2)]
CHUNKED = [(90, 30), (64, 16), (130, 1), (20, 20), (47, 5), (2100, 64), (3000, 1)]
HEADS = [(32, 8), (16, 8), (9, 3), (32, 1), (4, 4)]


@pytest.mark.parametrize("kind,seqs", [("decode", DECODE), ("prefill", PREFILL),
                                       ("chunked", CHUNKED)], ids=["decode", "prefill", "chunked"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_attention(dt, D, heads, kind, seqs):
    check_attention(seqs, heads, D, dt, dt, seed=D + heads[0])


@pytest.mark.parametrize("max_query_len", [0, 1500], ids=["unknown", "known"])
@pytest.mark.parametrize("heads", [(32, 8), (16, 8), (12, 1)], ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_attention_long_prefill(dt, D, heads, max_query_len):
    """Prompts of many K/V tiles and row tiles, a chunk after a long context, beside decode
    rows: on Hopper the wgmma prefill kernel (64 rows, 128-key tiles double-buffered) and, told
    the longest query (>= 1024), the long prompts' warp-specialized one (128 rows, TMA)."""
    check_attention([(1500, 1500), (3000, 700), (260, 260), (900, 1)], heads, D, dt, dt,
                    seed=D + heads[0], q_scale=2.0, max_query_len=max_query_len)


@pytest.mark.parametrize("block_size", [16, 528, 128, 7])
@pytest.mark.parametrize("window,cap,sink", [(0, 0.0, False), (300, 0.0, False), (0, 5.0, False),
                                             (0, 0.0, True), (1, 30.0, True)],
                         ids=["plain", "window", "softcap", "sinks", "window1-softcap-sinks"])
def test_attention_long_prompt_kernel(window, cap, sink, block_size):
    """Hopper's long prompts' kernel (head size 128, the batch's longest query >= 1024) on what
    its producer and masks branch on: K/V tiles as TMA boxes of a block's rows (16: 8 boxes to
    a tile's 64 columns; 528: 16-row boxes; 128: one), rows by cp.async for the tile past a sequence's end;
    GQA groups (3) that do not divide its 128 rows; windows, soft cap, sinks. Blocks of 7 (no
    box) keep the other kernel."""
    D = 128
    nq = 12
    rng = np.random.default_rng(block_size)
    sinks = rng.normal(0, 2, nq).astype(np.float32) if sink else None
    check_attention([(2600, 1100), (1030, 1030), (300, 2), (400, 1)], (nq, 4), D, BF16, BF16,
                    window, cap, block_size=block_size, seed=block_size + window, q_scale=2.0,
                    sinks=sinks, max_query_len=1100)


@pytest.mark.parametrize("window,cap", [(8, 0.0), (1, 0.0), (33, 0.0), (1000, 0.0), (0, 5.0),
                                        (20, 30.0), (700, 50.0)])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_attention_window_softcap(D, window, cap):
    seqs = CHUNKED + DECODE[:5] + [(2600, 1)]
    check_attention(seqs, (16, 8), D, BF16, BF16, window, cap, seed=window, q_scale=3.0)


@pytest.mark.parametrize("long", [False, True], ids=["short", "long_prompts"])
@pytest.mark.parametrize("qdt,cdt", [(BF16, F16), (F16, BF16)],
                         ids=["q_bf16_c_f16", "q_f16_c_bf16"])
def test_attention_mixed_q_and_cache_dtypes(qdt, cdt, long):
    """q converted to the cache's dtype as it is staged; long_prompts: on Hopper the long
    prompts' kernel, whose Q then loads at each work item's start instead of ahead of it."""
    if long:
        check_attention([(2600, 1100), (1030, 1030), (400, 1)], (16, 8), 128, qdt, cdt, seed=6,
                        max_query_len=1100)
    else:
        check_attention(CHUNKED + DECODE, (16, 8), 128, qdt, cdt, seed=5)


@pytest.mark.parametrize("block_size", [1, 7, 32, 48, 256])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_attention_block_sizes(block_size, D):
    """Block sizes the paged rows' gather takes by a shift (32, 256) or a division (1, 7, 48),
    blocks shorter and longer than a K/V tile, a prompt of several tiles after a context."""
    check_attention(CHUNKED[:5] + DECODE[:5] + [(700, 300)], (8, 2), D, BF16, BF16,
                    block_size=block_size)


def test_attention_many_decode_rows():
    """A large decode batch: the plan picks few (or no) splits per sequence."""
    rng = np.random.default_rng(9)
    seqs = [(int(n), 1) for n in rng.integers(1, 1500, 96)]
    check_attention(seqs, (32, 8), 128, BF16, BF16, seed=9, cpu_oracle=False)


@pytest.fixture
def balanced_decode():
    """Every decode on the balanced kernel (the planner keeps the split one until the two are
    timed on a GPU); the planner's choice again afterwards."""
    _C.cuda_attention_tuning("balanced")
    try:
        yield
    finally:
        _C.cuda_attention_tuning()


BALANCED = [((32, 8), 128, BF16, 0, 0.0, False), ((16, 8), 64, F16, 0, 0.0, False),
            ((80, 4), 128, BF16, 0, 0.0, False), ((64, 4), 64, BF16, 0, 0.0, False),
            ((32, 8), 128, BF16, 256, 30.0, False), ((16, 8), 128, F16, 0, 0.0, True)]


@pytest.mark.parametrize("heads,D,dt,window,cap,sink", BALANCED,
                         ids=["32q8kv", "16q8kv-d64-f16", "80q4kv-two-groups", "64q4kv-d64",
                              "window-cap", "sinks"])
def test_attention_balanced_decode(balanced_decode, heads, D, dt, window, cap, sink):
    """The balanced decode kernel on batches of more CTAs than stay resident: the batch's K/V
    tiles cut into equal runs, one a CTA, so items are cut between CTAs and merged; lengths
    from one key to several runs' worth, beside prefilling sequences and one with no queries
    (items of no tiles), groups of 2 to 16 query heads (the epilogue's passes of two rows) and
    two head groups a kv head."""
    rng = np.random.default_rng(D + heads[0] + window)
    seqs = [(int(n), 1) for n in rng.integers(1, 900, 70)]
    seqs += [(1, 1), (64, 1), (65, 1), (4000, 1), (300, 40), (50, 0), (2, 2)]
    seqs = [seqs[i] for i in rng.permutation(len(seqs))]
    nq = heads[0]
    sinks = rng.normal(0, 2, nq).astype(np.float32) if sink else None
    check_attention(seqs, heads, D, dt, dt, window=window, cap=cap, seed=D + nq, q_scale=2.0,
                    cpu_oracle=False, sinks=sinks)
    check_attention([s for s in seqs if s[1] == 1], heads, D, dt, dt, window=window, cap=cap,
                    seed=D + nq + 1, cpu_oracle=False, sinks=sinks, max_query_len=1)


@pytest.mark.parametrize("kind,seqs", [("decode", DECODE), ("chunked", CHUNKED)],
                         ids=["decode", "chunked"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("D", [64, 128])
def test_attention_balanced_small_batches(balanced_decode, D, heads, kind, seqs):
    """Fewer tiles than CTAs (one CTA a tile: every item of more than one tile cut into parts,
    a long one into dozens) and mixed batches whose prefilling sequences add no tiles."""
    check_attention(seqs, heads, D, BF16, BF16, seed=D + heads[0] + 1)


def test_attention_balanced_one_long_among_short(balanced_decode):
    """A long context among short ones: its items span many CTAs' runs (a part in each), which
    the last of them to finish merges."""
    rng = np.random.default_rng(12)
    seqs = [(12000, 1)] + [(int(n), 1) for n in rng.integers(1, 300, 40)]
    check_attention(seqs, (16, 8), 128, BF16, BF16, seed=12, q_scale=2.0, cpu_oracle=False,
                    max_query_len=1)


def test_attention_tuning_refuses_unknown_kernels():
    with pytest.raises(ValueError):
        _C.cuda_attention_tuning("no-such-kernel")


@pytest.mark.parametrize("heads,ctx", [((32, 8), 5000), ((8, 1), 9000), ((32, 4), 1088)],
                         ids=["33-splits", "128-splits", "17-splits"])
def test_attention_one_long_decode(heads, ctx):
    """One sequence decoding alone: its keys split into up to kMaxSplits partitions, and the last
    CTA to finish merges them all (weights in rounds of 32 lanes, partials 12 at a time)."""
    check_attention([(ctx, 1)], heads, 128, BF16, BF16, seed=ctx, q_scale=2.0)


@pytest.mark.parametrize("D,dt", [(64, BF16), (128, F16), (256, BF16), (80, BF16)],
                         ids=["64", "128", "256", "generic"])
@pytest.mark.parametrize("window", [0, 128])
def test_attention_sinks(D, dt, window):
    """gpt-oss's sinks on every kernel: prefill (wgmma on Hopper, mma.sync), one long decode
    merged over partitions, many short ones, and the generic kernel (head size 80); sinks from
    far below the scores to far above them (the rows' weights then sum to almost nothing)."""
    rng = np.random.default_rng(D + window)
    nq = 16
    sinks = np.concatenate([rng.normal(0, 2, nq - 4), [-40.0, 3.0, 8.0, 60.0]]).astype(np.float32)
    seqs = [(1500, 1500), (300, 300), (3000, 64)] + DECODE[:5]
    check_attention(seqs, (nq, 2), D, dt, dt, window=window, seed=7, q_scale=2.0, sinks=sinks)
    check_attention([(5000, 1), (700, 1), (40, 1)], (nq, 2), D, dt, dt, window=window, seed=8,
                    sinks=sinks, max_query_len=1)


def check_mla(seqs, nq, dt, seed, q_scale=1.0, max_query_len=0):
    """Multi-head latent attention's shape (attention_mla.cu): one kv head of 576-wide rows and
    one cache passed as the keys and the values, as layers/mla.py passes it; against the f64
    reference."""
    D = 576
    q, kc, _, bt, qsl, sl = attention_case(seed, seqs, nq, 1, D, dt, dt, 16, q_scale)
    cache = (to_dev(kc, dt), dt)
    out = nan_out(q.shape, dt)
    scale = 1.0 / np.sqrt(192)  # DeepSeek's: (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
    _C.ops.paged_attention(out, to_dev(q, dt), cache, cache, to_dev(bt), to_dev(qsl), to_dev(sl),
                           scale, 0, 0.0, max_query_len, None)
    k64 = from_bits(kc, dt)
    want = attention_reference(from_bits(q, dt).reshape(len(q), nq, D), k64, k64, bt, qsl, sl,
                               scale)
    assert rel_err(from_bits(out.numpy(), dt), want.reshape(len(q), nq * D)) < TOL[dt]


MLA_SEQS = [(1, 1), (100, 1), (700, 1), (40, 40), (300, 300), (90, 30), (47, 5), (2100, 64),
            (10, 0), (129, 1)]


@pytest.mark.parametrize("nq", [16, 128, 20, 1])
@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_mla_attention(dt, nq):
    """Prefill, chunked and decode rows at DeepSeek's head counts (16: V2-Lite, 128: V3: eight
    CTAs a token) and others (a group of 4 heads after one of 16; one head)."""
    check_mla(MLA_SEQS, nq, dt, seed=nq)


@pytest.mark.parametrize("seqs", [[(5000, 1)], [(1088, 1)] * 8, [(9000, 1), (30, 1)]],
                         ids=["one", "eight", "long-and-short"])
def test_mla_attention_split_decode(seqs):
    """Few decode rows over long contexts: their keys in partitions (up to kMaxSplits), merged
    by the last CTA to finish."""
    check_mla(seqs, 16, BF16, seed=len(seqs), q_scale=2.0, max_query_len=1)


def test_mla_shape_with_two_caches_is_generic():
    """One kv head of 576-wide rows in separate key and value caches is not MLA's: the generic
    kernel takes it, as exact."""
    check_attention([(40, 40), (100, 1), (7, 3)], (16, 1), 576, BF16, BF16, cpu_oracle=False)


def test_attention_zero_query_sequences():
    check_attention([(10, 0), (50, 3), (20, 0), (30, 1), (5, 0)], (8, 2), 64, F16, F16)


@pytest.mark.parametrize("D", [80, 96, 32])
def test_attention_generic_head_sizes(D):
    """Head sizes without a tensor-core kernel take the generic kernel (slower, still exact);
    so does 256 on GPUs before Hopper (the tests above)."""
    check_attention(CHUNKED[:5] + DECODE[:5], (8, 2), D, BF16, BF16, window=0, cap=0.0)
    check_attention(CHUNKED[:5] + DECODE[:4], (9, 3), D, F16, F16, window=13, cap=4.0)


def test_attention_f32_cache_and_q():
    """f32 caches / activations take the generic kernel; f32 tolerance."""
    nq, nkv, D = 8, 2, 64
    case = attention_case(4, CHUNKED[:5] + DECODE[:5], nq, nkv, D, F16, F16)
    q, kc, vc, bt, qsl, sl = case
    q32 = from_bits(q, F16).astype(np.float32)
    k32, v32 = from_bits(kc, F16).astype(np.float32), from_bits(vc, F16).astype(np.float32)
    out = to_dev(np.full(q.shape, np.nan, np.float32))
    scale = 0.125
    _C.ops.paged_attention(out, to_dev(q32), (to_dev(k32), F32), (to_dev(v32), F32), to_dev(bt),
                           to_dev(qsl), to_dev(sl), scale, 0, 0.0)
    want = attention_reference(q32.astype(np.float64).reshape(len(q), nq, D),
                               k32.astype(np.float64), v32.astype(np.float64), bt, qsl, sl,
                               scale)
    assert rel_err(out.numpy(), want.reshape(len(q), nq * D)) < 1e-5


def test_attention_bad_args():
    q, kc, vc, bt, qsl, sl = attention_case(1, [(10, 2)], 4, 2, 64, BF16, BF16)
    args = [to_dev(kc, BF16), to_dev(vc, BF16), to_dev(bt), to_dev(qsl), to_dev(sl), 0.1]
    with pytest.raises(ValueError, match="paged_attention"):  # 3 heads of 64 vs 2 kv heads
        _C.ops.paged_attention(nan_out((2, 192), BF16), to_dev(q[:, :192], BF16), *args)
    with pytest.raises(ValueError, match="paged_attention"):  # out dtype != q dtype
        _C.ops.paged_attention(nan_out(q.shape, F16), to_dev(q, BF16), *args)
    with pytest.raises(ValueError, match="paged_attention"):  # query_start_loc length
        _C.ops.paged_attention(nan_out(q.shape, BF16), to_dev(q, BF16), args[0], args[1], args[2],
                               to_dev(np.array([0, 1, 2], np.int32)), args[4], 0.1)
