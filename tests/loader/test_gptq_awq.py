"""GPTQ and AWQ checkpoints, written here in their published layouts from a tiny random Llama in
f16 (no package that writes or reads them runs on this CPU: AutoGPTQ / GPTQModel and AutoAWQ
build CUDA kernels): every quantized weight vllmx builds equals, bit for bit, the format's
reference dequantization computed here the way those packages compute it (torch, in the scales'
f16), and the tokens pass TESTING.md's f32 rule against transformers running those weights.
The writer packs with AWQ's order and GPTQ's stored zero - 1; vllmx's reader unpacks with its
own code."""

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

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _quantize(w: torch.Tensor, bits: int, group: int, g_idx: torch.Tensor):
    """Asymmetric per-group integers of w [K, N] (inputs in rows): (q, zeros [G, N], scales)."""
    groups = w.shape[0] // group
    top = (1 << bits) - 1
    mn = torch.stack([w[g_idx == g].amin(0) for g in range(groups)]).clamp(max=0)
    mx = torch.stack([w[g_idx == g].amax(0) for g in range(groups)]).clamp(min=0)
    scales = ((mx - mn) / top).clamp(min=1e-5).half()
    zeros = torch.round(-mn / scales.float()).clamp(1, top).int()  # >= 1: GPTQ stores zero - 1
    q = torch.clamp(torch.round(w / scales.float()[g_idx]) + zeros[g_idx], 0, top).int()
    return q, zeros, scales


def _pack(values: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """Columns of values packed into int32 words, `32 / bits` a word, the first in the lowest
    bits (order: which column of each run goes to each slot)."""
    per = 32 // bits
    rows, cols = values.shape
    v = values.reshape(rows, cols // per, per).long()
    if order is not None:
        v = v[:, :, order]
    shifts = torch.arange(per) * bits
    word = ((v & ((1 << bits) - 1)) << shifts).sum(-1)
    return word.to(torch.int64).remainder(1 << 32).to(torch.int64).numpy().astype(
        np.uint32).view(np.int32)


def write_checkpoint(method: str, out: str, bits: int = 4, group: int = 32,
                     act_order: bool = False, v2: bool = False):
    """(checkpoint dir, the dequantized weights by name)."""
    from safetensors.numpy import save_file

    model = tiny_llama(torch.float16)
    model.save_pretrained(out)
    tensors, dense = {}, {}
    for name, w in model.state_dict().items():
        if "proj" not in name:
            tensors[name] = w.numpy()
            continue
        prefix = name[: -len(".weight")]
        wt = w.float().T.contiguous()  # [K, N]
        k = wt.shape[0]
        g_idx = torch.arange(k) // group
        if act_order:
            g_idx = g_idx[torch.randperm(k)]
        q, zeros, scales = _quantize(wt, bits, group, g_idx)
        # the reference: in f16, as the packages dequantize
        dense[name] = (scales[g_idx] * (q - zeros[g_idx]).half()).T.contiguous()
        if method == "gptq":
            tensors[prefix + ".qweight"] = _pack(q.T.contiguous(), bits).T.copy()
            tensors[prefix + ".qzeros"] = _pack(zeros if v2 else zeros - 1, bits)
            tensors[prefix + ".g_idx"] = g_idx.int().numpy()
        else:
            tensors[prefix + ".qweight"] = _pack(q, 4, AWQ_ORDER)
            tensors[prefix + ".qzeros"] = _pack(zeros, 4, AWQ_ORDER)
        tensors[prefix + ".scales"] = scales.numpy()
    os.remove(os.path.join(out, "model.safetensors"))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    quant = ({"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order,
              "sym": False, "checkpoint_format": "gptq_v2" if v2 else "gptq"}
             if method == "gptq" else
             {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
              "version": "gemm"})
    set_quantization_config(out, quant)
    return out, dense, model


CASES = {"gptq_4bit": {"method": "gptq"},
         "gptq_4bit_act_order": {"method": "gptq", "act_order": True},
         "gptq_v2_8bit_g64": {"method": "gptq", "bits": 8, "group": 64, "v2": True},
         "awq_4bit": {"method": "awq"},
         "awq_4bit_g64": {"method": "awq", "group": 64}}


@pytest.mark.parametrize("case", sorted(CASES))
def test_weights_equal_the_reference_dequantization(case, tmp_path):
    from vllmx.loader.quantization import dequantize_checkpoint
    from vllmx.loader.safetensors import load_safetensors

    path, dense, _ = write_checkpoint(out=str(tmp_path / case), **CASES[case])
    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    ours = dequantize_checkpoint(load_safetensors(path), hf_config)
    assert not any(n.endswith((".qweight", ".qzeros", ".scales", ".g_idx")) for n in ours)
    some = next(iter(dense))  # made when asked for, not kept: never all in memory at once
    assert ours[some].data is not ours[some].data
    assert len(dense) == 2 * 7
    for name, want in dense.items():
        w = ours[name]
        np.testing.assert_array_equal(np.asarray(w.data).reshape(w.shape), want.numpy(),
                                      err_msg=name)


@pytest.mark.parametrize("case", ["gptq_4bit_act_order", "awq_4bit"])
def test_token_parity(case, tmp_path):
    path, dense, model = write_checkpoint(out=str(tmp_path / case), **CASES[case])
    model.load_state_dict({**model.state_dict(), **dense})
    assert_token_parity(path, model.float().eval(), case)


@pytest.mark.parametrize("quant,named", [
    ({"quant_method": "gptq", "bits": 3}, "bits 3"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "'marlin'"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "'gemv'"),
    ({"quant_method": "awq", "bits": 4, "zero_point": False}, "zero_point"),
])
def test_what_it_does_not_run_is_refused_by_name(quant, named):
    from vllmx.loader.quantization import check_config

    with pytest.raises(ValueError, match=named):
        check_config(quant)


def test_the_quantization_argument_must_match_the_checkpoint(tmp_path):
    """vLLM's `quantization` names the method the checkpoint holds (or a kernel name of it);
    a mismatch, or a method asked of an unquantized checkpoint, is refused naming both."""
    from vllmx import LLM

    path, _, _ = write_checkpoint(out=str(tmp_path / "awq"), method="awq")
    for ok in ("awq", "awq_marlin"):
        LLM(path, skip_tokenizer_init=True, quantization=ok)
    with pytest.raises(ValueError, match=r"quantization='gptq' does not match .*'awq'"):
        LLM(path, skip_tokenizer_init=True, quantization="gptq")
    dense = tiny_llama(torch.float16)
    dense.save_pretrained(str(tmp_path / "dense"))
    with pytest.raises(ValueError, match="quantize an unquantized checkpoint"):
        LLM(str(tmp_path / "dense"), skip_tokenizer_init=True, quantization="gptq")
    # vLLM's online fp8 runs on Hopper only: on the CPU it is refused, naming why
    with pytest.raises(ValueError, match="compute capability 9.0 GPU only"):
        LLM(str(tmp_path / "dense"), skip_tokenizer_init=True, quantization="fp8")


@pytest.mark.parametrize("method,tensor,shape", [
    ("gptq", "scales", (3, 7)), ("gptq", "qzeros", (1, 1)), ("gptq", "g_idx", (5,)),
    ("awq", "scales", (2, 3)), ("awq", "qzeros", (4,)), ("awq", "qweight", (3,)),
])
def test_tensors_that_do_not_fit_are_refused_at_load(method, tensor, shape, tmp_path):
    """A module whose scales, zeros or group index do not fit its qweight is refused when the
    checkpoint is read, naming the module and the shapes, before any weight is dequantized."""
    from safetensors.numpy import load_file, save_file

    from vllmx.loader.quantization import dequantize_checkpoint
    from vllmx.loader.safetensors import load_safetensors

    path, _, _ = write_checkpoint(out=str(tmp_path / method), method=method)
    f = os.path.join(path, "model.safetensors")
    tensors = load_file(f)
    name = "model.layers.1.mlp.down_proj." + tensor
    tensors[name] = np.zeros(shape, tensors[name].dtype)
    save_file(tensors, f, metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as fh:
        hf_config = json.load(fh)
    with pytest.raises(ValueError, match=f"{method} checkpoint: model.layers.1.mlp.down_proj"):
        dequantize_checkpoint(load_safetensors(path), hf_config)
