"""vLLM 0.26's request fields and answers that a rerun of its entrypoint tests found vllmx
without (issue 21): an empty stream_options sends no usage, return_token_ids (the prompt's
and each choice's ids, streamed as deltas), return_prompt_text, the message's `reasoning`
(read back from input messages, as is the older reasoning_content),
--enable-prompt-tokens-details' cached_tokens, and vllm:num_requests_waiting_by_reason; and
0.26's server flags around them: --fingerprint-mode (system_fingerprint),
--enable-per-request-metrics, --enable-force-include-usage."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import MODEL, ServerThread

MSGS = [{"role": "user", "content": "Name three colours."}]


def sse(url: str, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a stream."""
    out = []
    with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 3}),
    ("/v1/chat/completions", {"model": MODEL, "messages": MSGS, "max_tokens": 3}),
])
def test_empty_stream_options_sends_no_usage(server, path, body):
    """vLLM's StreamOptions.include_usage defaults to false: `{}` is no usage chunk."""
    assert all("usage" not in c for c in sse(server.url, path, {**body, "stream_options": {}}))
    chunks = sse(server.url, path, {**body, "stream_options": {"include_usage": True}})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_completion_return_token_ids(server, engine_client):
    tok = engine_client.tokenizer
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6,
            "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json={**body, "return_token_ids": True},
                   timeout=60).json()
    ch = r["choices"][0]
    assert ch["prompt_token_ids"] == tok.encode(body["prompt"])
    assert len(ch["token_ids"]) == r["usage"]["completion_tokens"] == 6
    assert tok.decode(ch["token_ids"]) == ch["text"]
    chunks = sse(server.url, "/v1/completions", {**body, "return_token_ids": True})
    choices = [c["choices"][0] for c in chunks]
    assert choices[0]["prompt_token_ids"] == ch["prompt_token_ids"]
    assert all(c["prompt_token_ids"] is None for c in choices[1:])
    assert [t for c in choices for t in c["token_ids"]] == ch["token_ids"]
    # Without it both keys are null, in the answer and in every chunk.
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert r["choices"][0]["token_ids"] is None and r["choices"][0]["prompt_token_ids"] is None
    assert all(c["choices"][0]["token_ids"] is None and c["choices"][0]["prompt_token_ids"]
               is None for c in sse(server.url, "/v1/completions", body))


def test_chat_return_token_ids_and_prompt_text(server, engine_client):
    tok = engine_client.tokenizer
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 8, "temperature": 0,
            "return_token_ids": True, "return_prompt_text": True}
    text = tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=False)
    ids = tok.apply_chat_template(MSGS, add_generation_prompt=True)
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    assert r["prompt_text"] == text and r["prompt_token_ids"] == ids
    ch = r["choices"][0]
    assert len(ch["token_ids"]) == r["usage"]["completion_tokens"] == 8
    assert tok.decode(ch["token_ids"]) == ch["message"]["content"]
    chunks = sse(server.url, "/v1/chat/completions", body)
    assert chunks[0]["prompt_token_ids"] == ids and chunks[0]["prompt_text"] == text
    assert all("prompt_token_ids" not in c and "prompt_text" not in c for c in chunks[1:])
    assert [t for c in chunks[1:] for t in c["choices"][0]["token_ids"] or []] == ch["token_ids"]
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={k: v for k, v in body.items() if not k.startswith("return_")}).json()
    assert r["prompt_text"] is None and r["prompt_token_ids"] is None
    assert r["choices"][0]["token_ids"] is None


def test_input_reasoning_reaches_the_template():
    """An assistant message's `reasoning` (vLLM's) or `reasoning_content` (its older name) is
    what the template reads (which sees it under both names and `thinking`)."""
    from vllmx.server.protocol import ChatMessage
    from vllmx.server.serving_chat import conversation
    from vllmx.tokenizer.chat_template import render_chat_template

    for key in ("reasoning", "reasoning_content"):
        conv = conversation([ChatMessage(role="assistant", content="Red.", **{key: "Think."})])
        assert conv[0]["reasoning"] == "Think."
        tpl = "{{ messages[0].reasoning }}|{{ messages[0].reasoning_content }}"
        assert render_chat_template(tpl, conv) == "Think.|Think."


def test_prompt_tokens_details(engine_client):
    """--enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens is the
    prompt's prefix-cache hit (0 for a new prompt, whole blocks of it when sent again); the
    last chunk of a stream carries it without vLLM's null fields. Without the flag: null, and
    no key in a stream."""
    from vllmx.server.app import build_app

    prompt = "Cached tokens are counted in blocks of sixteen. " * 6
    block = engine_client.vllm_config.cache_config.block_size
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                enable_prompt_tokens_details=True)) as s:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
        first = httpx.post(f"{s.url}/v1/completions", json=body, timeout=60).json()["usage"]
        assert first["prompt_tokens_details"] == {"cached_tokens": 0,
                                                  "created_cache_tokens": None,
                                                  "multimodal_tokens": None}
        again = httpx.post(f"{s.url}/v1/completions", json=body, timeout=60).json()["usage"]
        cached = again["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0 and cached % block == 0 and cached <= again["prompt_tokens"]
        last = sse(s.url, "/v1/completions",
                   {**body, "stream_options": {"include_usage": True}})[-1]["usage"]
        assert last["prompt_tokens_details"] == {"cached_tokens": cached}
        chat = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 2}
        httpx.post(f"{s.url}/v1/chat/completions", json=chat, timeout=60)
        u = httpx.post(f"{s.url}/v1/chat/completions", json=chat, timeout=60).json()["usage"]
        assert u["prompt_tokens_details"]["cached_tokens"] > 0
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None)) as s:
        u = httpx.post(f"{s.url}/v1/completions", json=body, timeout=60).json()["usage"]
        assert u["prompt_tokens_details"] is None
        last = sse(s.url, "/v1/completions",
                   {**body, "stream_options": {"include_usage": True}})[-1]["usage"]
        assert "prompt_tokens_details" not in last


def test_waiting_by_reason(server):
    """vLLM's split of the waiting requests: every waiting request waits for capacity in
    vllmx (none is set aside out of order), so the two add up to num_requests_waiting."""
    waiting = server.metric("vllm:num_requests_waiting")
    assert server.metric("vllm:num_requests_waiting_by_reason", reason="capacity") == waiting
    assert server.metric("vllm:num_requests_waiting_by_reason", reason="deferred") == 0


def test_system_fingerprint(server, engine_client):
    """vLLM's default --fingerprint-mode full: "vllmx-<version>-<hash8>" in every response, the
    same for one configuration and another for a different one; streamed, on a choice's last
    chunk, or on the usage chunk when one follows; none: null; custom: the value given."""
    import re

    from vllmx import __version__
    from vllmx.server.app import build_app
    from vllmx.server.fingerprint import build_system_fingerprint

    comp = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    chat = {"model": MODEL, "messages": MSGS, "max_tokens": 2}
    fp = httpx.post(f"{server.url}/v1/completions", json=comp, timeout=60).json()[
        "system_fingerprint"]
    assert re.fullmatch(rf"vllmx-{re.escape(__version__)}-[0-9a-f]{{8}}", fp)
    assert httpx.post(f"{server.url}/v1/chat/completions", json=chat,
                      timeout=60).json()["system_fingerprint"] == fp
    for path, body in (("/v1/completions", comp), ("/v1/chat/completions", chat)):
        chunks = sse(server.url, path, body)
        stamped = [c for c in chunks if "system_fingerprint" in c]
        assert stamped == [chunks[-1]] and chunks[-1]["choices"][0]["finish_reason"]
        assert stamped[0]["system_fingerprint"] == fp
        chunks = sse(server.url, path, {**body, "stream_options": {"include_usage": True}})
        assert [c for c in chunks if "system_fingerprint" in c] == [chunks[-1]]
        assert chunks[-1]["choices"] == [] and chunks[-1]["system_fingerprint"] == fp
    cfg = engine_client.vllm_config
    assert build_system_fingerprint(cfg) == build_system_fingerprint(cfg, "hash") == fp
    other = __import__("copy").deepcopy(cfg)
    other.cache_config.kv_cache_dtype = "float32"
    assert build_system_fingerprint(other) != fp
    other = __import__("copy").deepcopy(cfg)
    other.cache_config.num_blocks += 1  # what start-up measured: not the configuration
    assert build_system_fingerprint(other) == fp
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                fingerprint_mode="none")) as s:
        assert httpx.post(f"{s.url}/v1/completions", json=comp,
                          timeout=60).json()["system_fingerprint"] is None
        assert all("system_fingerprint" not in c for c in sse(s.url, "/v1/completions", comp))
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                fingerprint_mode="custom", fingerprint_value="fleet-7")) as s:
        assert httpx.post(f"{s.url}/v1/chat/completions", json=chat,
                          timeout=60).json()["system_fingerprint"] == "fleet-7"
    with pytest.raises(ValueError, match="fingerprint mode"):
        build_system_fingerprint(cfg, "partial")


def test_per_request_metrics_and_forced_usage(engine_client):
    """--enable-per-request-metrics: `metrics` with vLLM's five timings, consistent with each
    other; null for n > 1 (not one stream's) and without the flag; streamed, on the usage
    chunk. --enable-force-include-usage: a stream without stream_options still ends with
    usage, and every chunk carries it."""
    from vllmx.server.app import build_app

    comp = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    keys = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
            "tokens_per_second"}
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                enable_per_request_metrics=True)) as s:
        for path, body in (("/v1/completions", comp),
                           ("/v1/chat/completions", {"model": MODEL, "messages": MSGS,
                                                     "max_tokens": 8, "temperature": 0})):
            m = httpx.post(f"{s.url}{path}", json=body, timeout=60).json()["metrics"]
            assert set(m) == keys and all(v is not None and v >= 0 for v in m.values())
            assert m["mean_itl_ms"] == pytest.approx(m["generation_time_ms"] / 7)
            # tokens over the time from scheduling to the last token (TTFT + generation)
            total_s = (m["time_to_first_token_ms"] + m["generation_time_ms"]) / 1000
            assert m["tokens_per_second"] == pytest.approx(8 / total_s, rel=1e-6)
            last = sse(s.url, path, {**body, "stream_options": {"include_usage": True}})[-1]
            assert set(last["metrics"]) == keys
        r = httpx.post(f"{s.url}/v1/completions", timeout=60,
                       json={**comp, "n": 2, "temperature": 1.0, "seed": 1}).json()
        assert r["metrics"] is None and len(r["choices"]) == 2
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                enable_force_include_usage=True)) as s:
        chunks = sse(s.url, "/v1/completions", comp)
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
        assert all("usage" in c for c in chunks)
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None)) as s:
        assert httpx.post(f"{s.url}/v1/completions", json=comp,
                          timeout=60).json()["metrics"] is None
