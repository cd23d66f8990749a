"""How far an f32 matrix product is from its f64 value, measured the way f32 summation errs."""

from __future__ import annotations

import numpy as np


def rounding_rel(got, x64, w64, b64=0) -> float:
    """|got - (x @ w^T + b)| relative to |x| @ |w|^T + |b|, norm-wise. Summation in f32 is
    off by a few ulps of the sum of the absolute terms, not of the result: one output whose
    terms cancel (n = 1 and a 256-long dot product is enough) can be 1e-5 off relative to
    itself while the kernel rounds exactly as it should."""
    want = x64 @ w64.T + b64
    scale = np.abs(x64) @ np.abs(w64).T + np.abs(b64)
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(scale))
