"""CUDA ops against the CPU ops on the same random inputs (f32 / f16 / bf16 activations; the CPU
op runs in f32 on the exactly upcast inputs); the allocator, DeviceArray views and the ops that
only move data are in test_cuda_arrays.py.
Tolerances per TESTING.md: f32 < 1e-5 relative, f16/bf16 < 1e-2; dequantization and cache
writes bit-exact; the sampler token for token."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from vllmx import _C, ops
from vllmx.device import BF16, F16, F32, DeviceArray

pytestmark = pytest.mark.gpu

Q4_0, Q4_1, Q8_0 = (int(_C.DType[n]) for n in ("Q4_0", "Q4_1", "Q8_0"))
Q4_K, Q5_K, Q6_K = (int(_C.DType[n]) for n in ("Q4_K", "Q5_K", "Q6_K"))
IQ4_NL, IQ4_XS = int(GGMLQuantizationType.IQ4_NL), int(GGMLQuantizationType.IQ4_XS)  # (gguf's ids)
ACT = [F32, F16, BF16]
TOL = {F32: 1e-5, F16: 1e-2, BF16: 1e-2}


# ---- host conversions ----
def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def host(x: np.ndarray, dtype: int) -> np.ndarray:
    """f32 values in dtype's host storage (rounded to nearest even)."""
    if dtype == F32:
        return np.ascontiguousarray(x, np.float32)
    if dtype == F16:
        return np.ascontiguousarray(x, np.float16)
    return to_bf16_bits(x)


def as_f32(a: np.ndarray, dtype: int) -> np.ndarray:
    return from_bf16_bits(a) if dtype == BF16 else a.astype(np.float32)


def dev(x: np.ndarray, dtype: int) -> DeviceArray:
    return DeviceArray.from_numpy(host(x, dtype), dtype)


def rounded(x: np.ndarray, dtype: int) -> np.ndarray:
    """x as the dtype holds it, back in f32."""
    return as_f32(host(x, dtype), dtype)


def assert_close(got: np.ndarray, ref: np.ndarray, dtype: int, what: str = ""):
    got = got.astype(np.float64)
    ref = ref.astype(np.float64)
    scale = max(np.abs(ref).max(), 1e-30)
    err = np.abs(got - ref).max() / scale
    assert err < TOL[dtype], f"{what}: max error {err:.3g} (relative to max |ref|) >= {TOL[dtype]}"


# ---- embedding ----
def random_blocks(rng, rows, n, dtype):
    nb = n // 32
    if dtype == Q8_0:
        blk = np.zeros((rows, nb, 34), np.uint8)
        blk[..., 0:2] = rng.uniform(0.001, 0.05, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blk[..., 2:] = rng.integers(0, 256, (rows, nb, 32), dtype=np.uint8)
    elif dtype == Q4_0:
        blk = np.zeros((rows, nb, 18), np.uint8)
        blk[..., 0:2] = rng.uniform(0.001, 0.05, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blk[..., 2:] = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    else:
        blk = np.zeros((rows, nb, 20), np.uint8)
        blk[..., 0:2] = rng.uniform(0.001, 0.05, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blk[..., 2:4] = rng.uniform(-0.5, 0.5, (rows, nb)).astype(np.float16)[..., None].view(np.uint8)
        blk[..., 4:] = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    return blk.reshape(rows, -1)


@pytest.mark.parametrize("out_dtype", ACT)
@pytest.mark.parametrize("table_dtype", [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K,
                                         IQ4_NL, IQ4_XS])
def test_embedding(rng, table_dtype, out_dtype):
    vocab, hidden, T = 300, 256, 37
    if table_dtype in (Q8_0, Q4_0, Q4_1):
        table = random_blocks(rng, vocab, hidden, table_dtype)
    elif table_dtype in (IQ4_NL, IQ4_XS):  # random codes and scales, a small f16 d
        values, nbytes = (32, 18) if table_dtype == IQ4_NL else (256, 136)
        blk = rng.integers(0, 256, (vocab, hidden // values, nbytes), dtype=np.uint8)
        d = rng.uniform(0.001, 0.05, (vocab, hidden // values)).astype(np.float16)
        blk[..., 0:2] = d[..., None].view(np.uint8)
        table = blk.reshape(vocab, -1)
    elif table_dtype in (Q4_K, Q5_K, Q6_K):  # (the reference quantizer of real-valued rows)
        table = ops.quantize_weight(rng.standard_normal((vocab, hidden)).astype(np.float32),
                                    table_dtype)
    else:
        table = host(rng.standard_normal((vocab, hidden)).astype(np.float32), table_dtype)
    ids = rng.integers(0, vocab, T).astype(np.int32)
    ref = np.empty((T, hidden), np.float32)
    _C.ops.embedding(ref, ids, (table, table_dtype))
    out = DeviceArray.empty((T, hidden), out_dtype)
    _C.ops.embedding(out, DeviceArray.from_numpy(ids), DeviceArray.from_numpy(table, table_dtype))
    got = as_f32(out.numpy(), out_dtype)
    if out_dtype == F32:
        np.testing.assert_array_equal(got, ref)  # dequantization is bit-exact
    else:
        np.testing.assert_array_equal(got, rounded(ref, out_dtype))


def test_embedding_out_of_range_ids_give_zero_rows(rng):
    table = rng.standard_normal((10, 64)).astype(np.float32)
    out = DeviceArray.empty((3, 64), F32)
    _C.ops.embedding(out, DeviceArray.from_numpy(np.array([1, -1, 10], np.int32)),
                     DeviceArray.from_numpy(table))
    got = out.numpy()
    np.testing.assert_array_equal(got[0], table[1])
    assert not got[1:].any()


# ---- norms ----
@pytest.mark.parametrize("w_act", [False, True])
@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("T,H", [(1, 64), (7, 1000), (33, 4096)])
def test_rms_norm(rng, dtype, w_act, T, H):
    x = rounded(rng.standard_normal((T, H)).astype(np.float32) * 3, dtype)
    w_dtype = dtype if w_act else F32
    w = rounded(rng.uniform(0.5, 1.5, H).astype(np.float32), w_dtype)
    ref = np.empty_like(x)
    _C.ops.rms_norm(ref, x, w, 1e-6)
    out = DeviceArray.empty(x.shape, dtype)
    _C.ops.rms_norm(out, dev(x, dtype), dev(w, w_dtype), 1e-6)
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "rms_norm")


@pytest.mark.parametrize("dtype", ACT)
# 16-byte vectors where H allows them (2 chunks a thread, 4 past 2048 chunks: 20480), the
# scalar kernel where it does not (1001; f32's 20480 is 5120 chunks).
@pytest.mark.parametrize("T,H", [(1, 64), (9, 2048), (5, 1001), (3, 20480)])
def test_fused_add_rms_norm(rng, dtype, T, H):
    x = rounded(rng.standard_normal((T, H)).astype(np.float32), dtype)
    res = rounded(rng.standard_normal((T, H)).astype(np.float32), dtype)
    w = rng.uniform(0.5, 1.5, H).astype(np.float32)
    ref_x, ref_r = x.copy(), res.copy()
    _C.ops.fused_add_rms_norm(ref_x, ref_r, w, 1e-5)
    dx, dr = dev(x, dtype), dev(res, dtype)
    _C.ops.fused_add_rms_norm(dx, dr, dev(w, F32), 1e-5)
    # The residual is the rounded sum, exactly.
    np.testing.assert_array_equal(as_f32(dr.numpy(), dtype), rounded(ref_r, dtype))
    assert_close(as_f32(dx.numpy(), dtype), ref_x, dtype, "fused_add_rms_norm x")


@pytest.mark.parametrize("w_act", [False, True])
@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("T,w_shape,with_bias", [(1, (64,), True), (7, (1000,), True),
                                                 (33, (4096,), False),
                                                 (5, (32,), True),  # [T, 6 * 32]: shared
                                                 (9, (6, 64), False),  # a weight per head
                                                 (3, (4, 80), True)])
def test_layer_norm(rng, dtype, w_act, T, w_shape, with_bias):
    H = 6 * 32 if w_shape == (32,) else int(np.prod(w_shape))
    x = rounded(rng.standard_normal((T, H)).astype(np.float32) * 3 + 1, dtype)
    w_dtype = dtype if w_act else F32
    w = rounded(rng.uniform(0.5, 1.5, w_shape).astype(np.float32), w_dtype)
    b = rounded(rng.standard_normal(w_shape).astype(np.float32), w_dtype) if with_bias else None
    ref = np.empty_like(x)
    _C.ops.layer_norm(ref, x, w, b, 1e-5)
    out = DeviceArray.empty(x.shape, dtype)
    _C.ops.layer_norm(out, dev(x, dtype), dev(w, w_dtype),
                      None if b is None else dev(b, w_dtype), 1e-5)
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "layer_norm")


@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("T,H,with_bias", [(1, 64, True), (9, 2048, True), (4, 576, False)])
def test_fused_add_layer_norm(rng, dtype, T, H, with_bias):
    x = rounded(rng.standard_normal((T, H)).astype(np.float32), dtype)
    res = rounded(rng.standard_normal((T, H)).astype(np.float32), dtype)
    w = rng.uniform(0.5, 1.5, H).astype(np.float32)
    b = rng.standard_normal(H).astype(np.float32) if with_bias else None
    ref_x, ref_r = x.copy(), res.copy()
    _C.ops.fused_add_layer_norm(ref_x, ref_r, w, b, 1e-5)
    dx, dr = dev(x, dtype), dev(res, dtype)
    _C.ops.fused_add_layer_norm(dx, dr, dev(w, F32), None if b is None else dev(b, F32), 1e-5)
    # The residual is the rounded sum, exactly, and the norm is that of the rounded sum.
    np.testing.assert_array_equal(as_f32(dr.numpy(), dtype), rounded(ref_r, dtype))
    ref_norm = np.empty_like(ref_x)
    _C.ops.layer_norm(ref_norm, rounded(ref_r, dtype), w, b, 1e-5)
    assert_close(as_f32(dx.numpy(), dtype), ref_norm, dtype, "fused_add_layer_norm x")


# ---- rotary ----
def cos_sin_cache(max_pos, rot_dim, base=10000.0):
    inv = 1.0 / base ** (np.arange(0, rot_dim, 2) / rot_dim)
    f = np.outer(np.arange(max_pos), inv)
    return np.concatenate([np.cos(f), np.sin(f)], axis=1).astype(np.float32)


@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot_dim", [64, 32])
@pytest.mark.parametrize("with_k", [True, False])
def test_rotary(rng, dtype, is_neox, rot_dim, with_k):
    T, D, nq, nk, max_pos = 19, 64, 4, 2, 128
    cache = cos_sin_cache(max_pos, rot_dim)
    pos = rng.integers(0, max_pos, T).astype(np.int32)
    q = rounded(rng.standard_normal((T, nq * D)).astype(np.float32), dtype)
    k = rounded(rng.standard_normal((T, nk * D)).astype(np.float32), dtype)
    rq, rk = q.copy(), k.copy()
    _C.ops.rotary(pos, rq, rk if with_k else None, cache, D, is_neox)
    dq, dk = dev(q, dtype), dev(k, dtype)
    _C.ops.rotary(DeviceArray.from_numpy(pos), dq, dk if with_k else None,
                  DeviceArray.from_numpy(cache), D, is_neox)
    if dtype == F32:
        np.testing.assert_array_equal(dq.numpy(), rq)  # same roundings as the CPU
    assert_close(as_f32(dq.numpy(), dtype), rq, dtype, "rotary q")
    assert_close(as_f32(dk.numpy(), dtype), rk if with_k else k, dtype, "rotary k")


# ---- batched_linear (MLA's per-head projections) ----
@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("T,G,N,K", [(1, 16, 512, 128), (7, 4, 24, 32), (256, 16, 128, 512),
                                     (33, 128, 512, 128), (17, 5, 200, 72), (300, 3, 128, 512)])
def test_batched_linear_vs_float64(rng, dtype, T, G, N, K):
    """f16 / bf16 up to 256 rows in one launch (gemm_batched.cu: rows, columns and K past its
    16 x 128 x 64 tiles included), more rows and f32 group by group through linear (group g's
    rows strided by G K in x, G N in out); against float64 on the same rounded inputs."""
    x = rounded(rng.standard_normal((T, G, K)).astype(np.float32), dtype)
    w = rounded(rng.standard_normal((G, N, K)).astype(np.float32) / np.sqrt(K), dtype)
    ref = np.einsum("tgk,gnk->tgn", x.astype(np.float64), w.astype(np.float64))
    out = DeviceArray.empty((T, G, N), dtype)
    _C.ops.batched_linear(out, dev(x, dtype), DeviceArray.from_numpy(host(w, dtype), dtype))
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "batched_linear")


# ---- gated activations ----
@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("d", [1000, 1003])  # 16-byte vectors / the scalar kernel
def test_act_and_mul(rng, dtype, act, d):
    T = 13
    x = rounded(rng.standard_normal((T, 2 * d)).astype(np.float32) * 2, dtype)
    ref = np.empty((T, d), np.float32)
    out = DeviceArray.empty((T, d), dtype)
    if act == "silu":
        _C.ops.silu_and_mul(ref, x)
        _C.ops.silu_and_mul(out, dev(x, dtype))
    else:
        _C.ops.gelu_and_mul(ref, x, act == "gelu_tanh")
        _C.ops.gelu_and_mul(out, dev(x, dtype), act == "gelu_tanh")
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, act)


@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("d", [1000, 1003])
def test_swigluoai_and_mul_and_relu2(rng, dtype, d):
    """gpt-oss's clamped SwiGLU (values past the clamp on both sides) and squared ReLU against
    the CPU ops on the same rounded inputs."""
    T = 13
    x = rounded(rng.standard_normal((T, 2 * d)).astype(np.float32) * 6, dtype)
    ref = np.empty((T, d), np.float32)
    _C.ops.swigluoai_and_mul(ref, x, 1.702, 7.0)
    out = DeviceArray.empty((T, d), dtype)
    _C.ops.swigluoai_and_mul(out, dev(x, dtype), 1.702, 7.0)
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "swigluoai_and_mul")
    ref2 = np.empty_like(x)
    _C.ops.relu2(ref2, x)
    out2 = DeviceArray.empty(x.shape, dtype)
    _C.ops.relu2(out2, dev(x, dtype))
    assert_close(as_f32(out2.numpy(), dtype), ref2, dtype, "relu2")


@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("approximate_tanh", [False, True])
def test_gelu(rng, dtype, approximate_tanh):
    x = rounded(rng.standard_normal((13, 1000)).astype(np.float32) * 2, dtype)
    ref = np.empty_like(x)
    _C.ops.gelu(ref, x, approximate_tanh)
    out = DeviceArray.empty(x.shape, dtype)
    _C.ops.gelu(out, dev(x, dtype), approximate_tanh)
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "gelu")


@pytest.mark.parametrize("dtype", ACT)
def test_scale_in_place(rng, dtype):
    x = rounded(rng.standard_normal((7, 1500)).astype(np.float32), dtype)
    ref = np.empty_like(x)
    _C.ops.scale(ref, x, 0.37)
    out = dev(x, dtype)
    _C.ops.scale(out, out, 0.37)
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "scale")


@pytest.mark.parametrize("dtype", ACT)
def test_softcap(rng, dtype):
    x = rounded(rng.standard_normal((9, 3000)).astype(np.float32) * 40, dtype)
    ref = x.copy()
    _C.ops.softcap(ref, 30.0)
    out = dev(x, dtype)
    _C.ops.softcap(out, 30.0)
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "softcap")


@pytest.mark.parametrize("dtype", ACT)
@pytest.mark.parametrize("per_row", [False, True], ids=["elementwise", "per_row"])
@pytest.mark.parametrize("d", [1024, 1003])  # 16-byte vectors / the scalar kernel
def test_sigmoid_gate(rng, dtype, per_row, d):
    """x *= sigmoid(gate) in place against the CPU op on the same rounded inputs: a gate per
    value or one per row (gated attention's output, a gated shared expert)."""
    T = 9
    x = rounded(rng.standard_normal((T, d)).astype(np.float32) * 3, dtype)
    gate = rounded(rng.standard_normal((T, 1 if per_row else d)).astype(np.float32) * 3, dtype)
    ref = x.copy()
    _C.ops.sigmoid_gate(ref, gate)
    out = dev(x, dtype)
    _C.ops.sigmoid_gate(out, dev(gate, dtype))
    assert_close(as_f32(out.numpy(), dtype), ref, dtype, "sigmoid_gate")


@pytest.mark.parametrize("dtype", ACT)
def test_fill_uniform_matches_the_cpu(rng, dtype):
    seed = int(rng.integers(0, 2**63))
    shape = (333, 1001)
    host_out = np.empty(shape, np.float32 if dtype == F32 else np.uint16)
    _C.ops.fill_uniform(host_out if dtype == F32 else (host_out, dtype), seed, -0.5, 0.25)
    out = DeviceArray.empty(shape, dtype)
    _C.ops.fill_uniform(out, seed, -0.5, 0.25)
    got = out.numpy()  # (f16 comes back as float16, bf16 as its bits)
    assert np.array_equal(got.view(np.uint16) if got.dtype == np.float16 else got, host_out)


# ---- KV cache ----
@pytest.mark.parametrize("cache_dtype", ACT)
@pytest.mark.parametrize("dtype", ACT)
def test_write_kv_cache(rng, dtype, cache_dtype):
    num_blocks, block_size, nkv, D, T = 6, 16, 2, 64, 21
    key = rounded(rng.standard_normal((T, nkv * D)).astype(np.float32), dtype)
    value = rounded(rng.standard_normal((T, nkv * D)).astype(np.float32), dtype)
    slots = rng.permutation(num_blocks * block_size)[:T].astype(np.int32)
    slots[3] = -1  # padding: skipped
    shape = (num_blocks, block_size, nkv, D)
    init = host(rng.standard_normal(shape).astype(np.float32), cache_dtype)
    kc, vc = init.copy(), init.copy()
    _C.ops.write_kv_cache(key, value, (kc, cache_dtype), (vc, cache_dtype), slots)
    dkc = DeviceArray.from_numpy(init, cache_dtype)
    dvc = DeviceArray.from_numpy(init, cache_dtype)
    _C.ops.write_kv_cache(dev(key, dtype), dev(value, dtype), dkc, dvc,
                          DeviceArray.from_numpy(slots))
    np.testing.assert_array_equal(dkc.numpy(), kc)
    np.testing.assert_array_equal(dvc.numpy(), vc)
