"""CUDA linear on the CUTLASS sm_90a GEMM (cuda/gemm_*sm90.cu): bf16/f16 with T > 32 on compute
capability 9.0 (128-token tiles on 32 or 64 weight rows for decode batches of 65-256 tokens
where those fit one wave, else operands swapped up to T = 128; stream-K), against a float64
reference; and the shapes and pointers it must hand back to the older kernels (K or N not a
multiple of 8, misaligned data). On other GPUs the same cases run the mma.sync kernels and must
pass all the same. Skipped without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from tests.cuda.test_cuda_linear import (
    BF16,
    F16,
    TOL,
    _cuda_ok,
    cuda_linear,
    from_bits,
    make_dense,
    make_x,
    nan_out,
    rel_err,
    to_bits,
    to_dev,
)
from vllmx import _C
from vllmx.device import DeviceArray

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_ok(), reason="needs a CUDA GPU")]

# Per element: the output's own rounding (half an ulp is 2^-9 for bf16, 2^-11 for f16) with
# room to spare, plus a floor for outputs near zero, where f32 accumulation order shows.
ELEM_REL = {BF16: 2.0**-7, F16: 2.0**-9}


def check(got: np.ndarray, want: np.ndarray, dt: int) -> None:
    assert rel_err(got, want) < TOL[dt]
    bound = ELEM_REL[dt] * np.abs(want) + 1e-3 * np.abs(want).max()
    bad = np.argwhere(np.abs(got - want) > bound)
    assert bad.size == 0, (f"{len(bad)} elements off, first at (t, n) = {tuple(bad[0])}: "
                           f"got {got[tuple(bad[0])]}, want {want[tuple(bad[0])]}")


def bias_bits(rng, n: int, dt: int) -> np.ndarray:
    return to_bits(rng.standard_normal(n).astype(np.float32) * 0.1, dt)


# N = 1000 and K = 1032 are not multiples of the 128/256-wide tiles or the 64-deep K step.
# T = 33-64 take the swapped tiles; 100, 128 and 200 (one row of 128-token tiles, then two, the
# second partial) the narrow straight ones, on 32 weight rows, 64 for N = 8192 at T = 100 and 128
# and N = 4096 at 200, while N = 8192 at T = 200 fits neither in a wave (128x128 tiles); 512 and
# 1000 the ping-pong kernel; at T = 2100 (9 rows of 256-token tiles, the last one partial)
# (4096, 576) and (8192, 256) fill an H100's or H200's 132 SMs with 256x128 tiles, the other
# two stay on the ping-pong kernel.
NK_SIZES = [(1000, 4096), (4096, 576), (8192, 256), (136, 1032)]


@pytest.mark.parametrize("nk", NK_SIZES, ids=lambda s: f"N{s[0]}K{s[1]}")
@pytest.mark.parametrize("t", [33, 48, 64, 100, 128, 200, 512, 1000, 2100])
@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_linear_gemm(dt, t, nk):
    n, k = nk
    rng = np.random.default_rng([dt, t, n, k])
    w, w64 = make_dense(rng, n, k, dt)
    x, x64 = make_x(rng, t, k, dt)
    b = bias_bits(rng, n, dt)
    check(cuda_linear(x, dt, w, dt), x64 @ w64.T, dt)
    check(cuda_linear(x, dt, w, dt, b), x64 @ w64.T + from_bits(b, dt), dt)


@pytest.mark.parametrize("nk", [(1000, 4100), (1004, 4096), (77, 1536)],
                         ids=lambda s: f"N{s[0]}K{s[1]}")
@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
def test_linear_gemm_unaligned_shapes_fall_back(dt, nk):
    """K or N not a multiple of 8 (TMA's 16-byte rows): the older kernels take the product."""
    n, k = nk
    rng = np.random.default_rng([dt, n, k])
    w, w64 = make_dense(rng, n, k, dt)
    x, x64 = make_x(rng, 200, k, dt)
    b = bias_bits(rng, n, dt)
    check(cuda_linear(x, dt, w, dt, b), x64 @ w64.T + from_bits(b, dt), dt)


def at_offset(a: np.ndarray, dt: int, offset_bytes: int) -> DeviceArray:
    """A device copy of `a` that starts offset_bytes into its buffer (not 16-byte aligned)."""
    flat = np.zeros(a.size + 8, np.uint16)
    flat[offset_bytes // 2:offset_bytes // 2 + a.size] = a.ravel()
    buf = to_dev(flat, dt)
    return DeviceArray(buf.buffer, dt, a.shape, buf.offset + offset_bytes)


@pytest.mark.parametrize("which", ["x", "w", "out"])
def test_linear_gemm_misaligned_pointer_falls_back(which):
    """x, w or out 2 bytes past a 16-byte boundary: never handed to TMA, and still right."""
    t, n, k, dt = 128, 256, 512, BF16
    rng = np.random.default_rng(7)
    w, w64 = make_dense(rng, n, k, dt)
    x, x64 = make_x(rng, t, k, dt)
    b = bias_bits(rng, n, dt)
    xd = at_offset(x, dt, 2) if which == "x" else to_dev(x, dt)
    wd = at_offset(w, dt, 2) if which == "w" else to_dev(w, dt)
    out = (at_offset(np.full((t, n), 0x7FC0, np.uint16), dt, 2) if which == "out"
           else nan_out((t, n), dt))
    _C.ops.linear(out, xd, (wd, dt), to_dev(b, dt))
    check(from_bits(out.numpy(), dt), x64 @ w64.T + from_bits(b, dt), dt)


def test_linear_gemm_rows_of_a_larger_batch():
    """x and out as row slices of larger arrays (pointers offset by whole rows): same answer as
    the whole product's rows."""
    t, n, k, dt = 300, 512, 1024, BF16
    rng = np.random.default_rng(11)
    w, w64 = make_dense(rng, n, k, dt)
    x, x64 = make_x(rng, t, k, dt)
    out = nan_out((t, n), dt)
    _C.ops.linear(out[36:], to_dev(x, dt)[36:], (to_dev(w, dt), dt))
    check(from_bits(out.numpy()[36:], dt), x64[36:] @ w64.T, dt)


@pytest.mark.parametrize("t", [40, 128, 256])
def test_linear_gemm_stream_k(t):
    """A long K under a narrow output (Llama-3-8B's down_proj): too few tiles for the SMs, so
    stream-K splits the K loop; swapped at T = 40, straight at 256; at T = 128 one row of narrow
    tiles, a whole K loop each."""
    n, k, dt = 4096, 14336, BF16
    rng = np.random.default_rng([t, n, k])
    w, w64 = make_dense(rng, n, k, dt)
    x, x64 = make_x(rng, t, k, dt)
    b = bias_bits(rng, n, dt)
    check(cuda_linear(x, dt, w, dt, b), x64 @ w64.T + from_bits(b, dt), dt)


@pytest.mark.parametrize("t,n,k", [(1000, 8192, 256), (128, 4096, 14336), (48, 4096, 4096)])
def test_linear_gemm_repeat_is_deterministic(t, n, k):
    """Bit-identical results call after call, stream-K's split products included (its
    reduction takes the partial sums in a fixed order)."""
    dt = BF16
    rng = np.random.default_rng(5)
    w, _ = make_dense(rng, n, k, dt)
    x, _ = make_x(rng, t, k, dt)
    xd, wd = to_dev(x, dt), to_dev(w, dt)
    outs = []
    for _ in range(3):
        out = nan_out((t, n), dt)
        _C.ops.linear(out, xd, (wd, dt))
        outs.append(out.numpy())
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


# Every kernel cuda_linear_tuning can force, at a T each one takes, with the schedulers the
# benchmark sweeps (bench/gpu_kernels_vs_torch.py --plans): each must be right on its own, since
# the planner's thresholds are chosen from their timings.
TUNING_PLANS = [
    ({"path": "skinny"}, 24), ({"path": "skinny", "skinny_waves": 4}, 24),
    ({"path": "swap128x16"}, 9), ({"path": "swap128x32"}, 24), ({"path": "swap128x64"}, 40),
    ({"path": "swap128x128"}, 100), ({"path": "128x128"}, 200), ({"path": "128x256"}, 300),
    ({"path": "swap128x32", "decomposition": "data_parallel"}, 24),
    ({"path": "swap128x64", "decomposition": "split_k", "splits": 3}, 40),
    ({"path": "128x128", "decomposition": "stream_k"}, 200),
    # tiles in runs along either dimension, the grid rounded up past the product's edge
    ({"path": "128x256", "swizzle": 8, "raster": "along_n"}, 300),
    ({"path": "128x128", "swizzle": 4, "raster": "along_m"}, 200),
    ({"path": "swap128x64", "swizzle": 2}, 40),
    # the ping-pong kernel: a tile past T's edge, and tiles in runs
    ({"path": "pingpong128x128"}, 200), ({"path": "pingpong128x128", "swizzle": 4}, 520),
    ({"path": "256x128"}, 300), ({"path": "256x128", "decomposition": "data_parallel"}, 600),
    # the narrow weight tiles for decode batches: two token tiles, and a product of exactly
    # one token tile without the scheduler's split
    ({"path": "128x32"}, 200), ({"path": "128x64", "decomposition": "data_parallel"}, 128),
    ({"path": "128x32", "decomposition": "split_k", "splits": 2}, 77),
    ({"path": "gemm_small"}, 24), ({"path": "gemm_large"}, 200),
    # swapped tiles past their width (the benchmark's; the planner keeps them to T <= width):
    # four token tiles, the last partial, and three of the 16-token tile
    ({"path": "swap128x64"}, 200), ({"path": "swap128x16", "decomposition": "data_parallel"}, 40),
    # the 2x1-cluster tiles: two token tiles, the second partial; three, rounded up to a pair
    ({"path": "128x64c21"}, 200), ({"path": "128x32c21", "decomposition": "data_parallel"}, 136),
    ({"path": "128x128c21"}, 300),
    # and the prefill-sized ones': a pair of token tiles past T's edge, tiles in runs
    ({"path": "pingpong128x128c21"}, 520), ({"path": "256x128c21", "swizzle": 2}, 600),
]


@pytest.mark.parametrize("plan,t", TUNING_PLANS, ids=lambda v: str(v))
def test_linear_tuning_forced_kernels(plan, t):
    if not _C.cuda_sm90_kernels() and plan["path"].startswith(("swap", "128x", "256x", "pingpong")):
        pytest.skip("the CUTLASS tiles run on compute capability 9.0 only")
    rng = np.random.default_rng([t, len(plan)])
    w, w64 = make_dense(rng, 1536, 2048, BF16)
    x, x64 = make_x(rng, t, 2048, BF16)
    b = bias_bits(rng, 1536, BF16)
    _C.cuda_linear_tuning(**plan)
    try:
        got = cuda_linear(x, BF16, w, BF16, b)
    finally:
        _C.cuda_linear_tuning()
    check(got, x64 @ w64.T + from_bits(b, BF16), BF16)


def test_linear_tuning_refuses_what_a_kernel_cannot_take():
    rng = np.random.default_rng(5)
    w, _ = make_dense(rng, 256, 512, BF16)
    x, _ = make_x(rng, 40, 512, BF16)
    _C.cuda_linear_tuning(path="skinny")  # the skinny GEMM takes T <= 32
    try:
        with pytest.raises(ValueError, match="forced kernel"):
            cuda_linear(x, BF16, w, BF16)
    finally:
        _C.cuda_linear_tuning()
    with pytest.raises(ValueError):
        _C.cuda_linear_tuning(skinny_waves=-1)
    with pytest.raises(ValueError):
        _C.cuda_linear_tuning(path="no-such-kernel")
    with pytest.raises(ValueError, match="swizzle 16"):
        _C.cuda_linear_tuning(swizzle=16)
