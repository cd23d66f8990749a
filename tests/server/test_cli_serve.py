"""`vllmx serve` as a user runs it: no model argument serves the built-in default."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "vllmx.cli.main", "serve", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _wait_healthy(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "server did not come up"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)


def test_serve_default_model(smollm2_gguf):
    port = _free_port()
    proc = _run("--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
                "--kv-cache-memory-bytes", "32M", "--api-key", "k", "--disable-log-requests",
                "--max-stored-responses", "1")
    try:
        _wait_healthy(proc, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
        assert client.models.list().data[0].id == "SmolLM2-135M-Instruct"
        out = client.completions.create(model="SmolLM2-135M-Instruct",
                                        prompt="The capital of France is", temperature=0,
                                        max_tokens=4)
        assert "Paris" in out.choices[0].text
        first, second = (client.responses.create(model="SmolLM2-135M-Instruct", input="Hi",
                                                  max_output_tokens=2) for _ in range(2))
        assert client.responses.retrieve(second.id).id == second.id
        with pytest.raises(openai.NotFoundError):  # one kept: the first went
            client.responses.retrieve(first.id)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_tensor_parallel(smollm2_gguf):
    """`vllmx serve -tp 3` on the default model (SmolLM2's 9 heads, 3 kv heads, Q4_1 rows of
    1536 / 3 = 16 blocks): three processes answer as one; terminating the server ends them."""
    port = _free_port()
    proc = _run("--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
                "--kv-cache-memory-bytes", "16M", "-tp", "3", "--disable-log-requests")
    children: list[str] = []
    try:
        _wait_healthy(proc, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        out = client.completions.create(model="SmolLM2-135M-Instruct",
                                        prompt="The capital of France is", temperature=0,
                                        max_tokens=4)
        assert "Paris" in out.choices[0].text
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, check=False,
                                  text=True).stdout.split()
        assert len(children) >= 2  # ranks 1 and 2 (and multiprocessing's resource tracker)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") for pid in children):
        assert time.monotonic() < deadline, "the ranks outlived the server"
        time.sleep(0.5)


def test_serve_flag_errors():
    # Here there is no GPU: a CPU-only build and a CUDA build without a device each say which.
    out = _run("--device", "cuda")
    assert out.wait(timeout=60) == 2
    text = out.stdout.read()
    assert "device='cuda'" in text and ("without CUDA" in text or "no CUDA GPU" in text), text
    out = _run("--max-stored-responses", "-1")
    assert out.wait(timeout=60) == 2
    assert "--max-stored-responses: must be >= 0, got -1" in out.stdout.read()
    # vLLM's validation: a value that is not a version stops the server before the model loads.
    out = _run("--show-hidden-metrics-for-version", "latest")
    assert out.wait(timeout=60) == 2
    assert "show_hidden_metrics_for_version: Invalid version: 'latest'" in out.stdout.read()


def test_serve_pooling_default_model(minilm_dir):
    """`vllmx serve --runner pooling` with no model serves the real all-MiniLM-L6-v2."""
    port = _free_port()
    proc = _run("--runner", "pooling", "--host", "127.0.0.1", "--port", str(port),
                "--disable-log-requests", "--disable-log-stats")
    try:
        _wait_healthy(proc, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY")
        assert client.models.list().data[0].id == "all-MiniLM-L6-v2"
        res = client.embeddings.create(model="all-MiniLM-L6-v2", input=["cat", "a small cat"])
        a, b = (d.embedding for d in res.data)
        assert len(a) == 384
        assert sum(x * x for x in a) == pytest.approx(1.0, abs=1e-5)
        assert 0.5 < sum(x * y for x, y in zip(a, b)) < 0.9999
    finally:
        proc.terminate()
        proc.wait(timeout=30)
