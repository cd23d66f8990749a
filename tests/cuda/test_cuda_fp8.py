"""fp8 e4m3 on the GPU (cuda/fp8.cu, cuda/gemm_fp8_sm90.cu; Hopper): per_token_group_quant_fp8's
codes and scales bit for bit those of the CPU twin, from f32 / f16 / bf16 rows; scaled_mm against
the float64 product of the dequantized operands for token counts that take each tile (16- and
64-token swapped, 128 x 128 straight), with and without bias, bf16 and f16 out; batch
invariance of a row's result across the batch sizes of one tile; fp8_linear (up to 32 rows on
the skinny TMA GEMM) against float64 and the CPU twin, batch invariant."""
import os

import numpy as np
import pytest

from tests.ops.test_fp8 import dequant
from vllmx import ops
from vllmx.device import BF16, F16, F32, DeviceArray

from .test_cuda_ops import as_f32, dev, host

pytestmark = pytest.mark.gpu
SEED = int.from_bytes(os.urandom(4), "little")


def hopper() -> bool:
    from vllmx import _C
    return _C.cuda_available() and _C.cuda_sm90_kernels()


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(1, 128), (37, 1024), (300, 4096)])
def test_quant_bits_equal_cpu(shape, dtype):
    rng = np.random.default_rng(SEED)
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 80, (shape[0], 1))).astype(np.float32)
    x[0, :128] = 0.0  # an all-zero group
    hx = host(x, dtype)
    q, s = ops.per_token_group_quant_fp8(dev(x, dtype))
    want_q, want_s = ops.per_token_group_quant_fp8(hx, dtype if dtype != F32 else None)
    np.testing.assert_array_equal(s.numpy(), want_s)
    np.testing.assert_array_equal(q.numpy(), want_q)


def _operands(rng, t, n, k):
    x = (rng.standard_normal((t, k)) * 2).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    a, a_s = ops.per_token_group_quant_fp8(x)
    b, b_s = ops.per_token_group_quant_fp8(w)
    return a, a_s, b, b_s


def _to_dev(*arrays):
    from vllmx.device import F8_E4M3
    return [DeviceArray.from_numpy(v, F8_E4M3) if v.dtype == np.uint8
            else DeviceArray.from_numpy(np.ascontiguousarray(v)) for v in arrays]


@pytest.mark.parametrize("out_dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("tnk", [(1, 256, 128), (5, 4096, 1024), (16, 1024, 4096),
                                 (17, 1024, 1024), (64, 2048, 512), (65, 1024, 1024),
                                 (200, 3072, 1024), (1000, 512, 256), (300, 1288, 512)],
                         ids=lambda v: "T{}N{}K{}".format(*v))
def test_scaled_mm_vs_float64(tnk, with_bias, out_dtype):
    """Both tile shapes; (300, 1288) puts an odd number of 128-row weight tiles under the
    straight tile's two-CTA clusters."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    rng = np.random.default_rng(SEED)
    t, n, k = tnk
    a, a_s, b, b_s = _operands(rng, t, n, k)
    want = dequant(a, a_s) @ dequant(b, b_s).T
    bias = None
    if with_bias:
        bf = rng.standard_normal(n).astype(np.float32)
        bias = dev(bf, out_dtype)
        want = want + as_f32(host(bf, out_dtype), out_dtype)
    out = ops.scaled_mm(*_to_dev(a, b, a_s, b_s), out_dtype, bias)
    got = as_f32(out.numpy(), out_dtype).astype(np.float64)
    # fp8 wgmma sums each 128-group in f32 (promoted with its scales): within a few f32
    # roundings of the group sums, then one rounding to the 16-bit output.
    tol = 2 ** (-7 if out_dtype == BF16 else -10)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("tuning", [{"swizzle": 8, "raster": "along_n"},
                                    {"swizzle": 2, "raster": "along_m"}], ids=str)
def test_scaled_mm_tile_order_vs_float64(tuning):
    """Tiles handed out in runs (the grid rounded up to whole runs past the product's edge)
    along either dimension give the same product."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    rng = np.random.default_rng(SEED + 1)
    a, a_s, b, b_s = _operands(rng, 520, 1288, 512)
    want = dequant(a, a_s) @ dequant(b, b_s).T
    from vllmx import _C

    _C.cuda_linear_tuning(**tuning)
    try:
        got = as_f32(ops.scaled_mm(*_to_dev(a, b, a_s, b_s), BF16, None).numpy(), BF16)
    finally:
        _C.cuda_linear_tuning()
    tol = 2**-7
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_scaled_mm_refuses_misaligned_and_f32_out():
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    rng = np.random.default_rng(SEED)
    a, a_s, b, b_s = _operands(rng, 4, 100, 128)  # N = 100: not a multiple of 8
    with pytest.raises(ValueError, match="multiple of 8"):
        ops.scaled_mm(*_to_dev(a, b, a_s, b_s), BF16)
    a, a_s, b, b_s = _operands(rng, 4, 128, 128)
    with pytest.raises(ValueError, match="bf16 or f16"):
        ops.scaled_mm(*_to_dev(a, b, a_s, b_s), F32)


def test_scaled_mm_rows_batch_invariant():
    """A row's result is the same bits whatever other rows share its tile (within one tile's
    range of token counts: 2..16 take the 16-token swapped tile)."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    rng = np.random.default_rng(SEED)
    a, a_s, b, b_s = _operands(rng, 16, 1024, 1024)
    full = ops.scaled_mm(*_to_dev(a, b, a_s, b_s), BF16).numpy()
    part = ops.scaled_mm(*_to_dev(a[:3], b, np.ascontiguousarray(a_s[:, :3]), b_s), BF16).numpy()
    np.testing.assert_array_equal(part, full[:3])


def _fp8_linear_case(rng, t, n, k, dtype):
    """x (the GPU's dtype, on the device and its f32 values), w's codes and scales on the device,
    and the float64 product of x quantized as the op quantizes it with the dequantized w."""
    x = (rng.standard_normal((t, k)) * rng.uniform(0.1, 8, (t, 1))).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    hx = host(x, dtype)
    a, a_s = ops.per_token_group_quant_fp8(hx, dtype)  # the CPU twin's codes, bit for bit
    b, b_s = ops.per_token_group_quant_fp8(w)
    wd, wsd = _to_dev(b, b_s)
    wd.scales = wsd
    want = dequant(a, a_s) @ dequant(b, b_s).T
    return dev(x, dtype), hx, wd, (b, b_s), want


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("tnk", [(1, 4096, 4096), (2, 6144, 1024), (4, 1000, 14336),
                                 (3, 20, 256), (8, 256, 128), (12, 40, 128), (9, 2056, 512),
                                 (16, 1024, 2048), (5, 19200, 256), (17, 1024, 1024),
                                 (32, 6144, 1024), (33, 1024, 512), (64, 512, 256)],
                         ids=lambda v: "T{}N{}K{}".format(*v))
def test_fp8_linear_vs_float64(tnk, with_bias, dtype):
    """fp8_linear (x quantized per 128 values, then the fp8 product): up to 32 rows on the
    skinny TMA kernel (one and two 16-token tiles; N not a whole number of its 64-row CTAs, nor
    of 8; K from one group to 112, split or not; one CTA an SM, two, and 300 tiles, more than
    fit at once), more through CUTLASS; against the float64 product of the CPU twin's codes."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    rng = np.random.default_rng(SEED)
    t, n, k = tnk
    x, _, w, _, want = _fp8_linear_case(rng, t, n, k, dtype)
    bias = None
    if with_bias:
        bf = rng.standard_normal(n).astype(np.float32)
        bias = dev(bf, dtype)
        want = want + as_f32(host(bf, dtype), dtype)
    got = as_f32(ops.fp8_linear(x, w, bias).numpy(), dtype).astype(np.float64)
    tol = 2 ** (-7 if dtype == BF16 else -10)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_fp8_linear_matches_cpu_twin():
    """The GPU's fp8_linear and the CPU op on the same x and weight: the same codes, so the
    results differ only by the order of f32 sums (and the 16-bit output's rounding)."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    rng = np.random.default_rng(SEED)
    x, hx, w, (b, b_s), want = _fp8_linear_case(rng, 5, 768, 1024, BF16)
    gpu = as_f32(ops.fp8_linear(x, w).numpy(), BF16)
    cpu = as_f32(ops.fp8_linear(hx, b, w_s=b_s, x_dtype=BF16), BF16)
    np.testing.assert_allclose(gpu, cpu, rtol=2 ** -7, atol=2 ** -7 * np.abs(want).max())


def test_fp8_linear_rows_batch_invariant():
    """A row's result is the same bits alone and among any of up to 32 rows (the skinny
    kernel: each token's sums come from its own column of the mma, the split-K from N and K)."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    rng = np.random.default_rng(SEED)
    x, _, w, _, _ = _fp8_linear_case(rng, 32, 2048, 4096, BF16)
    full = ops.fp8_linear(x, w).numpy()
    xh = x.numpy()
    for rows in ([0], [3], [5, 6, 7], list(range(1, 8)), list(range(20)), list(range(3, 32))):
        part = ops.fp8_linear(DeviceArray.from_numpy(np.ascontiguousarray(xh[rows]), BF16),
                              w).numpy()
        np.testing.assert_array_equal(part, full[rows])


# A W8A8 run rounds every activation entering an fp8 projection to e4m3's 3 mantissa bits
# (vLLM's scheme), the oracle below the same values in bf16 on the GPU; a value that lies near
# an e4m3 rounding boundary may round the other way on one side, and no tolerance covers that
# jump: at most 5% of the positions (the quantized-file rule's share) may miss by up to 3 nats.
FP8_GAP, FP8_FAILED_SHARE = 3.0, 0.05


def _fake_quant(x, block: int = 128):
    """x's rows quantized per 128-wide group as per_token_group_quant_fp8 does, back in x's
    dtype."""
    import torch

    g = x.float().reshape(*x.shape[:-1], -1, block)
    s = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448.0
    return ((g / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s).reshape(
        x.shape).to(x.dtype)


def _fake_quant_inputs(model, block: int = 128):
    """transformers' model with each projection fp8 runs on (in_features whole 128-groups,
    out_features a multiple of 8, lm_head excluded) fed its input quantized as
    per_token_group_quant_fp8 quantizes it: the oracle of vLLM's W8A8 fp8 GEMM."""
    import torch

    for name, mod in model.named_modules():
        if (isinstance(mod, torch.nn.Linear) and name.endswith("proj")
                and mod.in_features % block == 0 and mod.out_features % 8 == 0):
            mod.register_forward_pre_hook(lambda m, args: (_fake_quant(args[0], block),))
    return model


def _check_w8a8(path: str, oracle, _inspect=None, **engine) -> None:
    """The checkpoint at path on the GPU: its q/k/v projection (K = 128) uploaded as e4m3 codes,
    its down_proj (K = 192) dense, and its greedy tokens within FP8_GAP of the oracle (the
    transformers model of its dequantized weights, given here) fed fp8-rounded inputs."""
    import torch

    from tests.models.parity import check_positions, log_softmax
    from tests.models.tiny_checkpoints import VOCAB
    from vllmx import LLM, SamplingParams
    from vllmx.device import F8_E4M3

    llm = LLM(path, skip_tokenizer_init=True, device="cuda", max_model_len=512,
              kv_cache_memory_bytes=256 << 20, **engine)
    model = llm.llm_engine.model_runner.model
    if _inspect is not None:  # the caller's own checks of what went up fp8
        _inspect(llm)
    else:
        layer = model.layers[0]
        assert layer.qkv_proj.parts[0].weight.dtype == F8_E4M3  # K = 128
        assert layer.down_proj.weight.dtype != F8_E4M3  # K = 192: dense
    assert model.lm_head.weight.dtype != F8_E4M3
    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(3, VOCAB, size=int(n)).tolist() for n in rng.integers(3, 120, 6)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    oracle = _fake_quant_inputs(oracle.to("cuda").eval())
    failed = positions = 0
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = oracle(torch.tensor([prompt + toks], device="cuda")).logits[0]
        report = check_positions(log_softmax(logits.double().cpu().numpy())[len(prompt) - 1:-1],
                                 toks, 0.5)
        failed += report.failed
        positions += len(toks)
        assert report.worst_gap < FP8_GAP, f"seed {SEED}: {report}"
    assert failed <= FP8_FAILED_SHARE * positions, f"seed {SEED}: {failed} of {positions}"


def test_fp8_checkpoint_runs_on_fp8_tensor_cores(tmp_path):
    """An fp8 checkpoint with one scale a tensor (AutoFP8's layout; the tiny Llama's 64- and
    192-wide matrices are no whole 128 x 128 blocks) on the GPU: its projections that the fp8
    GEMM takes are uploaded as e4m3 codes with per-row group scales (the others, K not whole
    groups, dense), and its greedy tokens pass TESTING.md's rule against transformers'
    dequantized model fed the same fp8-rounded inputs."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from tests.loader.quantized_checkpoints import tiny_llama
    from tests.loader.test_fp8_checkpoint import write_checkpoint

    path = write_checkpoint(str(tmp_path / "fp8"), block=None)
    # The oracle: the checkpoint's dense weights (fp8 values times the scale, in f32, to bf16,
    # as transformers' dequantization makes them).
    stored = load_file(os.path.join(path, "model.safetensors"))
    dense = {n: (w.float() * stored[n + "_scale"]).to(torch.bfloat16)
             for n, w in stored.items() if w.dtype == torch.float8_e4m3fn}
    oracle = tiny_llama(torch.bfloat16)
    oracle.load_state_dict({**oracle.state_dict(), **dense})
    _check_w8a8(path, oracle)


@pytest.mark.parametrize("case", ["fp8_channel_dynamic", "fp8_tensor_static"])
def test_compressed_tensors_fp8_runs_on_fp8_tensor_cores(case, tmp_path):
    """compressed-tensors' FP8 schemes (per channel with dynamic tokens, per tensor with a
    static input scale — which vllmx, quantizing activations dynamically, does not read) on
    the GPU take the same W8A8 path; the oracle is the package's own decompression."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    torch = pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    from tests.loader.test_compressed_tensors import oracle, write_checkpoint

    path = write_checkpoint(case, str(tmp_path / case), widths=(128, 192, 32))
    _check_w8a8(path, oracle(path, torch.bfloat16))


def test_online_fp8_quantizes_projections_at_upload(tmp_path):
    """vLLM's online fp8 (quantization="fp8" on a bf16 checkpoint): the projections the fp8
    GEMM takes are quantized on the device at upload, each row's 128-wide groups as activations
    are; the lm_head stays bf16; the tokens pass TESTING.md's rule against transformers with
    the same weight and input rounding."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.loader.quantized_checkpoints import tiny_llama

    path = str(tmp_path / "bf16")
    model = tiny_llama(torch.bfloat16)
    model.save_pretrained(path)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if (isinstance(mod, torch.nn.Linear) and name.endswith("proj")
                    and mod.in_features % 128 == 0 and mod.out_features % 8 == 0):
                mod.weight.copy_(_fake_quant(mod.weight))
    _check_w8a8(path, model, quantization="fp8")


# fp8 experts (fused_experts' fp8 grouped GEMM, cuda/gemm_grouped_fp8_sm90.cu): (E, k, T, H, I)
# taking each tile: 16-token swapped (decode), 64-token swapped (P > 16 an active expert), and
# 128 x 128 straight (from 96 rows an expert).
FP8_MOE_SHAPES = [(8, 2, 1, 256, 128), (8, 2, 40, 512, 256), (4, 2, 100, 256, 128),
                  (8, 2, 512, 256, 384)]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("shape", FP8_MOE_SHAPES, ids=lambda s: "E{}k{}T{}H{}I{}".format(*s))
def test_fused_experts_fp8_vs_cpu_twin(shape, dtype):
    """The GPU's fp8 experts against the CPU twin on the same (16-bit-rounded) inputs and
    against float64, row by row."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    from tests.ops.test_fp8 import fp8_experts, fused_experts_fp8_reference
    from vllmx.device import F8_E4M3

    rng = np.random.default_rng(SEED)
    e, k, t, h, inter = shape
    x = as_f32(host(rng.standard_normal((t, h)).astype(np.float32), dtype), dtype)
    c13, s13 = fp8_experts(rng, e, 2 * inter, h)
    c2, s2 = fp8_experts(rng, e, h, inter)
    tw, ti = ops.topk_softmax(rng.standard_normal((t, e)).astype(np.float32), k, True)
    cpu = ops.fused_experts(x, c13, c2, tw, ti, w13_scale=s13, w2_scale=s2)
    w13, w2 = (DeviceArray.from_numpy(c, F8_E4M3) for c in (c13, c2))
    w13.scales, w2.scales = DeviceArray.from_numpy(s13), DeviceArray.from_numpy(s2)
    out = ops.fused_experts(dev(x, dtype), w13, w2, DeviceArray.from_numpy(tw),
                            DeviceArray.from_numpy(ti))
    got = as_f32(out.numpy(), dtype).astype(np.float64)
    want = fused_experts_fp8_reference(x, c13, s13, c2, s2, tw, ti)
    # h rounds to 16 bits on the GPU before the activations are computed and quantized, so an
    # activation near an e4m3 rounding boundary may take the neighbouring code (one e4m3 step,
    # 1/16 of its value): a few of I a token; emulated in numpy, bf16's h put rows at most 3%
    # (median 1.2%) of their norm off, f16's 1.8% (0.2%). A wrong scale, expert or row is of
    # the order of the output itself.
    for name, ref in (("CPU twin", cpu), ("float64", want)):
        err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
        assert err.max() < 0.06 and np.median(err) < 0.02, \
            f"seed {SEED}: rows off the {name} by {np.sort(err)[-3:]}, median {np.median(err)}"


def test_fused_experts_fp8_token_alone_equals_in_batch():
    """A token's fp8 experts give the same bits alone as within a decode batch of the same
    tile (1 and 12 tokens over 8 experts: the 16-token swapped one)."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    from tests.ops.test_fp8 import fp8_experts
    from vllmx.device import F8_E4M3

    rng = np.random.default_rng(SEED)
    c13, s13 = fp8_experts(rng, 8, 512, 256)
    c2, s2 = fp8_experts(rng, 8, 256, 256)
    w13, w2 = (DeviceArray.from_numpy(c, F8_E4M3) for c in (c13, c2))
    w13.scales, w2.scales = DeviceArray.from_numpy(s13), DeviceArray.from_numpy(s2)
    x = rng.standard_normal((12, 256)).astype(np.float32)
    tw, ti = ops.topk_softmax(rng.standard_normal((12, 8)).astype(np.float32), 2, True)
    run = lambda n: ops.fused_experts(dev(x[:n], BF16), w13, w2,
                                      DeviceArray.from_numpy(tw[:n]),
                                      DeviceArray.from_numpy(ti[:n])).numpy()
    np.testing.assert_array_equal(run(1), run(12)[:1])


def test_online_fp8_moe_experts_run_fp8(tmp_path):
    """Online fp8 on a Qwen3-MoE checkpoint whose experts the fp8 grouped GEMM takes (H = I =
    128): the expert stacks go up as e4m3 codes with scales, and the greedy tokens pass
    TESTING.md's rule against transformers with the same weight rounding and every projection's
    input (the experts' included) quantized as per_token_group_quant_fp8 quantizes it."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import transformers as tf

    from tests.models.tiny_checkpoints import make_checkpoint
    from vllmx.device import F8_E4M3

    path = make_checkpoint("qwen3_moe", "bfloat16", str(tmp_path / "moe"),
                           {"moe_intermediate_size": 128}, hidden_size=128)
    model = tf.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if (isinstance(mod, torch.nn.Linear) and name.endswith("proj")
                    and mod.in_features % 128 == 0 and mod.out_features % 8 == 0):
                mod.weight.copy_(_fake_quant(mod.weight))
            if hasattr(mod, "gate_up_proj") and isinstance(mod.gate_up_proj, torch.nn.Parameter):
                for p in (mod.gate_up_proj, mod.down_proj):
                    p.copy_(_fake_quant(p))
                mod.forward = _fp8_experts_forward(mod)
    checked = []

    def engine_check(llm):
        block = llm.llm_engine.model_runner.model.layers[0].experts
        checked.append(block.w13.dtype == F8_E4M3 and block.w2.dtype == F8_E4M3)

    _check_w8a8(path, model, quantization="fp8", _inspect=engine_check)
    assert checked == [True]


def _fp8_experts_forward(experts):
    """transformers' Qwen3MoeExperts.forward with each expert product's input quantized per
    128 values (the oracle of fused_experts' fp8 experts)."""
    import torch

    def forward(hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e in range(experts.num_experts):
            tok, pos = torch.where(top_k_index == e)
            if tok.numel() == 0:
                continue
            gate, up = torch.nn.functional.linear(
                _fake_quant(hidden_states[tok]), experts.gate_up_proj[e]).chunk(2, dim=-1)
            act = experts.act_fn(gate) * up
            y = torch.nn.functional.linear(_fake_quant(act), experts.down_proj[e])
            out.index_add_(0, tok, (y * top_k_weights[tok, pos, None]).to(out.dtype))
        return out
    return forward


@pytest.mark.parametrize("act", [-1, 0], ids=["none", "silu"])
@pytest.mark.parametrize("with_res", [True, False], ids=["residual", "first_layer"])
@pytest.mark.parametrize("T", [1, 7, 32, 33, 300])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_rms_norm_linear_fp8_is_the_separate_ops(dtype, T, with_res, act):
    """rms_norm_linear on an fp8 w (the norm's own kernel quantizing the normed rows where
    there is a residual) gives add_rms_norm, fp8_linear and silu_and_mul bit for bit: up to 32
    rows on the skinny GEMM, more on CUTLASS, and the residual stream the same."""
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    from vllmx import _C

    rng = np.random.default_rng([SEED, T])
    K, n = 1024, 2 * 384
    x = dev((rng.standard_normal((T, K)) * 3).astype(np.float32), dtype)
    res = dev(rng.standard_normal((T, K)).astype(np.float32), dtype) if with_res else None
    g = DeviceArray.from_numpy((1 + 0.2 * rng.standard_normal(K)).astype(np.float32))
    b, b_s = ops.per_token_group_quant_fp8((rng.standard_normal((n, K)) / 32).astype(np.float32))
    w, w_s = _to_dev(b, b_s)
    n_out = n if act < 0 else n // 2

    normed = DeviceArray.empty((T, K), dtype)
    want_res = DeviceArray.empty((T, K), dtype) if with_res else None
    _C.ops.add_rms_norm(normed, want_res, x, res, g, 1e-6)
    product = DeviceArray.empty((T, n), dtype)
    _C.ops.fp8_linear(product, normed, w, w_s, None)
    want = product
    if act == 0:
        want = DeviceArray.empty((T, n_out), dtype)
        _C.ops.silu_and_mul(want, product)

    out = DeviceArray.empty((T, n_out), dtype)
    res_out = DeviceArray.empty((T, K), dtype) if with_res else None
    _C.ops.rms_norm_linear(out, res_out, x, res, g, 1e-6, w, None,
                           DeviceArray.empty((T, K), dtype),
                           DeviceArray.empty((T, n), dtype) if act >= 0 else None, act, w_s)
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    if with_res:
        np.testing.assert_array_equal(res_out.numpy(), want_res.numpy())


def test_rms_norm_linear_fp8_refuses_missing_scales():
    if not hopper():
        pytest.skip("fp8 GEMMs run on Hopper only")
    from vllmx import _C

    rng = np.random.default_rng(SEED)
    b, b_s = ops.per_token_group_quant_fp8(rng.standard_normal((256, 256)).astype(np.float32))
    w, _ = _to_dev(b, b_s)
    x = dev(rng.standard_normal((4, 256)).astype(np.float32), BF16)
    g = DeviceArray.from_numpy(np.ones(256, np.float32))
    with pytest.raises(ValueError, match="scales w_s"):
        _C.ops.rms_norm_linear(DeviceArray.empty((4, 256), BF16), None, x, None, g, 1e-6, w, None,
                               DeviceArray.empty((4, 256), BF16), None, -1)
