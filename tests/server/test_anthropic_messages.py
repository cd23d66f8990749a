"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the official
`anthropic` client, on SmolLM2: the same conversation gives chat's greedy answer, streamed
events add up to the message, tool_choice forces calls that parse against their schema and
tool results go back in, stop_sequences and max_tokens give Anthropic's stop reasons,
count_tokens is the chat prompt's length, and bad requests are 4xx in Anthropic's shape.
temperature and the other sampling fields travel in the body (vLLM reads them; the client
no longer takes them as arguments)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import MODEL, ServerThread

anthropic = pytest.importorskip("anthropic")

USER = [{"role": "user", "content": "What is the capital of France?"}]
# (anthropic's client no longer takes temperature as an argument; the server reads it)
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                               timeout=120)


def test_message_is_chats_answer(claude, client):
    msg = claude.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY,
                                 system="Answer briefly.", messages=USER)
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": "Answer briefly."}, *USER])
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == chat.choices[0].message.content
    assert msg.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[
        chat.choices[0].finish_reason]
    assert msg.usage.input_tokens == chat.usage.prompt_tokens
    assert msg.usage.output_tokens == chat.usage.completion_tokens


def test_stream_adds_up_to_the_message(claude):
    kw = {"model": MODEL, "max_tokens": 16, "extra_body": GREEDY, "messages": USER}
    full = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "message_delta" in events
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in full.content]
    assert final.stop_reason == full.stop_reason
    assert final.usage.output_tokens == full.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_use_and_result(claude, stream):
    kw = {"model": MODEL, "max_tokens": 60, "extra_body": GREEDY, "tools": [WEATHER],
          "tool_choice": {"type": "tool", "name": "get_weather"},
          "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    if stream:
        with claude.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = claude.messages.create(**kw)
    calls = [b for b in msg.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(calls[0].input.get("city"), str) and calls[0].id
    # tool_choice "tool" is a named call, which ends as OpenAI's "stop"; Anthropic says tool_use
    assert msg.stop_reason == "tool_use"
    follow = claude.messages.create(
        model=MODEL, max_tokens=8, extra_body=GREEDY, tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[*kw["messages"],
                  {"role": "assistant", "content": [c.model_dump() for c in calls]},
                  {"role": "user", "content": [{"type": "tool_result",
                                                "tool_use_id": calls[0].id,
                                                "content": "Sunny, 21 C"}]}])
    assert follow.content[0].type == "text" and follow.stop_reason in ("max_tokens", "end_turn")


def test_stop_sequence(claude):
    base = claude.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY,
                                  messages=USER)
    text = base.content[0].text
    word = text.split()[1] if len(text.split()) > 1 else text[:3]
    msg = claude.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY,
                                 messages=USER, stop_sequences=[word])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == word
    assert word not in msg.content[0].text


def test_count_tokens(claude, engine_client):
    got = claude.messages.count_tokens(model=MODEL, messages=USER, system="Be brief.")
    ids = engine_client.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *USER], add_generation_prompt=True)
    assert got.input_tokens == len(ids)


def test_errors_in_anthropics_shape(server):
    url = f"{server.url}/v1/messages"
    for body, words in (
            ({"model": MODEL, "messages": USER}, "max_tokens"),  # required
            ({"model": MODEL, "max_tokens": 0, "messages": USER}, "max_tokens"),
            ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "AAAA"}}]}]}, "image"),
            ({"model": "nope", "max_tokens": 4, "messages": USER}, "nope"),
            ({"model": MODEL, "max_tokens": 4, "messages": USER,
              "tool_choice": {"type": "tool"}}, "tool_choice")):
        r = httpx.post(url, json=body, timeout=60)
        assert 400 <= r.status_code < 500, (body, r.text)
        err = r.json()
        assert err["type"] == "error" and words in err["error"]["message"], err
        assert err["error"]["type"] in ("invalid_request_error", "not_found_error")
    r = httpx.post(url, content=b"{not json", timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_x_api_key(engine_client):
    """Anthropic's clients send the key as x-api-key: the server's --api-key takes it."""
    from vllmx.server.app import build_app

    with ServerThread(build_app(engine_client, [MODEL], log_stats_interval=None,
                                api_key="sk-test")) as s:
        good = anthropic.Anthropic(base_url=s.url, api_key="sk-test", max_retries=0)
        assert good.messages.create(model=MODEL, max_tokens=2, messages=USER).content
        bad = anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            bad.messages.create(model=MODEL, max_tokens=2, messages=USER)
        r = httpx.post(f"{s.url}/v1/chat/completions", timeout=60,
                       headers={"x-api-key": "sk-test"},
                       json={"model": MODEL, "messages": USER, "max_tokens": 2})
        assert r.status_code == 200, r.text
    assert json.dumps(WEATHER)  # (the schema is plain JSON)
