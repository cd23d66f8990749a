"""The server under load, in its own process with a small KV cache (so that blocks are
recycled and requests preempted): 256 concurrent streams all complete with the right token
counts, 100 clients leaving mid-stream give every KV block back, a 2,000-request soak leaves
RSS flat after warm-up. bench/serve_stress.py runs the same, larger."""

from __future__ import annotations

import httpx
import pytest

from bench.serve_stress import (
    MODEL,
    concurrent_streams,
    disconnects,
    process_rss_kib,
    serve_process,
    soak,
    wait_idle,
)


@pytest.fixture(scope="module")
def stress_server(smollm2_gguf):
    # 16 MiB of KV: about 700 tokens of SmolLM2, far less than 256 streams hold at once.
    with serve_process(smollm2_gguf, "--served-model-name", MODEL, "--max-model-len", "256",
                       "--max-num-seqs", "64", "--kv-cache-memory-bytes", "16M",
                       "--disable-log-stats") as (url, proc):
        yield url, proc


def test_256_concurrent_streams_complete(stress_server):
    url, _ = stress_server
    out = concurrent_streams(url, 256, max_tokens=16)
    assert out["completed"] == 256, out
    assert wait_idle(url) < 5


def test_100_disconnects_return_every_kv_block(stress_server):
    url, _ = stress_server
    out = disconnects(url, 100)
    assert out["kv_usage_after"] == 0.0 and out["kv_free_after_s"] < 5, out
    assert httpx.get(f"{url}/health").status_code == 200


def test_soak_rss_flat_after_warmup(stress_server):
    url, proc = stress_server
    out = soak(url, 2000, process_rss_kib(proc.pid), concurrency=32, max_tokens=4)
    assert out["failures"] == 0, out["first_failures"]
    # Flat: what grows after the first quarter is allocator noise, not a leak per request
    # (a leak of even 10 KiB a request would add 15 MiB here).
    assert out["rss_growth_after_warmup_mib"] < 8, out["rss_curve_mib"]
    wait_idle(url)
    assert httpx.get(f"{url}/health").status_code == 200
