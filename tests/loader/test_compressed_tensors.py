"""compressed-tensors checkpoints (quantization_config quant_method "compressed-tensors"), written
here by the compressed-tensors package itself from a tiny random Llama (its ModelCompressor
packs the weights; the scales are each group's min / max, as llm-compressor's observers take
them): every quantized weight vllmx builds equals, bit for bit, the one the package's own
decompression gives (transformers loading the checkpoint with dequantize=True), the model's
tokens pass TESTING.md's f32 rule against that oracle, and what the format holds beyond
vllmx's reach is refused by name."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.loader.quantized_checkpoints import (
    assert_token_parity,
    set_quantization_config,
    tiny_llama,
)

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
ct = pytest.importorskip("compressed_tensors")


def _args(**kw):
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(**kw)


def _scheme(name: str):
    """(weights args, input activation args, format) of each case."""
    int_w = {"type": "int", "symmetric": True, "dynamic": False}
    fp8 = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
    return {
        "w4a16_g32": (_args(num_bits=4, strategy="group", group_size=32, **int_w), None,
                      "pack-quantized"),
        "w4a16_asym_g32": (_args(num_bits=4, type="int", symmetric=False, strategy="group",
                                 group_size=32), None, "pack-quantized"),
        "w3a16_channel": (_args(num_bits=3, strategy="channel", **int_w), None, "pack-quantized"),
        "w8a16_channel": (_args(num_bits=8, strategy="channel", **int_w), None, "pack-quantized"),
        "w8a16_int_asym": (_args(num_bits=8, type="int", symmetric=False, strategy="channel"),
                           None, "int-quantized"),
        "fp8_tensor_static": (_args(strategy="tensor", **fp8),
                              _args(strategy="tensor", **fp8), "float-quantized"),
        "fp8_channel_dynamic": (_args(strategy="channel", **fp8),
                                _args(num_bits=8, type="float", strategy="token", symmetric=True,
                                      dynamic=True), "float-quantized"),
        "fp8_block": (_args(strategy="block", block_structure=[32, 32], **fp8), None,
                      "float-quantized"),
        "nvfp4": (_args(num_bits=4, type="float", strategy="tensor_group", group_size=16,
                        symmetric=True, dynamic=False, scale_dtype=torch.float8_e4m3fn),
                  None, "nvfp4-pack-quantized"),
        "mxfp4": (_args(num_bits=4, type="float", strategy="group", group_size=32,
                        symmetric=True, dynamic=False, scale_dtype=torch.uint8),
                  None, "mxfp4-pack-quantized"),
        "int8_w8a8": (_args(num_bits=8, strategy="channel", **int_w),
                      _args(num_bits=8, type="int", strategy="token", symmetric=True,
                            dynamic=True), "int-quantized"),
    }[name]


CASES = ["w4a16_g32", "w4a16_asym_g32", "w3a16_channel", "w8a16_channel",
         "w8a16_int_asym", "fp8_tensor_static", "fp8_channel_dynamic", "fp8_block", "int8_w8a8",
         "nvfp4", "mxfp4"]


def _min_max(w, args):
    """Each scale's range of w (its group, channel, block or the whole tensor)."""
    n, k = w.shape
    if args.strategy in ("group", "tensor_group"):
        v = w.reshape(n, k // args.group_size, args.group_size)
        return v.amin(-1), v.amax(-1)
    if args.strategy == "channel":
        return w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    if args.strategy == "tensor":
        return w.amin().reshape(1), w.amax().reshape(1)
    bn, bk = args.block_structure  # blocks past the edge are partial
    gn, gk = -(-n // bn), -(-k // bk)
    mn, mx = torch.empty(gn, gk), torch.empty(gn, gk)
    for i in range(gn):
        for j in range(gk):
            b = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            mn[i, j], mx[i, j] = b.min(), b.max()
    return mn, mx


def write_checkpoint(case: str, out: str, dtype=torch.bfloat16, widths=(96, 160, 24),
                     **quant_extra) -> str:
    """widths: the tiny Llama's hidden, intermediate and head sizes."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    weights, acts, fmt = _scheme(case)
    # by default widths that are not whole 32 x 32 blocks (the fp8 block case's partial blocks)
    model = tiny_llama(dtype, hidden=widths[0], intermediate=widths[1], head_dim=widths[2])
    model.save_pretrained(out + "-dense")  # the model before quantization
    scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=acts)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme},
                                                        ignore=["lm_head"]))
    for _, m in model.named_modules():
        if not hasattr(m, "weight_scale"):
            continue
        mn, mx = _min_max(m.weight.detach().float(), weights)
        gscale = None
        if hasattr(m, "weight_global_scale"):  # NVFP4: the group scales' fp8 range spent
            gscale = generate_gparam(mn.min().reshape(1), mx.max().reshape(1))
            m.weight_global_scale.data = gscale.to(m.weight_global_scale.dtype)
        scale, zp = calculate_qparams(mn, mx, weights, global_scale=gscale)
        m.weight_scale.data = scale.to(m.weight_scale.dtype).reshape(m.weight_scale.shape)
        if hasattr(m, "weight_zero_point"):
            m.weight_zero_point.data = zp.to(m.weight_zero_point.dtype).reshape(
                m.weight_zero_point.shape)
        if hasattr(m, "input_scale"):
            m.input_scale.data = torch.full_like(m.input_scale, 0.05)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    if quant_extra:
        with open(os.path.join(out, "config.json")) as f:
            set_quantization_config(out, json.load(f)["quantization_config"], **quant_extra)
    return out


def oracle(path: str, dtype=torch.float32):
    """transformers with the package's own decompression (dense weights, no activation QDQ)."""
    from transformers.utils.quantization_config import CompressedTensorsConfig

    return tf.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, quantization_config=CompressedTensorsConfig(dequantize=True)).eval()


@pytest.mark.parametrize("case", CASES)
def test_weights_equal_the_formats_decompression(case, tmp_path):
    from vllmx.loader.quantization import dequantize_checkpoint
    from vllmx.loader.safetensors import load_safetensors

    path = write_checkpoint(case, str(tmp_path / case))
    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    ours = dequantize_checkpoint(load_safetensors(path), hf_config)
    ref = oracle(path, torch.bfloat16).state_dict()
    dense = tf.AutoModelForCausalLM.from_pretrained(path + "-dense").state_dict()
    quantized = [n for n in ours if "proj" in n]
    assert len(quantized) == 2 * 7
    for name in quantized:
        w = ours[name]
        assert w.shape == tuple(ref[name].shape), name
        want = ref[name].view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(np.asarray(w.data).reshape(w.shape), want, err_msg=name)
        # the format shows: most of these weights are not the unquantized model's
        changed = (ref[name] != dense[name]).float().mean()
        assert changed > 0.5, f"{name}: only {changed:.0%} of the weights changed"


@pytest.mark.parametrize("case", CASES)
def test_token_parity(case, tmp_path):
    path = write_checkpoint(case, str(tmp_path / case))
    assert_token_parity(path, oracle(path), case)


@pytest.mark.parametrize("extra,named", [
    ({"kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "kv_cache_scheme"),
    ({"transform_config": {"config_groups": {"u": {"type": "hadamard"}}}}, "transform_config"),
    ({"sparsity_config": {"format": "sparse-24-bitmask"}}, "sparse-24-bitmask"),
])
def test_what_it_does_not_run_is_refused_by_name(extra, named, tmp_path):
    from vllmx import LLM

    path = write_checkpoint("w4a16_g32", str(tmp_path / "ckpt"), **extra)
    with pytest.raises(ValueError, match=named):
        LLM(path, skip_tokenizer_init=True)


def test_output_activations_and_other_formats_are_refused(tmp_path):
    from vllmx.loader.compressed_tensors import check_config

    w = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}
    with pytest.raises(ValueError, match="output activation quantization"):
        check_config({"config_groups": {"g": {"format": "int-quantized", "weights": w,
                                              "output_activations": dict(w, strategy="token")}}})
    with pytest.raises(ValueError, match="marlin-24"):
        check_config({"config_groups": {"g": {"format": "marlin-24", "weights": w}}})


def test_fp8_tensor_without_a_format_is_refused(tmp_path):
    """An fp8 tensor in a checkpoint whose config names no format vllmx reads."""
    from vllmx import LLM

    path = write_checkpoint("fp8_tensor_static", str(tmp_path / "ckpt"))
    set_quantization_config(path, None)
    with pytest.raises(ValueError, match="is fp8"):
        LLM(path, skip_tokenizer_init=True)
