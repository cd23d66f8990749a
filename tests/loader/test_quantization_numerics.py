"""The rounding the quantized-checkpoint loaders do by bit arithmetic equals numpy's f16 cast
and torch's bf16 cast, on values across every exponent range (subnormals and overflow too)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def test_round_to_f16_and_bf16_equal_the_casts():
    from vllmx.device import BF16, F16
    from vllmx.loader.quantization import round_to

    rng = np.random.default_rng()
    x = (rng.standard_normal(200_000) * np.exp(rng.uniform(-30, 14, 200_000))).astype(np.float32)
    x[:4] = [0.0, -0.0, 65504.0, 65520.0]  # f16's largest and the first that overflows it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy: overflow in the f16 cast
        want16 = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(round_to(x, F16), want16)
    want_bf16 = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(round_to(x, BF16), want_bf16)
