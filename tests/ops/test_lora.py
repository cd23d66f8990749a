"""add_lora_linear (LoRA's batched product, vLLM's punica add_lora_linear with its output
slices) against a float64 numpy reference on fresh random inputs: rows of several adapter
slots and of none (-1) in one call, one to three output slices, each slot as rows or in
linear's 16-row panels, in f32, f16 or bf16, the scalar twin; a row's result bit for bit the same alone, moved, or
beside other adapters; the contract's errors."""

import itertools

import numpy as np
import pytest

from vllmx import _C, ops
from vllmx.layers.placement import host_as
from vllmx.ops import Weight


def make(rng, slots, rank, k, sizes, t):
    """A [L, S r, K], B [L, N, r], x, y, each row's slot (-1: none), output_slices."""
    s, n = len(sizes), sum(sizes)
    a = (rng.standard_normal((slots, s * rank, k)) / np.sqrt(k)).astype(np.float32)
    b = (rng.standard_normal((slots, n, rank)) / np.sqrt(rank)).astype(np.float32)
    x = rng.standard_normal((t, k)).astype(np.float32)
    y = rng.standard_normal((t, n)).astype(np.float32)
    idx = rng.integers(-1, slots, t).astype(np.int32)
    return a, b, x, y, idx, np.cumsum([0, *sizes]).astype(np.int32)


def reference(y, x, a, b, idx, slices):
    out = y.astype(np.float64)
    r = b.shape[2]
    for t, s in enumerate(idx):
        if s < 0:
            continue
        for i in range(len(slices) - 1):
            o0, o1 = slices[i], slices[i + 1]
            h = a[s, i * r:(i + 1) * r].astype(np.float64) @ x[t]
            out[t, o0:o1] += b[s, o0:o1].astype(np.float64) @ h
    return out


def stored(m: np.ndarray, dtype: int) -> Weight:
    """f32 values as a dense weight of dtype (bf16 rounded to nearest even)."""
    return Weight(host_as(m, dtype), dtype, m.shape)


def rounded(m: np.ndarray, dtype: int) -> np.ndarray:
    """m as dtype holds it, back in f32."""
    return stored(m, dtype).to_float32().reshape(m.shape)


def panels(a: np.ndarray, b: np.ndarray, slices, dtype: int = ops.F32) -> tuple[Weight, Weight]:
    """The stacks as the LoRA layers keep them: each slot's A, and each slot's slices of B, in
    dtype and repack_weight's layout (16-row panels where this CPU has them)."""
    def pack(m):
        return ops.repack_weight(stored(m, dtype))

    pa = [pack(m) for m in a]
    pb = [[pack(m[o0:o1]) for o0, o1 in itertools.pairwise(slices)] for m in b]
    assert len({p.dtype for p in pa}) == 1 and len({p.dtype for s in pb for p in s}) == 1
    return (Weight(np.stack([p.data for p in pa]), pa[0].dtype, a.shape),
            Weight(np.stack([np.concatenate([p.data for p in s]) for s in pb]), pb[0][0].dtype,
                   b.shape))


SHAPES = [(1, 8, 64, (96,), 1), (4, 16, 576, (576, 192, 192), 32), (3, 16, 256, (64,), 77),
          (2, 4, 1536, (576,), 5), (4, 16, 576, (1536, 1536), 9)]


@pytest.mark.parametrize("dtype", [ops.F32, ops.F16, ops.BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "panels"])
@pytest.mark.parametrize("twin", [False, True], ids=["fast", "twin"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "L{}r{}K{}N{}T{}".format(*s))
def test_vs_float64(shape, twin, packed, dtype):
    """The stacks in f32, f16 or bf16 (lora_dtype), as rows or panels: the reference on the
    values they hold (upcast exactly), within f32 rounding."""
    rng = np.random.default_rng()
    a, b, x, y, idx, slices = make(rng, *shape)
    a, b = rounded(a, dtype), rounded(b, dtype)
    want = reference(y, x, a, b, idx, slices)
    got = y.copy()
    wa, wb = panels(a, b, slices, dtype) if packed else (stored(a, dtype), stored(b, dtype))
    if packed and shape[1] * len(shape[3]) >= 16:
        assert wa.dtype != dtype  # (this CPU has the panels)
    _C.ops.add_lora_linear(got, x, ops._arg(wa), ops._arg(wb), idx, slices, reference=twin)
    err = np.abs(got - want).max() / np.abs(want).max()
    # f32 sums over K (the shrink) and r: rounding grows like sqrt(K) (2.04e-6 seen at K = 1536,
    # over a flat 2e-6); a wrong slot, slice or layout is off by the size of the values.
    assert err < 4 * np.finfo(np.float32).eps * np.sqrt(shape[2]), err
    base = idx < 0
    assert np.array_equal(got[base], y[base])  # rows without an adapter untouched


def test_zero_padded_rank_is_the_rank():
    """An adapter of rank 4 in a slot of 16 (the rest zero) gives its rank-4 product."""
    rng = np.random.default_rng()
    a, b, x, y, _, slices = make(rng, 2, 16, 128, (64,), 9)
    a[1, 4:] = 0
    b[1, :, 4:] = 0
    idx = np.full(9, 1, np.int32)
    got = y.copy()
    ops.add_lora_linear(got, x, *panels(a, b, slices), idx, slices)
    want = y.astype(np.float64) + (x.astype(np.float64) @ a[1, :4].T.astype(np.float64)) @ \
        b[1, :, :4].T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "panels"])
def test_batch_invariance(packed):
    """A row's result is bit-identical alone, at another row of a bigger batch, and beside rows
    of other adapters or none (threaded sizes: K = 1024, 64 rows)."""
    rng = np.random.default_rng()
    a, b, x, y, idx, slices = make(rng, 4, 16, 1024, (1024, 512, 512), 64)
    if packed:
        a, b = panels(a, b, slices)
    full = y.copy()
    ops.add_lora_linear(full, x, a, b, idx, slices)
    for t in (0, 17, 63):
        alone = y[t:t + 1].copy()
        ops.add_lora_linear(alone, x[t:t + 1].copy(), a, b, idx[t:t + 1].copy(), slices)
        assert np.array_equal(alone[0].view(np.uint32), full[t].view(np.uint32)), t
    perm = rng.permutation(64)
    shuffled = y[perm].copy()
    ops.add_lora_linear(shuffled, x[perm], a, b, idx[perm], slices)
    assert np.array_equal(shuffled.view(np.uint32), full[perm].view(np.uint32))


def test_bad_arguments_name_the_problem():
    rng = np.random.default_rng()
    a, b, x, y, idx, slices = make(rng, 2, 8, 32, (8, 8), 4)
    bad = idx.copy()
    bad[2] = 2
    with pytest.raises(ValueError, match=r"add_lora_linear: lora_indices\[2\] = 2 is neither -1"):
        ops.add_lora_linear(y, x, a, b, bad, slices)
    with pytest.raises(ValueError, match=r"lora_a F32\[2, 16, 32\] must be \[L, S r, K\] = "
                                         r"\[L, 8, 32\]"):
        ops.add_lora_linear(y, x, a, b[:, :, :4].copy(), idx, slices)
    with pytest.raises(ValueError, match=r"must be \[L, S r, K\] = \[L, 16, 16\]"):
        ops.add_lora_linear(y, x[:, :16].copy(), a, b, idx, slices)
    with pytest.raises(ValueError, match=r"add_lora_linear: lora_indices must be I32"):
        ops.add_lora_linear(y, x, a, b, idx.astype(np.int64), slices)
    with pytest.raises(ValueError, match="must have x's rows"):
        ops.add_lora_linear(y[:3].copy(), x, a, b, idx, slices)
    with pytest.raises(ValueError, match="output_slices must rise from 0 to N = 16"):
        ops.add_lora_linear(y, x, a, b, idx, np.array([0, 10, 10], np.int32))
    with pytest.raises(ValueError, match=r"lora_b F32\[2, 12, 8\] must be \[L, N, r\]"):
        ops.add_lora_linear(y, x, a, b[:, :12].copy(), idx, slices)
