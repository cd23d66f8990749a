"""fp8 e4m3 with block scales (csrc/quant/fp8.cpp): per_token_group_quant_fp8's scales and codes
against torch's float8_e4m3fn conversion (round to nearest even) of the same divisions, ties,
saturation, all-zero groups and 16-bit inputs; scaled_mm (fast and the scalar reference) against
the float64 product of the dequantized operands, with and without bias, each output dtype;
fp8_linear as the two in a row; the contracts' refusals."""
import numpy as np
import pytest

from vllmx import ops
from vllmx.device import BF16, F16, F32
from vllmx.layers.placement import host_as

torch = pytest.importorskip("torch")


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    return host_as(x, BF16)


def torch_quant(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """torch's codes and scales for x [T, K] (f32 values): per 128-group, f32 division."""
    t, k = x.shape
    g = torch.tensor(x, dtype=torch.float32).view(t, k // 128, 128)
    s = g.abs().amax(-1).clamp(min=1e-10) / 448.0
    q = (g / s[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).reshape(t, k).numpy(), s.T.contiguous().numpy()


def dequant(q: np.ndarray, s: np.ndarray) -> np.ndarray:
    """codes [R, K] with scales [K / 128, R] as float64 values."""
    r, k = q.shape
    v = torch.tensor(q).view(torch.float8_e4m3fn).to(torch.float64).numpy()
    return (v.reshape(r, k // 128, 128) * s.T.astype(np.float64)[..., None]).reshape(r, k)


@pytest.mark.parametrize("shape", [(1, 128), (7, 384), (33, 1024)])
def test_quant_matches_torch(shape):
    rng = np.random.default_rng()
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 50, (shape[0], 1))).astype(np.float32)
    q, s = ops.per_token_group_quant_fp8(x)
    want_q, want_s = torch_quant(x)
    assert s.shape == (shape[1] // 128, shape[0])
    np.testing.assert_array_equal(s, want_s)
    np.testing.assert_array_equal(q, want_q)


def test_quant_ties_saturation_and_zero_groups():
    # A group whose largest value is 448 has scale 1: the others are coded as they are.
    # 1.0625 lies halfway between 1.0 (mantissa 000) and 1.125 (001): the even code, 1.0;
    # 1.1875 between 1.125 (001) and 1.25 (010): 1.25. 2^-10 is half the smallest subnormal
    # (2^-9): 0; 3 * 2^-10 halfway between 2^-9 (001) and 2^-8 (010): 2^-8.
    x = np.zeros((2, 256), np.float32)
    x[0, :6] = [448.0, 1.0625, -1.1875, 2.0 ** -10, 3 * 2.0 ** -10, -448.0]
    q, s = ops.per_token_group_quant_fp8(x)
    assert s[0, 0] == np.float32(1.0)
    vals = dequant(q[:1, :128], np.ones((1, 1), np.float32))[0, :6]
    np.testing.assert_array_equal(vals, [448.0, 1.0, -1.25, 0.0, 2.0 ** -8, -448.0])
    np.testing.assert_array_equal(q, torch_quant(x)[0])
    # All-zero groups: the smallest scale and zero codes, no division by zero.
    assert s[1, 0] == np.float32(np.float32(1e-10) / np.float32(448.0))
    assert not q[1].any()
    # A negative value below half the smallest subnormal keeps its sign: -0 (0x80), as the
    # GPU's conversion (and torch's) gives it.
    x[1, :2] = [448.0, -(2.0 ** -11)]
    q, _ = ops.per_token_group_quant_fp8(x)
    assert q[1, 1] == 0x80
    np.testing.assert_array_equal(q, torch_quant(x)[0])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_quant_16bit_inputs(dtype):
    rng = np.random.default_rng()
    x = (rng.standard_normal((5, 256)) * 7).astype(np.float32)
    if dtype == F16:
        host, vals = x.astype(np.float16), x.astype(np.float16).astype(np.float32)
    else:
        host = to_bf16_bits(x)
        vals = (host.astype(np.uint32) << 16).view(np.float32)
    q, s = ops.per_token_group_quant_fp8(host, dtype)
    want_q, want_s = torch_quant(vals)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(s, want_s)


@pytest.mark.parametrize("out_dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("reference", [False, True], ids=["fast", "ref"])
def test_scaled_mm_vs_float64(out_dtype, with_bias, reference):
    rng = np.random.default_rng()
    t, n, k = 6, 40, 384
    x = (rng.standard_normal((t, k)) * 3).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    a, a_s = ops.per_token_group_quant_fp8(x)
    b, b_s = ops.per_token_group_quant_fp8(w)
    want = dequant(a, a_s) @ dequant(b, b_s).T
    bias = None
    if with_bias:
        bias_f = rng.standard_normal(n).astype(np.float32)
        bias = {F32: bias_f, F16: bias_f.astype(np.float16), BF16: to_bf16_bits(bias_f)}[out_dtype]
        bias_v = {F32: bias_f, F16: bias_f.astype(np.float16).astype(np.float32),
                  BF16: (to_bf16_bits(bias_f).astype(np.uint32) << 16).view(np.float32)}
        want = want + bias_v[out_dtype]
    if reference:
        from vllmx import _C
        from vllmx.device import F8_E4M3, host_dtype
        out = np.empty((t, n), host_dtype(out_dtype))
        _C.ops.scaled_mm((out, out_dtype), (a, F8_E4M3), (b, F8_E4M3), a_s, b_s,
                         None if bias is None else (bias, out_dtype), reference=True)
    else:
        out = ops.scaled_mm(a, b, a_s, b_s, out_dtype, bias)
    got = {F32: lambda o: o, F16: lambda o: o.astype(np.float32),
           BF16: lambda o: (o.astype(np.uint32) << 16).view(np.float32)}[out_dtype](out)
    tol = {F32: 1e-5, F16: 2 ** -10, BF16: 2 ** -7}[out_dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_refusals():
    rng = np.random.default_rng()
    with pytest.raises(ValueError, match="whole groups of 128"):
        ops.per_token_group_quant_fp8(rng.standard_normal((2, 100)).astype(np.float32))
    a, a_s = ops.per_token_group_quant_fp8(rng.standard_normal((2, 256)).astype(np.float32))
    b, b_s = ops.per_token_group_quant_fp8(rng.standard_normal((3, 128)).astype(np.float32))
    with pytest.raises(ValueError, match="must share K"):
        ops.scaled_mm(a, b, a_s, b_s, F32)
    b, b_s = ops.per_token_group_quant_fp8(rng.standard_normal((3, 256)).astype(np.float32))
    with pytest.raises(ValueError, match="b_s"):
        ops.scaled_mm(a, b, a_s, a_s, F32)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
def test_fp8_linear_is_quant_then_scaled_mm(dtype, with_bias):
    """fp8_linear is per_token_group_quant_fp8 then scaled_mm, bit for bit, on x of each dtype
    (its output in x's dtype)."""
    rng = np.random.default_rng()
    x = (rng.standard_normal((6, 384)) * rng.uniform(0.1, 20, (6, 1))).astype(np.float32)
    hx = {F32: x, F16: x.astype(np.float16), BF16: to_bf16_bits(x)}[dtype]
    xd = None if dtype == F32 else dtype
    b, b_s = ops.per_token_group_quant_fp8(
        (rng.standard_normal((40, 384)) / 20).astype(np.float32))
    bias = None
    if with_bias:
        bf = rng.standard_normal(40).astype(np.float32)
        bias = {F32: bf, F16: bf.astype(np.float16), BF16: to_bf16_bits(bf)}[dtype]
    a, a_s = ops.per_token_group_quant_fp8(hx, xd)
    want = ops.scaled_mm(a, b, a_s, b_s, dtype, bias)
    got = ops.fp8_linear(hx, b, bias, w_s=b_s, x_dtype=xd)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_fp8_linear_refusals():
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 256)).astype(np.float32)
    b, b_s = ops.per_token_group_quant_fp8(rng.standard_normal((8, 128)).astype(np.float32))
    with pytest.raises(ValueError, match="fp8_linear: x .* and w .* must share K"):
        ops.fp8_linear(x, b, w_s=b_s)
    b, b_s = ops.per_token_group_quant_fp8(rng.standard_normal((8, 256)).astype(np.float32))
    with pytest.raises(ValueError, match=r"fp8_linear: w_s .* must be a contiguous \[K / 128, N\]"):
        ops.fp8_linear(x, b, w_s=np.ascontiguousarray(b_s[:1]))
    with pytest.raises(ValueError, match="fp8_linear: bias"):
        ops.fp8_linear(x, b, np.zeros(7, np.float32), w_s=b_s)
    with pytest.raises(ValueError, match="one or more whole groups of 128"):  # K = 0
        ops.fp8_linear(np.zeros((2, 0), np.float32), np.zeros((8, 0), np.uint8),
                       w_s=np.zeros((0, 8), np.float32))


def test_block_weight_rows_dequantize_to_code_times_scale():
    """ops.fp8_block_weight's F8_E4M3_B128 rows (an f32 scale and 128 codes a block) read back
    through the dequantization every block type has: code value times its row's group scale;
    merging rows (MergedLinear's concat) keeps each row's blocks."""
    from vllmx.layers.linear import concat_rows

    rng = np.random.default_rng()
    x = (rng.standard_normal((24, 384)) * 5).astype(np.float32)
    codes, s = ops.per_token_group_quant_fp8(x)  # per row and group: a weight's layout
    w = ops.fp8_block_weight(codes, s.T)
    want = dequant(codes, s)
    np.testing.assert_array_equal(w.to_float32().reshape(24, 384), want.astype(np.float32))
    both = concat_rows([w, ops.fp8_block_weight(codes[:8], np.ascontiguousarray(s.T[:8]))])
    np.testing.assert_array_equal(both.to_float32().reshape(32, 384)[24:],
                                  want[:8].astype(np.float32))


def fp8_experts(rng, e: int, n: int, k: int):
    """Random expert weights [e, n, k] as fused_experts' fp8 stacks: codes and scales
    [e, k / 128, n] (each row quantized per 128 values)."""
    w = (rng.standard_normal((e, n, k)) / np.sqrt(k)).astype(np.float32)
    codes = np.empty((e, n, k), np.uint8)
    scales = np.empty((e, k // 128, n), np.float32)
    for i in range(e):
        codes[i], scales[i] = ops.per_token_group_quant_fp8(w[i])
    return codes, scales


def fused_experts_fp8_reference(x, c13, s13, c2, s2, topk_weights, topk_ids):
    """float64 W8A8 experts: the dequantized weights against the rows each product reads,
    quantized per 128 values (x's, then silu(gate) * up's, quantized from f32 as the CPU
    kernel does)."""
    def qrow(v):
        q, s = ops.per_token_group_quant_fp8(np.asarray(v, np.float32)[None])
        return dequant(q, s)[0]

    inter = c2.shape[2]
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = topk_ids[t, j]
            h = dequant(c13[e], s13[e]) @ qrow(x[t])
            g, u = h[:inter].astype(np.float32), h[inter:].astype(np.float32)
            a = g / (1 + np.exp(-g.astype(np.float64))) * u
            out[t] += topk_weights[t, j] * (dequant(c2[e], s2[e]) @ qrow(a))
    return out


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_fused_experts_fp8_vs_float64(reference):
    """fp8 experts (vLLM's block-fp8 MoE, W8A8): fused_experts with codes and scales against
    the float64 product of the dequantized weights and the per-128 quantized rows."""
    from vllmx import _C

    rng = np.random.default_rng()
    t, h, inter, e, k = 9, 256, 128, 6, 2
    x = rng.standard_normal((t, h)).astype(np.float32)
    c13, s13 = fp8_experts(rng, e, 2 * inter, h)
    c2, s2 = fp8_experts(rng, e, h, inter)
    tw, ti = ops.topk_softmax(rng.standard_normal((t, e)).astype(np.float32), k, True)
    want = fused_experts_fp8_reference(x, c13, s13, c2, s2, tw, ti)
    if reference:  # the scalar twins, through the op table's reference flag
        from vllmx.device import F8_E4M3
        got = np.empty_like(x)
        _C.ops.fused_experts(got, x, (c13, F8_E4M3), (c2, F8_E4M3), tw, ti, None, None, 0, s13,
                             s2, reference=True)
    else:
        got = ops.fused_experts(x, c13, c2, tw, ti, w13_scale=s13, w2_scale=s2)
    # f32 sums of exact fp8 products; an activation at an e4m3 rounding boundary may round
    # the other way from the float64 one's f32 input: a few e4m3 steps of one value at most.
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-3 * np.abs(want).max())


def test_fused_experts_fp8_refusals():
    from vllmx.device import F8_E4M3

    rng = np.random.default_rng()
    x = rng.standard_normal((3, 128)).astype(np.float32)
    c13, s13 = fp8_experts(rng, 4, 256, 128)
    c2, s2 = fp8_experts(rng, 4, 128, 128)
    tw, ti = ops.topk_softmax(rng.standard_normal((3, 4)).astype(np.float32), 2, True)
    with pytest.raises(ValueError, match="come together"):
        ops.fused_experts(x, c13, c2, tw, ti, w13_scale=s13)
    with pytest.raises(ValueError, match=r"w13_scale .* must be \[4, 1, 256\]"):
        ops.fused_experts(x, c13, c2, tw, ti, w13_scale=np.ascontiguousarray(s13[:, :, :128]),
                          w2_scale=s2)
    x2 = rng.standard_normal((3, 64)).astype(np.float32)
    c2b, s2b = fp8_experts(rng, 4, 64, 128)
    with pytest.raises(ValueError, match="K whole 128s"):  # H = 64
        ops.fused_experts(x2, c13[:, :, :64].copy(), c2b, tw, ti, w13_scale=s13, w2_scale=s2b)
    with pytest.raises(ValueError, match="holds fp8 codes"):
        ops.fused_experts(x, (c13, F8_E4M3), (c2, F8_E4M3), tw, ti)
