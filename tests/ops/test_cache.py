"""write_kv_cache: bit-exact conversion into the paged flash-layout caches."""
import numpy as np
import pytest

from vllmx import _C

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered")

F16, BF16 = int(_C.DType.F16), int(_C.DType.BF16)


def bf16_rne(x):
    """float32 -> bf16 bits (uint16), round to nearest even, NaN kept NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r[nan] = ((u[nan] >> 16) | 64).astype(np.uint16)
    return r


def make_inputs(rng, T, nkv, D):
    k = (rng.standard_normal((T, nkv * D)) * 3).astype(np.float32)
    v = (rng.standard_normal((T, nkv * D)) * 3).astype(np.float32)
    # Exercise tricky values: ties for rounding, tiny (subnormal f16), huge, inf.
    k.flat[:8] = np.array([1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 6.0e-8, -3.0e-5, 70000.0,
                           -np.inf, 1.0 + 2.0**-8, 2.0**-14 * 1.5], dtype=np.float32)[:min(8, k.size)]
    return k, v


def run_case(dtype_name, reference, T=37, nkv=3, D=80, num_blocks=9, block_size=16, seed=0):
    rng = np.random.default_rng(seed)
    k, v = make_inputs(rng, T, nkv, D)
    shape = (num_blocks, block_size, nkv, D)
    if dtype_name == "f32":
        kc = rng.standard_normal(shape).astype(np.float32)
        vc = rng.standard_normal(shape).astype(np.float32)
        cd = -1
    else:
        kc = rng.integers(0, 1 << 15, size=shape, dtype=np.uint16)
        vc = rng.integers(0, 1 << 15, size=shape, dtype=np.uint16)
        cd = F16 if dtype_name == "f16" else BF16
    slots = rng.permutation(num_blocks * block_size)[:T].astype(np.int32)
    slots[::5] = -1  # padding tokens: skipped
    kc0, vc0 = kc.copy(), vc.copy()
    _C.ops.write_kv_cache(k, v, (kc, cd), (vc, cd), slots, reference=reference)

    if dtype_name == "f32":
        ek, ev = k, v
    elif dtype_name == "f16":
        ek, ev = k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16)
    else:
        ek, ev = bf16_rne(k), bf16_rne(v)
    exp_k, exp_v = kc0.reshape(-1, nkv * D).copy(), vc0.reshape(-1, nkv * D).copy()
    valid = slots >= 0
    exp_k[slots[valid]] = ek[valid]
    exp_v[slots[valid]] = ev[valid]
    np.testing.assert_array_equal(kc.reshape(-1, nkv * D).view(np.uint32 if dtype_name == "f32" else np.uint16),
                                  exp_k.view(np.uint32 if dtype_name == "f32" else np.uint16))
    np.testing.assert_array_equal(vc.reshape(-1, nkv * D).view(np.uint32 if dtype_name == "f32" else np.uint16),
                                  exp_v.view(np.uint32 if dtype_name == "f32" else np.uint16))


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("dtype_name", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("D", [64, 80, 128, 37])
def test_write_kv_cache(dtype_name, reference, D):
    run_case(dtype_name, reference, D=D, seed=D)


def test_write_kv_cache_numpy_f16_cache():
    """A numpy float16 cache works without an explicit cache_dtype."""
    rng = np.random.default_rng(1)
    k, v = make_inputs(rng, 5, 2, 64)
    kc = np.zeros((2, 4, 2, 64), np.float16) + np.float16(7)
    vc = np.zeros_like(kc) + np.float16(7)
    slots = np.array([0, 3, -1, 7, 5], np.int32)
    _C.ops.write_kv_cache(k, v, kc, vc, slots)
    flat = kc.reshape(-1, 128)
    np.testing.assert_array_equal(flat[[0, 3, 7, 5]].view(np.uint16),
                                  k[[0, 1, 3, 4]].astype(np.float16).view(np.uint16))
    assert np.all(flat[[1, 2, 4, 6]] == 7)


def test_all_f16_bit_patterns_roundtrip_conversion():
    """Every f32 that sits between two f16 values converts like numpy (fast == scalar)."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 1 << 32, size=64 * 1024, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.where(np.isnan(x), np.float32(1.0), x).astype(np.float32)
    T, D = 1024, 64
    k = x.reshape(T, D)
    for cd, expect in ((F16, k.astype(np.float16).view(np.uint16)), (BF16, bf16_rne(k))):
        for reference in (False, True):
            kc = np.zeros((T // 16, 16, 1, D), np.uint16)
            vc = np.zeros_like(kc)
            _C.ops.write_kv_cache(k, k, (kc, cd), (vc, cd), np.arange(T, dtype=np.int32),
                                  reference=reference)
            np.testing.assert_array_equal(kc.reshape(T, D), expect)


def test_bad_inputs():
    k = np.ones((4, 128), np.float32)
    kc = np.zeros((2, 16, 2, 64), np.float16)
    vc = np.zeros_like(kc)
    ok = np.array([0, 1, 2, -1], np.int32)
    _C.ops.write_kv_cache(k, k, kc, vc, ok)
    with pytest.raises(ValueError, match="write_kv_cache"):
        _C.ops.write_kv_cache(k, k, kc, vc, np.array([0, 1, 2, 32], np.int32))
    with pytest.raises(ValueError, match="write_kv_cache"):
        _C.ops.write_kv_cache(k, k, kc, vc, ok[:3])
    with pytest.raises(ValueError, match="write_kv_cache"):
        _C.ops.write_kv_cache(np.ones((4, 96), np.float32), k, kc, vc, ok)
    with pytest.raises(ValueError, match="write_kv_cache"):
        _C.ops.write_kv_cache(k, k, kc, np.zeros((2, 16, 2, 64), np.float32), ok)
    with pytest.raises(ValueError, match="write_kv_cache"):
        _C.ops.write_kv_cache(k, k, kc, vc, ok.astype(np.int64))
    with pytest.raises(ValueError, match="write_kv_cache"):
        _C.ops.write_kv_cache(k, k, kc.reshape(32, 2, 64), vc.reshape(32, 2, 64), ok)
    with pytest.raises(ValueError, match="write_kv_cache"):
        _C.ops.write_kv_cache(k, k, np.zeros((2, 16, 2, 64), np.int32),
                              np.zeros((2, 16, 2, 64), np.int32), ok)
