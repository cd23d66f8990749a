"""load_format="dummy": the tensors it makes are exactly those transformers writes for the same
config (names and shapes, every family), the model runs from a config.json alone and the same
seed gives the same weights and tokens, and bad combinations are clear errors."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from vllmx.loader.dummy import DUMMY_HIGH, DUMMY_LOW, DummyWeights
from vllmx.loader.safetensors import load_safetensors
from vllmx.models.registry import get_model_class

FAMILIES = ["llama", "llama3", "mistral", "qwen2", "qwen3", "granite", "smollm3", "phi3", "glm4",
            "olmo2", "olmo2_bias", "olmo3", "exaone4", "gemma2", "gemma3",
            "qwen3_moe", "mixtral", "granite_moe", "granite_moe_shared", "gpt_neox",
            "gpt_neox_seq", "stablelm", "stablelm_parallel", "starcoder2", "gpt2", "cohere",
            "cohere_bias", "cohere2", "falcon", "falcon_one_norm", "falcon_mq", "falcon_seq"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.models.test_gemma2_parity import make_checkpoint as make_gemma2
    from tests.models.test_gemma3_parity import make_checkpoint as make_gemma3
    from tests.models.tiny_checkpoints import make_checkpoint

    d = str(tmp_path_factory.mktemp("dummy"))
    paths = {f: make_checkpoint(f, "bfloat16", d) for f in FAMILIES if not f.startswith("gemma")}
    paths["gemma2"] = make_gemma2("mixed", "float32", d)
    paths["gemma3"] = make_gemma3("mixed", "float32", d)
    return paths


def config(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("family", FAMILIES)
def test_shapes_are_the_checkpoints(checkpoints, family):
    cfg = config(checkpoints[family])
    real = {name: tuple(w.shape) for name, w in load_safetensors(checkpoints[family]).items()}
    assert get_model_class(cfg).checkpoint_shapes(cfg) == real


def test_values_dtype_and_seed(checkpoints):
    cfg = config(checkpoints["qwen3"])
    shapes = get_model_class(cfg).checkpoint_shapes(cfg)
    a, b, c = (DummyWeights(shapes, cfg, seed) for seed in (0, 0, 1))
    w = a["model.layers.0.mlp.down_proj.weight"]
    assert w.shape == shapes["model.layers.0.mlp.down_proj.weight"]
    vals = (w.data.astype(np.uint32) << 16).view(np.float32)  # bf16, as config.json says
    assert DUMMY_LOW <= vals.min() and vals.max() <= DUMMY_HIGH and vals.std() > 1e-4
    assert np.array_equal(w.data, b["model.layers.0.mlp.down_proj.weight"].data)
    assert not np.array_equal(w.data, c["model.layers.0.mlp.down_proj.weight"].data)
    # each tensor its own stream: gate and up (same shape) differ
    assert not np.array_equal(a["model.layers.0.mlp.up_proj.weight"].data,
                              a["model.layers.0.mlp.gate_proj.weight"].data)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "gpt2", "stablelm"])
def test_runs_from_a_config_alone(checkpoints, tmp_path, family):
    from vllmx import LLM, SamplingParams

    only_config = tmp_path / f"{family}-config-only"
    only_config.mkdir()
    shutil.copy(os.path.join(checkpoints[family], "config.json"), only_config)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = {"prompt_token_ids": [5, 9, 200, 31]}
    runs = []
    for _ in range(2):
        llm = LLM(str(only_config), load_format="dummy", skip_tokenizer_init=True, device="cpu")
        runs.append(llm.generate(prompt, params)[0].outputs[0].token_ids)
    assert len(runs[0]) == 8 and runs[0] == runs[1]
    with pytest.raises(ValueError, match="no .safetensors files"):
        LLM(str(only_config), skip_tokenizer_init=True, device="cpu")


def test_a_hub_model_fetches_no_weights(checkpoints, tmp_path, monkeypatch):
    """A Hub id with load_format='dummy' downloads the config (and tokenizer) files only."""
    import sys
    import types

    from vllmx import LLM

    only_config = tmp_path / "hub-snapshot"
    only_config.mkdir()
    shutil.copy(os.path.join(checkpoints["qwen3"], "config.json"), only_config)
    asked = []

    def snapshot_download(repo_id, allow_patterns):
        asked.append((repo_id, allow_patterns))
        return str(only_config)

    monkeypatch.setitem(sys.modules, "huggingface_hub",
                        types.SimpleNamespace(snapshot_download=snapshot_download))
    LLM("some-org/some-model", load_format="dummy", skip_tokenizer_init=True, device="cpu")
    assert asked and all(r == "some-org/some-model" and "*.safetensors" not in p
                         for r, p in asked)


def test_bad_load_formats(checkpoints, smollm2_gguf):
    from vllmx import LLM

    with pytest.raises(ValueError, match="load_format 'pt' is not supported; vllmx reads auto"):
        LLM(checkpoints["llama"], load_format="pt")
    with pytest.raises(ValueError, match="load_format='dummy' builds the model from a config"):
        LLM(smollm2_gguf, load_format="dummy")
    with pytest.raises(ValueError, match="load_format='gguf' but .* is not a GGUF file"):
        LLM(checkpoints["llama"], load_format="gguf", skip_tokenizer_init=True)


def test_serve_flag():
    import argparse

    from vllmx.cli.serve import add_serve_parser, engine_args_from

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "some/model", "--load-format", "dummy"])
    assert engine_args_from(args).load_format == "dummy"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "some/model", "--load-format", "pt"])


@pytest.mark.parametrize("family", ["granite", "smollm3", "phi3", "glm4", "olmo2", "olmo3",
                                    "exaone4", "gemma2", "granite_moe_shared", "cohere2",
                                    "falcon", "falcon_seq"])
def test_each_family_runs_from_its_config(checkpoints, family, tmp_path):
    """Every family builds from DummyWeights (fused tensors split, Gemma's 1 + w, per-type
    ropes, GraniteMoe's stacked experts) and generates."""
    from vllmx import LLM, SamplingParams

    only_config = tmp_path / family
    only_config.mkdir()
    shutil.copy(os.path.join(checkpoints[family], "config.json"), only_config)
    llm = LLM(str(only_config), load_format="dummy", skip_tokenizer_init=True, device="cpu")
    out = llm.generate({"prompt_token_ids": [5, 9, 200, 31]},
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


def test_fp8_codes_from_a_config(monkeypatch):
    """An fp8 config's projections the fp8 GEMM would run (monkeypatched: a Hopper GPU's) come
    as F8_E4M3_B128 rows: no NaN code, values within +-1e-3, the same bits for the same seed,
    other bits for another; the router and norms stay dense."""
    import torch

    from vllmx.loader import fp8
    from vllmx.loader.dummy import DummyWeights
    from vllmx.ops import F8_E4M3_B128

    monkeypatch.setattr(fp8, "fp8_gemm_takes", lambda n, k: k % 128 == 0 and n % 8 == 0)
    shapes = {"model.layers.0.mlp.experts.3.gate_proj.weight": (256, 384),
              "model.layers.0.mlp.gate.weight": (8, 384)}
    cfg = {"torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    w = DummyWeights(shapes, cfg, seed=0)
    e = w["model.layers.0.mlp.experts.3.gate_proj.weight"]
    assert e.dtype == F8_E4M3_B128 and w["model.layers.0.mlp.gate.weight"].dtype != F8_E4M3_B128
    blocks = np.asarray(e.data).reshape(256, 3, 132)
    codes = np.ascontiguousarray(blocks[:, :, 4:]).reshape(256, 384)
    assert not ((codes & 0x7F) == 0x7F).any()
    values = e.to_float32().reshape(256, 384)
    assert np.isfinite(values).all() and np.abs(values).max() <= 1e-3 * (1 + 1e-6)
    assert np.abs(values).max() > 0.5e-3 and len(np.unique(codes)) > 100
    ref = torch.tensor(codes).view(torch.float8_e4m3fn).float().numpy() * (1e-3 / 1.875)
    np.testing.assert_allclose(values, ref, rtol=1e-6)
    again = DummyWeights(shapes, cfg, seed=0)["model.layers.0.mlp.experts.3.gate_proj.weight"]
    other = DummyWeights(shapes, cfg, seed=1)["model.layers.0.mlp.experts.3.gate_proj.weight"]
    assert np.array_equal(np.asarray(again.data), np.asarray(e.data))
    assert not np.array_equal(np.asarray(other.data), np.asarray(e.data))
