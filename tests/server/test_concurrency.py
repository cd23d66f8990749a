"""32 concurrent streaming clients get what they get one at a time; a client that disconnects
aborts its request and frees its KV blocks."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx

from tests.server.conftest import MODEL

PROMPTS = [f"Write a short sentence about the number {i}." for i in range(32)]


def test_32_concurrent_streams_equal_sequential(client, async_client, server):
    sequential = [client.completions.create(model=MODEL, prompt=p, temperature=0,
                                            max_tokens=12).choices[0].text for p in PROMPTS]

    async def one(p: str) -> str:
        stream = await async_client.completions.create(model=MODEL, prompt=p, temperature=0,
                                                       max_tokens=12, stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_at_once():
        return await asyncio.gather(*(one(p) for p in PROMPTS))

    assert asyncio.run(all_at_once()) == sequential
    server.wait_for(lambda: server.metric("vllm:num_requests_running") == 0)


def _idle(server, kv_before: float):
    return lambda: (server.metric("vllm:num_requests_running") == 0
                    and server.metric("vllm:num_requests_waiting") == 0
                    and server.metric("vllm:kv_cache_usage_perc") == kv_before)


def test_streaming_disconnect_aborts(server):
    kv_before = server.metric("vllm:kv_cache_usage_perc")
    aborts = server.metric("vllm:request_success_total", finished_reason="abort")
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 400,
            "ignore_eos": True, "stream": True}
    with httpx.Client() as http, http.stream("POST", f"{server.url}/v1/completions",
                                             json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert server.metric("vllm:num_requests_running") == 1
        assert server.metric("vllm:kv_cache_usage_perc") > kv_before
    # The connection is closed: the request must be aborted long before 400 tokens.
    server.wait_for(_idle(server, kv_before), timeout=10)
    assert server.metric("vllm:request_success_total", finished_reason="abort") == aborts + 1
    assert server.metric("vllm:generation_tokens_total") > 0


def test_non_streaming_disconnect_aborts(server):
    kv_before = server.metric("vllm:kv_cache_usage_perc")
    body = json.dumps({"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 400,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    server.wait_for(lambda: server.metric("vllm:num_requests_running") == 1, timeout=10)
    sock.close()
    server.wait_for(_idle(server, kv_before), timeout=10)


def test_server_serves_after_disconnects(client):
    out = client.completions.create(model=MODEL, prompt="The capital of France is",
                                    temperature=0, max_tokens=4)
    assert "Paris" in out.choices[0].text
