"""apply_token_bitmask (structured output's grammar mask) against a float64 numpy reference on
random logits and random packed masks: fast path and scalar twin, with and without row
indices, vocabularies a multiple of 32 and not; bad inputs name the op. Every SIMD level
against the twin: tests/ops/test_simd_families.py."""
import numpy as np
import pytest

from vllmx import _C


def random_bitmask(rng, rows: int, vocab: int) -> np.ndarray:
    """i32 [rows, ceil(V / 32)]: random bits, plus an all-allowed word and an all-banned word
    where there is room (the fast paths' special cases), and a row allowing one token."""
    words = (vocab + 31) // 32
    m = rng.integers(0, 2**32, (rows, words), dtype=np.uint64).astype(np.uint32)
    if words > 2:
        m[0, 1], m[0, 2] = 0xFFFFFFFF, 0
    if rows > 1:
        m[1] = 0
        m[1, words // 2] = 1 << 5
    return m.view(np.int32)


def reference(logits: np.ndarray, bitmask: np.ndarray, indices=None) -> np.ndarray:
    """Bit v % 32 of word v / 32 (lowest bit first) keeps token v; the rest -> -inf."""
    out = logits.astype(np.float64)
    vocab = logits.shape[1]
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    rows = range(len(bitmask)) if indices is None else indices
    for r, row in enumerate(rows):
        out[row, bits[r] == 0] = -np.inf
    return out


@pytest.mark.parametrize("ref", [False, True])
@pytest.mark.parametrize("vocab", [5, 32, 1000, 49152, 151_937])
def test_bitmask_matches_numpy(ref, vocab):
    rng = np.random.default_rng(vocab)
    batch = 6
    logits = (rng.standard_normal((batch, vocab)) * 4).astype(np.float32)
    bitmask = random_bitmask(rng, batch, vocab)
    got = logits.copy()
    _C.ops.apply_token_bitmask(got, bitmask, reference=ref)
    np.testing.assert_array_equal(got.astype(np.float64), reference(logits, bitmask))
    if vocab > 64:
        assert np.isfinite(got[1]).sum() == 1 and np.isfinite(got[1, 32 * ((vocab + 31) // 64) + 5])


@pytest.mark.parametrize("ref", [False, True])
def test_bitmask_rows_by_index(ref):
    """Only the rows named by indices are masked (a constrained request among free ones)."""
    rng = np.random.default_rng(7)
    batch, vocab = 9, 3001
    logits = rng.standard_normal((batch, vocab)).astype(np.float32)
    indices = np.array([7, 0, 4], np.int32)
    bitmask = random_bitmask(rng, len(indices), vocab)
    got = logits.copy()
    _C.ops.apply_token_bitmask(got, bitmask, indices, reference=ref)
    np.testing.assert_array_equal(got.astype(np.float64), reference(logits, bitmask, indices))
    free = [r for r in range(batch) if r not in indices]
    np.testing.assert_array_equal(got[free], logits[free])


def test_bitmask_empty_batch():
    _C.ops.apply_token_bitmask(np.zeros((0, 100), np.float32), np.zeros((0, 4), np.int32))
    logits = np.ones((3, 100), np.float32)
    _C.ops.apply_token_bitmask(logits, np.zeros((0, 4), np.int32), np.zeros(0, np.int32))
    assert (logits == 1).all()


def test_bitmask_bad_inputs():
    logits = np.zeros((2, 70), np.float32)

    def bad(*args, match="apply_token_bitmask"):
        with pytest.raises(ValueError, match=match):
            _C.ops.apply_token_bitmask(logits, *args)

    bad(np.zeros((2, 2), np.int32), match=r"ceil\(V / 32\) = 3")
    bad(np.zeros((1, 3), np.int32), match="one row per logits row")
    bad(np.zeros((2, 3), np.float32))
    bad(np.zeros((1, 3), np.int32), np.array([2], np.int32), match="not a distinct row")
    bad(np.zeros((2, 3), np.int32), np.array([1, 1], np.int32), match="not a distinct row")
    bad(np.zeros((2, 3), np.int32), np.array([1], np.int32), match="one entry per bitmask row")
    with pytest.raises(ValueError, match="apply_token_bitmask: logits"):  # a bf16 view
        _C.ops.apply_token_bitmask((np.zeros((2, 70), np.uint16), int(_C.DType.BF16)),
                                   np.zeros((2, 3), np.int32))
