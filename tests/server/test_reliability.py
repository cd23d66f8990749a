"""No request can take the server down: values past what the native code holds are 400s
(or clamped as vLLM clamps), a fault inside one request fails that request alone, CPU work
stays off the event loop, bodies past the limit are 413s, the API key is checked, CORS has
vLLM's defaults. After each case the next normal request succeeds and /health stays 200."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from fastapi.responses import JSONResponse

from bench.serve_stress import health_during_large_prompt
from tests.engine.test_fault_isolation import POISON_SEED, FaultySamplingState
from tests.server.conftest import MODEL, ServerThread
from tests.server.test_errors import CHAT, COMPLETION, check_error, post
from vllmx.server.app import build_app, json_response
from vllmx.worker import model_runner

BIG = 2**70  # valid JSON, past int64

HOSTILE_COMPLETIONS = [
    ({"temperature": 1.7e308}, "temperature"),
    ({"repetition_penalty": 1.7e308}, "repetition_penalty"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"top_p": 1e-300}, "top_p"),
    ({"seed": 2**64}, "seed"),
    ({"seed": 2**64}, "[type=less_than_equal]"),  # pydantic's error type, as vLLM reports it
    ({"seed": -(2**63) - 1}, "[type=greater_than_equal]"),
    ({"n": 129}, "n"),
    ({"n": BIG}, "n"),
    ({"max_tokens": BIG}, "maximum context length"),
    ({"min_tokens": BIG, "max_tokens": 4}, "min_tokens"),
    ({"logprobs": BIG}, "logprobs"),
    ({"logprobs": 21}, "logprobs"),
    ({"prompt_logprobs": 2**40}, "prompt_logprobs"),
    ({"prompt_logprobs": -2}, "positive value or -1"),
    ({"prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
    ({"prompt_logprobs": -1, "stream": True}, "not available when `stream=True`"),
    ({"truncate_prompt_tokens": BIG}, "truncate_prompt_tokens"),
    ({"prompt": [-1]}, "vocabulary"),
    ({"prompt": [2**64]}, "vocabulary"),
    ({"prompt": [[1, 2], [BIG]]}, "vocabulary"),
    ({"stop": ["x"] * 65}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"allowed_token_ids": [BIG]}, "allowed_token_ids"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {str(BIG): 1}}, "logit_bias"),
    ({"bad_words": ["x"] * 1025}, "bad_words"),
]

HOSTILE_CHATS = [
    ({"max_completion_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": BIG}, "maximum context length"),
    ({"logprobs": True, "top_logprobs": BIG}, "top_logprobs"),
    ({"seed": BIG}, "seed"),
    ({"temperature": 1.7e308}, "temperature"),
    ({"prompt_logprobs": 2, "stream": True}, "not available when `stream=True`"),
    ({"prompt_logprobs": -3}, "positive value or -1"),
]


def assert_healthy(server) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    r = post(server, "/v1/completions", {**COMPLETION, "prompt": "The capital of France is",
                                         "temperature": 0, "max_tokens": 4})
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"], r.text


@pytest.mark.parametrize("fields,word", HOSTILE_COMPLETIONS)
def test_hostile_completion_values(server, fields, word):
    check_error(post(server, "/v1/completions", {**COMPLETION, **fields}), 400, word)
    assert_healthy(server)


@pytest.mark.parametrize("fields,word", HOSTILE_CHATS)
def test_hostile_chat_values(server, fields, word):
    check_error(post(server, "/v1/chat/completions", {**CHAT, **fields}), 400, word)
    assert_healthy(server)


def test_non_finite_json_numbers(server):
    # Python's JSON parser reads NaN and Infinity, which no sampler value may be.
    for literal in (b"NaN", b"Infinity", b"1e400"):
        body = b'{"model": "%s", "prompt": "Hi", "max_tokens": 2, "temperature": %s}' % (
            MODEL.encode(), literal)
        check_error(post(server, "/v1/completions", body), 400, "temperature")
    assert_healthy(server)


def test_top_k_past_vocabulary_is_clamped(server):
    """vLLM's rule: top_k at or past the vocabulary means no top-k (so greedy stays greedy)."""
    base = {**COMPLETION, "prompt": "The capital of France is", "max_tokens": 6}
    ref = post(server, "/v1/completions", {**base, "temperature": 0}).json()
    for top_k in (2**64, 10**30, 49152):
        r = post(server, "/v1/completions", {**base, "temperature": 0, "top_k": top_k})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == ref["choices"][0]["text"]
    r = post(server, "/v1/completions", {**base, "temperature": 0.8, "top_k": 2**64, "seed": 3})
    assert r.status_code == 200, r.text
    assert_healthy(server)


def test_detokenize_out_of_vocabulary(server):
    for tokens in ([BIG], [-1], [1, 2**64]):
        check_error(httpx.post(f"{server.url}/detokenize", json={"tokens": tokens}), 400,
                    "vocabulary")
    assert_healthy(server)


def test_request_body_limit(engine_client):
    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                max_request_body_bytes=1 << 20)) as s:
        big = {**COMPLETION, "prompt": "x" * (2 << 20)}
        check_error(post(s, "/v1/completions", big), 413, "larger than", "1048576")

        def chunks():  # no Content-Length: the body is counted as it arrives
            yield b'{"model": "%s", "prompt": "' % MODEL.encode()
            for _ in range(40):
                yield b"y" * 65536
            yield b'"}'

        r = httpx.post(f"{s.url}/v1/completions", content=chunks(),
                       headers={"Content-Type": "application/json"})
        check_error(r, 413, "larger than")
        ok = post(s, "/v1/completions", {**COMPLETION, "prompt": "x" * 1000})
        assert ok.status_code == 200, ok.text


def test_api_key_and_cors(engine_client):
    with ServerThread(build_app(engine_client, [MODEL], api_key="s3cret",
                                log_stats_interval=None)) as s:
        for auth in (None, "Bearer s3cre", "Bearer s3cretX", "s3cret", b"Bearer \xc3\xa9"):
            headers = {"Authorization": auth} if auth else {}
            r = httpx.post(f"{s.url}/v1/completions", json=COMPLETION, headers=headers)
            check_error(r, 401, "Unauthorized")
        r = httpx.post(f"{s.url}/v1/completions", json=COMPLETION,
                       headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200, r.text
        # vLLM's CORS defaults: any origin, method and header, no credentials.
        pre = httpx.options(f"{s.url}/v1/completions", headers={
            "Origin": "https://example.com", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in pre.headers


def test_fault_in_one_request_fails_it_alone(server, monkeypatch):
    """An exception while stepping one request: that request gets a 500 (or, once streaming,
    an error event); a request beside it finishes with the tokens it gets alone."""
    monkeypatch.setattr(model_runner, "RequestSamplingState", FaultySamplingState)
    neighbour = {**COMPLETION, "prompt": "Write a haiku about the sea.", "temperature": 0,
                 "max_tokens": 24, "ignore_eos": True}
    alone = post(server, "/v1/completions", neighbour).json()["choices"][0]["text"]
    poisoned = {**COMPLETION, "prompt": "Hello there", "seed": POISON_SEED, "max_tokens": 8}
    errors_before = server.metric("vllm:request_success_total", finished_reason="error")
    results = {}

    def run_neighbour():
        results["neighbour"] = post(server, "/v1/completions", neighbour)

    t = threading.Thread(target=run_neighbour)
    t.start()
    err = check_error(post(server, "/v1/completions", poisoned), 500,
                      "injected sampler-state fault")
    assert err["type"] == "InternalServerError"
    check_error(post(server, "/v1/completions", {**poisoned, "stream": True}), 500,
                "injected sampler-state fault")
    chat = {**CHAT, "seed": POISON_SEED, "max_tokens": 8}
    check_error(post(server, "/v1/chat/completions", chat), 500, "injected")
    t.join(60)
    assert results["neighbour"].status_code == 200
    assert results["neighbour"].json()["choices"][0]["text"] == alone
    assert server.metric("vllm:request_success_total", finished_reason="error") == (
        errors_before + 3)
    monkeypatch.undo()
    server.wait_for(lambda: server.metric("vllm:num_requests_running") == 0)
    assert server.metric("vllm:kv_cache_usage_perc") == 0.0
    assert_healthy(server)


@pytest.mark.parametrize("path,fields", [
    ("/tokenize", {}),
    ("/v1/completions", {"truncate_prompt_tokens": 32, "max_tokens": 2}),  # keeps its tail
])
def test_health_answers_while_a_large_prompt_is_tokenized(server, path, fields):
    """A 2 MB prompt takes seconds to tokenize: meanwhile /health keeps answering. Its slowest
    answer is held to half the large request's time, not to a fixed bound: a loop blocked by
    the tokenizing would hold a poll for about all of it, while in the full suite on the 2-core
    CI machine one poll took 414 and 471 ms of a 1.7 s request (alone, < 100 ms; the tokenizer
    leaves the GIL free but for gaps of < 40 ms), a stall not yet explained."""
    out = health_during_large_prompt(server.url, 2.0, path, model=MODEL, **fields)
    assert out["health_polls"] >= 5, "the large prompt was tokenized too fast to test anything"
    assert out["health_not_200"] == 0, out
    assert out["health_max_ms"] < 500 * out["request_s"], out
    assert out["status"] == 200, out
    if path == "/tokenize":
        assert out["tokens"] > 400_000
    assert_healthy(server)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {**COMPLETION, "prompt": "Jack is a dull boy. " * 100_000}),
    ("/v1/chat/completions", {**CHAT, "messages": [
        {"role": "user", "content": "Jack is a dull boy. " * 100_000}]}),
])
def test_prompt_that_cannot_fit_is_refused_before_tokenizing(server, path, body):
    t0 = time.perf_counter()
    check_error(post(server, path, body), 400, "maximum context length", "at least")
    assert time.perf_counter() - t0 < 1.0  # tokenizing it would take about 2 s here


def test_draining_refuses_new_work(engine_client):
    app = build_app(engine_client, [MODEL], log_stats_interval=None)
    with ServerThread(app) as s:
        assert post(s, "/v1/completions", COMPLETION).status_code == 200
        app.state.draining = True  # what SIGTERM sets (cli/serve.py)
        check_error(post(s, "/v1/completions", COMPLETION), 503, "shutting down")
        check_error(post(s, "/v1/chat/completions", CHAT), 503, "shutting down")
        check_error(httpx.get(f"{s.url}/health"), 503, "shutting down")
        assert httpx.get(f"{s.url}/metrics").status_code == 200  # still readable


def test_json_response_renders_long_lists_in_slices():
    content = {"count": 3, "tokens": list(range(200_000)), "token_strs": ["\u00e9", "a\"b"],
               "none": None}
    body = json_response(content).body
    assert json.loads(body) == content
    assert body == JSONResponse(content).body  # byte for byte what FastAPI would send
