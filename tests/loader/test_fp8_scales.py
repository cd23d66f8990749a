"""fp8 checkpoints' scales as the GPU's fp8 GEMM takes them (loader/fp8.py fp8_row_group_scales,
for vLLM's fp8 and compressed-tensors' schemes): each row's scale per 128-wide group of K for
schemes whose scale is constant over such groups — per tensor, per channel, groups and blocks
whole multiples of 128 wide (partial blocks at the edges) — equal to the format's own
per-element expansion sampled once a group; None for the others (groups or blocks narrower
than 128, K not whole groups)."""
import numpy as np
import pytest

from vllmx.loader import quantization as q
from vllmx.loader.fp8 import fp8_row_group_scales


@pytest.mark.parametrize("case", ["tensor", "channel", "group128", "group256", "block128",
                                  "block128x256", "block64"])
def test_row_group_scales(case):
    rng = np.random.default_rng()
    n, k = 200, 768
    scale, block = {
        "tensor": (rng.random(1), None),
        "channel": (rng.random((n, 1)), None),
        "group128": (rng.random((n, k // 128)), None),
        "group256": (rng.random((n, k // 256)), None),
        "block128": (rng.random((-(-n // 128), k // 128)), (128, 128)),
        "block128x256": (rng.random((-(-n // 128), k // 256)), (128, 256)),
        "block64": (rng.random((-(-n // 64), k // 64)), (64, 64)),
    }[case]
    scale = scale.astype(np.float32)
    got = fp8_row_group_scales(scale, n, k, block)
    if case == "block64":  # 64 columns a scale: not constant over a 128-wide group
        assert got is None
        return
    assert got.shape == (n, k // 128) and got.dtype == np.float32
    np.testing.assert_array_equal(got, q.expand(scale, n, k, block)[:, ::128])


def test_narrow_groups_and_partial_k_are_left_dense():
    rng = np.random.default_rng()
    assert fp8_row_group_scales(rng.random((64, 768 // 64)).astype(np.float32), 64, 768,
                                None) is None
    assert fp8_row_group_scales(rng.random((64, 1)).astype(np.float32), 64, 200, None) is None
