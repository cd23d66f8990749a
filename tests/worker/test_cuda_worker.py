"""GPU start-up decisions that need no GPU: which device 'auto' / 'cuda' resolve to and the
errors that name why (no CUDA build, no device, a GPU too old), and vLLM's dtype='auto'."""

from __future__ import annotations

import pytest

from vllmx import _C
from vllmx.device import BF16, F16, F32
from vllmx.worker import cuda_worker


def _fake_gpu(monkeypatch, built=True, available=True, name="NVIDIA H200", capability=90):
    monkeypatch.setattr(_C, "cuda_built", lambda: built)
    monkeypatch.setattr(_C, "cuda_available", lambda: available)
    monkeypatch.setattr(_C, "cuda_device_info", lambda: (name, capability))


def test_resolve_device(monkeypatch):
    _fake_gpu(monkeypatch)
    assert cuda_worker.resolve_device("auto") == "cuda"
    assert cuda_worker.resolve_device("cpu") == "cpu"
    _fake_gpu(monkeypatch, name="Tesla T4", capability=75)
    with pytest.raises(ValueError, match=r"Tesla T4 has compute capability 7\.5.*8\.0 or newer"):
        cuda_worker.resolve_device("cuda")
    assert cuda_worker.resolve_device("auto") == "cpu"  # falls back, saying why in the log
    _fake_gpu(monkeypatch, available=False)
    with pytest.raises(ValueError, match="no CUDA GPU is available"):
        cuda_worker.resolve_device("cuda")
    assert cuda_worker.resolve_device("auto") == "cpu"
    _fake_gpu(monkeypatch, built=False)
    with pytest.raises(ValueError, match="built without CUDA"):
        cuda_worker.resolve_device("cuda")
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu' or 'cuda', got 'tpu'"):
        cuda_worker.resolve_device("tpu")


def test_activation_dtype():
    assert cuda_worker.activation_dtype("auto", {"torch_dtype": "bfloat16"}) == BF16
    assert cuda_worker.activation_dtype("auto", {"dtype": "float16"}) == F16
    assert cuda_worker.activation_dtype("auto", {"torch_dtype": "float32"}) == BF16
    assert cuda_worker.activation_dtype("auto", {}) == BF16  # GGUF
    assert cuda_worker.activation_dtype("half", {}) == F16
    assert cuda_worker.activation_dtype("float32", {}) == F32
    with pytest.raises(ValueError, match="dtype must be auto"):
        cuda_worker.activation_dtype("int8", {})


def test_llm_device_cuda_without_gpu_is_a_clear_error(monkeypatch, tmp_path):
    from vllmx import LLM

    _fake_gpu(monkeypatch, available=False)
    with pytest.raises(ValueError, match="device='cuda': no CUDA GPU is available"):
        LLM(str(tmp_path), device="cuda")


def test_dense_weights_convert_like_torch():
    """Dense weights reach the GPU in the activation dtype: f32 -> bf16 rounds to nearest even,
    bf16 -> f32 is exact, f16 goes through f32 (the host side of placement.upload_weight)."""
    import numpy as np

    from vllmx.layers.placement import _dense_as
    from vllmx.ops import Weight

    rng = np.random.default_rng()
    x = (rng.standard_normal((16, 40)) * np.exp(rng.uniform(-30, 30, (16, 40)))).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rne = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bf16 = _dense_as(Weight.from_numpy(x), BF16)
    assert np.array_equal(bf16, rne)
    back = _dense_as(Weight(bf16, BF16, bf16.shape), F32)
    assert np.array_equal(back, (rne.astype(np.uint32) << 16).view(np.float32))
    h = x.clip(-6e4, 6e4).astype(np.float16)
    assert np.array_equal(_dense_as(Weight.from_numpy(h), F32), h.astype(np.float32))
