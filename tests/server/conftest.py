"""A real uvicorn server on loopback, in a background thread, over one AsyncLLM serving the
SmolLM2 GGUF (shared by every app of the session)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from typing_extensions import Self

from vllmx.server.app import build_app

MODEL = "smollm2"


class ServerThread:
    def __init__(self, app):
        self.app = app
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    # -- helpers ----------------------------------------------------------------------------
    def openai_client(self, api_key: str = "EMPTY", timeout: float = 120) -> openai.OpenAI:
        """The official client on this server, without retries (each request is one test)."""
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0,
                             timeout=timeout)

    def metrics_text(self) -> str:
        return httpx.get(f"{self.url}/metrics").text

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of /metrics (labels besides model_name must match)."""
        for line in self.metrics_text().splitlines():
            m = re.match(r"^([^{\s]+)(?:\{([^}]*)\})? (\S+)$", line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(m.group(3))
        raise KeyError(name)

    def wait_for(self, predicate, timeout: float = 30.0) -> None:
        """Bounded polling until predicate() holds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "condition not reached in time"
            time.sleep(0.02)


@contextlib.contextmanager
def serving(engine_client, names: list[str] | None = None, **app_kwargs):
    """A ServerThread over an app on engine_client, which is shut down afterwards."""
    try:
        with ServerThread(build_app(engine_client, names or [MODEL], log_stats_interval=None,
                                    **app_kwargs)) as s:
            yield s
    finally:
        engine_client.shutdown()


@pytest.fixture(scope="session")
def engine_client(smollm2_gguf):
    from vllmx.engine.arg_utils import EngineArgs
    from vllmx.engine.async_llm import AsyncLLM

    client = AsyncLLM.from_engine_args(EngineArgs(
        model=smollm2_gguf, max_model_len=512, max_num_seqs=64,
        kv_cache_memory_bytes=128 << 20, seed=0))
    yield client
    client.shutdown()


@pytest.fixture(scope="session")
def server(engine_client):
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None)) as s:
        yield s


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return server.openai_client()


@pytest.fixture(scope="session")
def async_client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="EMPTY", max_retries=0,
                              timeout=300)
