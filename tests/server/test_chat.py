"""/v1/chat/completions through the official openai client."""

from __future__ import annotations

import httpx

from tests.server.conftest import MODEL

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]


def chat(client, messages=MESSAGES, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                          max_tokens=kw.pop("max_tokens", 10), **kw)


def test_chat_text_and_usage(client, server):
    out = chat(client)
    msg = out.choices[0].message
    assert msg.role == "assistant" and "Paris" in msg.content
    assert out.object == "chat.completion"
    tok = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "messages": MESSAGES}).json()
    assert out.usage.prompt_tokens == tok["count"]
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_chat_stream_equals_full(client):
    full = chat(client, max_tokens=16).choices[0].message.content
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=16, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens > 0


def test_chat_max_completion_tokens_and_n(client):
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, temperature=0.9,
                                         seed=1, max_completion_tokens=5, logprobs=True)
    assert [c.index for c in out.choices] == [0, 1]
    assert all(len(c.logprobs.content) <= 5 for c in out.choices)
    assert out.usage.completion_tokens == sum(len(c.logprobs.content) for c in out.choices)


def test_chat_logprobs(client):
    out = chat(client, logprobs=True, top_logprobs=3, max_tokens=6).choices[0]
    content = out.logprobs.content
    assert "".join(t.token for t in content) == out.message.content
    for t in content:
        assert len(t.top_logprobs) == 3
        values = [x.logprob for x in t.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
        assert bytes(t.bytes).decode() == t.token
    plain = chat(client, logprobs=True, max_tokens=3).choices[0].logprobs.content
    assert all(t.top_logprobs == [] for t in plain)
    assert chat(client, max_tokens=3).choices[0].logprobs is None


def test_chat_stop_and_stream_logprobs(client):
    full = chat(client, max_tokens=16).choices[0].message.content
    word = full.split()[2]
    out = chat(client, max_tokens=16, stop=[word]).choices[0]
    assert out.message.content == full[:full.index(word)] and out.finish_reason == "stop"
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=5, stream=True,
        logprobs=True, top_logprobs=2))
    tokens = [t.token for c in chunks if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.content]
    assert "".join(tokens) == chat(client, max_tokens=5).choices[0].message.content


def test_continue_final_message_and_echo(client):
    msgs = [{"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "My favourite fruit is the"}]
    out = chat(client, msgs, max_tokens=5, extra_body={
        "add_generation_prompt": False, "continue_final_message": True, "echo": True})
    assert out.choices[0].message.content.startswith("My favourite fruit is the")
    assert len(out.choices[0].message.content) > len("My favourite fruit is the")


def test_chat_template_kwargs_and_text_parts(client):
    parts = [{"role": "system", "content": [{"type": "text", "text": MESSAGES[0]["content"]}]},
             {"role": "user", "content": [{"type": "text", "text": MESSAGES[1]["content"]}]}]
    assert chat(client, parts).choices[0].message.content == chat(client).choices[
        0].message.content
    out = chat(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert out.choices[0].message.content


def test_chat_use_beam_search(client):
    """use_beam_search in chat: n distinct beams as the choices, each the requested length."""
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a color."}], n=2, max_tokens=4,
        temperature=0, extra_body={"use_beam_search": True, "ignore_eos": True})
    assert len(resp.choices) == 2
    assert resp.choices[0].message.content != resp.choices[1].message.content
    assert resp.usage.completion_tokens == 8
