"""Every bad input gets OpenAI's error shape and the right status; the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import MODEL, ServerThread
from vllmx.engine.protocol import EngineClient
from vllmx.server.app import build_app


def check_error(r: httpx.Response, status: int, *words: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    for w in words:
        assert w in err["message"], err["message"]
    return err


def post(server, path, body):
    if isinstance(body, (bytes, str)):
        return httpx.post(f"{server.url}{path}", content=body,
                          headers={"Content-Type": "application/json"})
    return httpx.post(f"{server.url}{path}", json=body)


COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_malformed_json(server, path):
    check_error(post(server, path, b'{"model": "x", "prompt": '), 400, "Invalid JSON")
    check_error(post(server, path, b"[1, 2]"), 400)


@pytest.mark.parametrize("body,words", [
    ({**COMPLETION, "temperature": "hot"}, ["temperature"]),
    ({**COMPLETION, "max_tokens": "many"}, ["max_tokens"]),
    ({**COMPLETION, "prompt": {"a": 1}}, ["prompt"]),
    ({"model": MODEL}, ["prompt"]),
    ({**COMPLETION, "temperature": -1}, ["temperature"]),
    ({**COMPLETION, "top_p": 1.5}, ["top_p"]),
    ({**COMPLETION, "top_k": -5}, ["top_k"]),
    ({**COMPLETION, "min_p": 2}, ["min_p"]),
    ({**COMPLETION, "presence_penalty": 5}, ["presence_penalty"]),
    ({**COMPLETION, "repetition_penalty": 0}, ["repetition_penalty"]),
    ({**COMPLETION, "n": 0}, ["n"]),
    ({**COMPLETION, "n": 2, "temperature": 0}, ["greedy"]),
    ({**COMPLETION, "max_tokens": 0}, ["max_tokens"]),
    ({**COMPLETION, "min_tokens": 5}, ["min_tokens"]),
    ({**COMPLETION, "logprobs": 50}, ["logprobs"]),
    ({**COMPLETION, "stop_token_ids": [10**9]}, ["stop_token_ids"]),
    # vLLM's words: its request check for a missing or "" prompt, its input processor's for an
    # empty one in a list
    ({**COMPLETION, "prompt": ""}, ["Either prompt or prompt_embeds must be provided"]),
    ({k: v for k, v in COMPLETION.items() if k != "prompt"}, ["Either prompt or prompt_embeds"]),
    ({**COMPLETION, "prompt": ["hi", ""]}, ["decoder prompt cannot be empty"]),
    ({**COMPLETION, "prompt": "", "prompt_embeds": []}, ["Either prompt or prompt_embeds"]),
    ({**COMPLETION, "prompt_embeds": ["AAAA"]}, ["prompt_embeds is not supported"]),
    ({**COMPLETION, "prompt": [10**9]}, ["vocabulary"]),
    ({**COMPLETION, "suffix": "x"}, ["suffix"]),
    ({**COMPLETION, "max_tokens": 600}, ["maximum context length", "512"]),
    ({**COMPLETION, "prompt": "hi " * 600}, ["maximum context length"]),
    ({**COMPLETION, "stream_options": {"include_usage": True}}, ["stream"]),
    ({**COMPLETION, "response_format": {"type": "xml"}}, ["response_format"]),
    ({**COMPLETION, "guided_json": {"type": "nope"}}, ["Invalid JSON schema", "nope"]),
    ({**COMPLETION, "use_beam_search": True, "logprobs": 2}, ["use_beam_search"]),
    ({**COMPLETION, "use_beam_search": True, "n": 100}, ["n"]),
    ({**COMPLETION, "best_of": 3}, ["best_of"]),
])
def test_bad_completion_requests(server, body, words):
    check_error(post(server, "/v1/completions", body), 400, *words)


@pytest.mark.parametrize("body,words", [
    ({**CHAT, "messages": []}, ["at least one message"]),
    ({**CHAT, "messages": [{"role": "", "content": "hi"}]}, ["role"]),
    ({**CHAT, "messages": [{"content": "hi"}]}, ["role"]),
    ({**CHAT, "messages": "hi"}, ["messages"]),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     ["image_url"]),
    ({**CHAT, "top_logprobs": 3}, ["logprobs"]),
    ({**CHAT, "logprobs": True, "top_logprobs": 99}, ["top_logprobs"]),
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {}}},
     ["response_format"]),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, ["tool"]),
    ({**CHAT, "continue_final_message": True}, ["continue_final_message"]),
    ({**CHAT, "max_completion_tokens": 1000}, ["maximum context length"]),
    ({**CHAT, "frequency_penalty": -3}, ["frequency_penalty"]),
    ({**CHAT, "chat_template": "{{ 1 }}"}, ["chat_template"]),
])
def test_bad_chat_requests(server, body, words):
    check_error(post(server, "/v1/chat/completions", body), 400, *words)


def test_response_format_text_is_accepted(client):
    out = client.chat.completions.create(model=MODEL, messages=CHAT["messages"], max_tokens=2,
                                         response_format={"type": "text"}, user="me")
    assert out.choices[0].message.content is not None


def test_unknown_model_and_route(client, server):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-17", prompt="hi", max_tokens=2)
    assert "gpt-17" in e.value.body["message"]
    check_error(post(server, "/v1/chat/completions", {**CHAT, "model": "nope"}), 404, "nope")
    check_error(httpx.get(f"{server.url}/v1/nothing"), 404)


def test_openai_client_sees_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=-2)
    assert "temperature" in e.value.body["message"]


def test_duplicate_request_id_is_400(server):
    body = {**COMPLETION, "request_id": "dup", "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions",
                      json={**body, "max_tokens": 200, "ignore_eos": True}) as first:
        lines = first.iter_lines()  # kept: dropping it closes the connection (a disconnect)
        next(lines)
        assert server.metric("vllm:num_requests_running") == 1
        check_error(post(server, "/v1/completions", {**COMPLETION, "request_id": "dup"}), 400,
                    "already in use")
    server.wait_for(lambda: server.metric("vllm:num_requests_running") == 0)


def test_server_keeps_serving(client):
    out = client.completions.create(model=MODEL, prompt="The capital of France is",
                                    temperature=0, max_tokens=4)
    assert "Paris" in out.choices[0].text


class FaultyClient(EngineClient):
    """An EngineClient whose requests fail inside generation (a bug in the engine, say), or
    whose engine is dead."""

    def __init__(self, inner, dead=False):
        self.inner, self.dead = inner, dead

    vllm_config = property(lambda self: self.inner.vllm_config)
    errored = property(lambda self: self.dead)
    dead_error = property(lambda self: RuntimeError("boom") if self.dead else None)

    def add_dead_callback(self, callback) -> None:
        self.inner.add_dead_callback(callback)

    def get_tokenizer(self):
        return self.inner.get_tokenizer()

    def get_scheduler_stats(self):
        return self.inner.get_scheduler_stats()

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def generate(self, prompt, params=None, request_id=None, priority=0,
                       lora_request=None):
        if "explode" in (prompt.get("prompt") or ""):
            raise RuntimeError("kaboom inside the request")
        async for out in self.inner.generate(prompt, params, request_id, priority, lora_request):
            yield out


def test_exception_in_request_is_500_not_fatal(engine_client):
    with ServerThread(build_app(FaultyClient(engine_client), [MODEL],
                                log_stats_interval=None)) as s:
        err = check_error(post(s, "/v1/completions", {**COMPLETION, "prompt": "explode"}), 500,
                          "kaboom")
        assert err["type"] == "InternalServerError"
        stream = post(s, "/v1/completions", {**COMPLETION, "prompt": "explode", "stream": True})
        check_error(stream, 500, "kaboom")
        ok = post(s, "/v1/completions", {**COMPLETION, "prompt": "fine"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"]
        assert httpx.get(f"{s.url}/health").status_code == 200


def test_health_503_when_engine_dead(engine_client):
    with ServerThread(build_app(FaultyClient(engine_client, dead=True), [MODEL],
                                log_stats_interval=None)) as s:
        check_error(httpx.get(f"{s.url}/health"), 503, "stopped")


def test_vllm_flags_for_what_vllmx_always_does():
    """vLLM command lines with --enable-chunked-prefill or --disable-frontend-multiprocessing
    start (vllmx chunks prefills and runs its engine in the server's process anyway);
    --no-enable-chunked-prefill asks for a mode vllmx lacks: refused by name."""
    import argparse

    from vllmx.cli.serve import add_serve_parser, engine_args_from

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "m", "--enable-chunked-prefill",
                              "--disable-frontend-multiprocessing"])
    assert engine_args_from(args).model == "m"
    args = parser.parse_args(["serve", "m", "--no-enable-chunked-prefill"])
    with pytest.raises(ValueError, match="no-enable-chunked-prefill"):
        engine_args_from(args)
