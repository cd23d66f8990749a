"""vLLM's "fp8" checkpoints with block scales (quant_method "fp8", weight_block_size, an fp8
e4m3 `weight` and a `weight_scale_inv` per block, as DeepSeek-V3 and Qwen3-*-FP8 ship them),
written here from a tiny random Llama: the dense weights vllmx builds equal, bit for bit, those
transformers' own FP8 dequantization gives (FineGrainedFP8Config(dequantize=True)), f32 scales
and UE8M0 ones; the tokens pass TESTING.md's f32 rule against it; per-tensor fp8 and scales of
the wrong grid are refused by name."""

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
pytest.importorskip("accelerate")  # transformers' fp8 loading needs it

BLOCK = (32, 32)


def write_checkpoint(out: str, scales: str = "f32", block=BLOCK, quant_extra=None,
                     family: str | None = None) -> str:
    """Every projection but lm_head (and a MoE's router) in fp8 e4m3 with one scale per block
    (the block's max magnitude over e4m3's 448); f32 scales or UE8M0 (a power of two, as a byte)
    ones. The tiny Llama, or tests/models' tiny checkpoint of family (its experts one by one)."""
    from safetensors.torch import load_file, save_file

    if family is None:
        tiny_llama(torch.bfloat16).save_pretrained(out)
    else:
        from tests.models.tiny_checkpoints import make_checkpoint

        out = make_checkpoint(family, "bfloat16", out)
    state = {}
    for name, w in load_file(os.path.join(out, "model.safetensors")).items():
        if "proj" not in name:
            state[name] = w.contiguous()
            continue
        if block is None:  # AutoFP8's layout: one f32 weight_scale for the tensor
            scale = (w.float().abs().amax() / 448.0).reshape(())
            state[name] = (w.float() / scale).to(torch.float8_e4m3fn)
            state[name.replace(".weight", ".weight_scale")] = scale
            continue
        n, k = w.shape
        bn, bk = block
        amax = w.float().reshape(n // bn, bn, k // bk, bk).abs().amax((1, 3)).clamp(min=1e-8)
        if scales == "ue8m0":
            e = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
            scale, stored = torch.exp2(e), (e + 127).to(torch.uint8)
        else:
            scale = stored = amax / 448.0
        full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)
        state[name] = (w.float() / full).to(torch.float8_e4m3fn)
        state[name.replace(".weight", ".weight_scale_inv")] = stored.contiguous()
    os.remove(os.path.join(out, "model.safetensors"))
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    quant = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3"}
    if block is not None:
        quant["weight_block_size"] = list(block)
    set_quantization_config(out, quant, **(quant_extra or {}))
    return out


def oracle(path: str):
    """transformers' own dequantization into the checkpoint's bf16."""
    from transformers import FineGrainedFP8Config

    return tf.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, quantization_config=FineGrainedFP8Config(dequantize=True)).eval()


@pytest.mark.parametrize("scales", ["f32", "ue8m0"])
def test_weights_equal_transformers_dequantization(scales, tmp_path):
    from vllmx.loader.quantization import dequantize_checkpoint
    from vllmx.loader.safetensors import load_safetensors

    path = write_checkpoint(str(tmp_path / scales), scales)
    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    ours = dequantize_checkpoint(load_safetensors(path), hf_config)
    assert not any(n.endswith("_scale_inv") for n in ours)
    ref = oracle(path).state_dict()
    quantized = [n for n in ours if "proj" in n]
    assert len(quantized) == 2 * 7
    for name in quantized:
        w = ours[name]
        want = ref[name].view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(np.asarray(w.data).reshape(w.shape), want, err_msg=name)


@pytest.mark.parametrize("family", [None, "qwen3_moe"])
def test_token_parity(family, tmp_path):
    """The tiny Llama, and a Qwen3-MoE whose experts each carry their fp8 weights and scales
    (transformers merges them into its fused experts; vllmx reads them by name)."""
    path = write_checkpoint(str(tmp_path / "fp8"), family=family)
    # the same bf16 weights, f32 arithmetic
    assert_token_parity(path, oracle(path).float(), f"fp8 {family or 'llama'}")


@pytest.mark.parametrize("quant", [None, {"quant_method": "modelopt", "quant_algo": "FP8"},
                                   {"quant_method": "modelopt",
                                    "quantization": {"quant_algo": "FP8"}}])
def test_per_tensor_scales(quant, tmp_path):
    """AutoFP8's layout (no weight_block_size, one weight_scale a tensor), as ModelOpt's FP8 writes
    it too: each weight is the
    fp8 values times the scale in f32, rounded to bf16 (computed here in torch), bit for bit, and
    the tokens pass against transformers running those weights."""
    from safetensors.torch import load_file

    from vllmx.loader.quantization import dequantize_checkpoint
    from vllmx.loader.safetensors import load_safetensors

    path = write_checkpoint(str(tmp_path / "tensor"), block=None)
    if quant is not None:  # ModelOpt's FP8: the same tensors
        set_quantization_config(path, quant)
    stored = load_file(os.path.join(path, "model.safetensors"))
    want = {n: (w.float() * stored[n + "_scale"]).to(torch.bfloat16)
            for n, w in stored.items() if w.dtype == torch.float8_e4m3fn}
    assert len(want) == 2 * 7
    with open(os.path.join(path, "config.json")) as f:
        ours = dequantize_checkpoint(load_safetensors(path), json.load(f))
    for name, w in want.items():
        got = ours[name]
        np.testing.assert_array_equal(np.asarray(got.data).reshape(got.shape),
                                      w.view(torch.int16).numpy().view(np.uint16), err_msg=name)
    model = tiny_llama(torch.bfloat16)
    model.load_state_dict({**model.state_dict(), **want})
    assert_token_parity(path, model.float().eval(), "fp8 per tensor")


def test_modelopt_algorithms_it_does_not_run_are_refused():
    from vllmx.loader.quantization import check_config

    with pytest.raises(ValueError, match="quant_algo 'NVFP4'"):
        check_config({"quant_method": "modelopt", "quant_algo": "NVFP4"})
    with pytest.raises(ValueError, match="kv_cache_quant_algo 'FP8'"):
        check_config({"quant_method": "modelopt", "quantization": {
            "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})


def test_a_wrong_scale_grid_is_refused(tmp_path):
    from vllmx import LLM

    # scales written for 32x32 blocks, read as 64x64: the grid does not fit
    path = write_checkpoint(str(tmp_path / "grid"), quant_extra={"weight_block_size": [64, 64]})
    with pytest.raises(ValueError, match="weight_scale_inv of shape"):
        LLM(path, skip_tokenizer_init=True)
