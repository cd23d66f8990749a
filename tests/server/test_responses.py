"""POST /v1/responses end to end on SmolLM2 with the official openai client: the answer equals
the chat completion of the same conversation (greedy), streamed events come in vLLM's order
with deltas that add up to the final items, forced tool calls give function_call items, a
function_call_output and previous_response_id continue a conversation, text.format json_schema
validates, and what cannot be honoured is a 400 (404 for unknown ids) in OpenAI's shape."""

from __future__ import annotations

import json

import httpx
import jsonschema_rs
import openai
import pytest

from tests.server.conftest import MODEL, ServerThread
from tests.server.test_errors import check_error, post
from vllmx.server.app import build_app

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"type": "function", "name": "get_time", "description": "The time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string",
                                                                 "maxLength": 20}},
                       "required": ["zone"], "additionalProperties": False}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
QUESTION = "What is the weather in Paris?"
BODY = {"model": MODEL, "input": "Hi", "max_output_tokens": 4}


@pytest.fixture(scope="module")
def rserver(engine_client):
    app = build_app(engine_client, [MODEL], log_stats_interval=None,
                    enable_auto_tool_choice=True, tool_call_parser="hermes",
                    max_stored_responses=4)
    with ServerThread(app) as s:
        yield s


@pytest.fixture(scope="module")
def rclient(rserver) -> openai.OpenAI:
    return rserver.openai_client()


def chat_text(client, messages, max_tokens=16) -> str:
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                          max_tokens=max_tokens).choices[0].message.content


def events_of(client, **kw) -> list:
    return list(client.responses.create(stream=True, **kw))


def test_text_in_text_out_equals_chat(rclient):
    r = rclient.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.",
                                 max_output_tokens=16, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status in ("completed", "incomplete") and r.created_at > 0
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.content[0].type == "output_text"
    assert r.output_text == chat_text(rclient, [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}])
    u = r.usage
    assert 0 < u.output_tokens <= 16 and u.total_tokens == u.input_tokens + u.output_tokens
    if r.status == "incomplete":
        assert u.output_tokens == 16 and r.incomplete_details.reason == "max_output_tokens"


def test_input_items_with_content_parts(rclient):
    r = rclient.responses.create(model=MODEL, temperature=0, max_output_tokens=12, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}])
    assert r.output_text == chat_text(rclient, [{"role": "user", "content": "Name a color."}],
                                      12)


def test_stream_events_in_order(rclient):
    kw = {"model": MODEL, "input": "Tell me a story.", "max_output_tokens": 24,
          "temperature": 0}
    events = events_of(rclient, **kw)
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    deltas = types[4:-4]
    assert deltas and set(deltas) == {"response.output_text.delta"}
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in events[3:-2])
    final = events[-1].response
    assert events[-4].text == text == final.output_text
    assert final.output[0].id == item_id and final.usage.output_tokens == 24
    assert final.status == "incomplete"
    assert text == rclient.responses.create(**kw).output_text


@pytest.mark.parametrize("tool_choice", ["none", "required"])
def test_openai_stream_helper(rclient, tool_choice):
    """The client's responses.stream() rebuilds the response from the events and checks them
    as it goes; its final response equals the one the server sent last."""
    kw = {"model": MODEL, "input": QUESTION, "max_output_tokens": 120, "temperature": 0,
          "tools": TOOLS, "tool_choice": tool_choice}
    with rclient.responses.stream(**kw) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    want = rclient.responses.create(**kw)
    def shown(items):
        return [(i.type, i.status, getattr(i, "name", None), getattr(i, "arguments", None),
                 [c.text for c in getattr(i, "content", None) or []]) for i in items]

    assert shown(final.output) == shown(want.output) and final.output_text == want.output_text


def test_output_text_logprobs(rclient):
    kw = {"model": MODEL, "input": "Count to five.", "max_output_tokens": 8, "temperature": 0,
          "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    r = rclient.responses.create(**kw)
    lps = r.output[0].content[0].logprobs
    assert len(lps) == r.usage.output_tokens == 8
    assert "".join(lp.token for lp in lps) == r.output_text
    assert all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].logprob >= lp.logprob
               for lp in lps)
    events = events_of(rclient, **kw)
    streamed = [lp for e in events if e.type == "response.output_text.delta"
                for lp in e.logprobs]
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, lp.logprob) for lp in lps]


def check_call(item, names=None):
    assert item.type == "function_call" and item.id.startswith("fc_") and item.call_id
    assert item.name in SCHEMAS and (names is None or item.name in names)
    assert jsonschema_rs.validator_for(SCHEMAS[item.name]).is_valid(json.loads(item.arguments))


@pytest.mark.parametrize("choice,names", [
    ("required", None), ({"type": "function", "name": "get_time"}, ["get_time"])])
def test_forced_tool_calls_are_function_call_items(rclient, choice, names):
    r = rclient.responses.create(model=MODEL, input=QUESTION, tools=TOOLS, tool_choice=choice,
                                 temperature=0, max_output_tokens=200)
    assert r.status == "completed" and r.output
    for item in r.output:
        check_call(item, names)
    assert r.tools[0].name == "get_weather"  # echoed in the Responses shape
    # The stream's items are the same calls, their arguments the sum of their deltas.
    events = events_of(rclient, model=MODEL, input=QUESTION, tools=TOOLS, tool_choice=choice,
                       temperature=0, max_output_tokens=200)
    final = events[-1].response
    assert [(i.name, i.arguments) for i in final.output] == \
        [(i.name, i.arguments) for i in r.output]
    for k, item in enumerate(final.output):
        args = "".join(e.delta for e in events if e.type ==
                       "response.function_call_arguments.delta" and e.output_index == k)
        done = [e for e in events if e.type == "response.function_call_arguments.done"
                and e.output_index == k]
        assert args == done[0].arguments == item.arguments and done[0].name == item.name


def test_parallel_tool_calls_false_gives_one_call(rclient):
    r = rclient.responses.create(model=MODEL, input=QUESTION, tools=TOOLS,
                                 tool_choice="required", parallel_tool_calls=False,
                                 temperature=0.9, top_p=0.9, max_output_tokens=200)
    assert len(r.output) == 1 and r.parallel_tool_calls is False
    check_call(r.output[0])


def test_function_call_output_continues_the_conversation(rclient):
    first = rclient.responses.create(model=MODEL, input=QUESTION, tools=TOOLS,
                                     tool_choice={"type": "function", "name": "get_weather"},
                                     temperature=0, max_output_tokens=200)
    (call,) = first.output
    turn = [{"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}]
    second = rclient.responses.create(model=MODEL, input=turn, tools=TOOLS, tool_choice="none",
                                      temperature=0, max_output_tokens=12)
    chat = rclient.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=12, tool_choice="none",
        tools=[{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
               for t in TOOLS],
        messages=[{"role": "user", "content": QUESTION},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": call.call_id, "type": "function", "function": {
                          "name": call.name, "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "content": "18 C, sunny"}])
    assert second.output_text == chat.choices[0].message.content
    # The same through previous_response_id: the call comes from the stored response.
    third = rclient.responses.create(
        model=MODEL, previous_response_id=first.id, tools=TOOLS, tool_choice="none",
        temperature=0, max_output_tokens=12, input=[
            {"type": "function_call_output", "call_id": call.call_id,
             "output": "18 C, sunny"}])
    assert third.output_text == second.output_text
    assert third.previous_response_id == first.id


def test_previous_response_id_get_and_delete(rclient, rserver):
    first = rclient.responses.create(model=MODEL, input="My name is Ann.", temperature=0,
                                     max_output_tokens=10, instructions="Be kind.")
    second = rclient.responses.create(model=MODEL, input="What is my name?", temperature=0,
                                      max_output_tokens=10, previous_response_id=first.id)
    # The earlier instructions are not carried over (OpenAI's rule); the earlier answer is.
    assert second.output_text == chat_text(rclient, [
        {"role": "user", "content": "My name is Ann."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}], 10)
    got = rclient.responses.retrieve(first.id)
    assert got.output_text == first.output_text and got.usage == first.usage
    rclient.responses.delete(first.id)
    r = httpx.get(f"{rserver.url}/v1/responses/{first.id}")
    check_error(r, 404, f"Response with id '{first.id}' not found.")
    # A chain continues from a response whose parent was deleted: each keeps its history.
    third = rclient.responses.create(model=MODEL, input="And again?", max_output_tokens=2,
                                     previous_response_id=second.id)
    assert third.status in ("completed", "incomplete")


def test_store_false_and_the_bound(rclient, rserver):
    r = rclient.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    assert r.store is False
    check_error(httpx.get(f"{rserver.url}/v1/responses/{r.id}"), 404)
    ids = [rclient.responses.create(model=MODEL, input="Hi", max_output_tokens=2).id
           for _ in range(5)]  # the server keeps 4: the first goes
    check_error(httpx.get(f"{rserver.url}/v1/responses/{ids[0]}"), 404)
    assert httpx.get(f"{rserver.url}/v1/responses/{ids[-1]}").json()["id"] == ids[-1]
    check_error(post(rserver, f"/v1/responses/{ids[-1]}/cancel", {}), 400,
                "Cannot cancel a synchronous response.")


def test_without_a_store(engine_client):
    with pytest.raises(ValueError, match="max_stored_responses"):
        build_app(engine_client, [MODEL], max_stored_responses=-1)
    app = build_app(engine_client, [MODEL], log_stats_interval=None, max_stored_responses=0)
    with ServerThread(app) as s:
        r = post(s, "/v1/responses", BODY).json()
        assert r["store"] is False  # store=true is ignored, as vLLM's default
        check_error(httpx.get(f"{s.url}/v1/responses/{r['id']}"), 404)


def test_text_format_json_schema_validates(rclient):
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": False}
    for stream in (False, True):
        kw = {"model": MODEL, "input": "Describe a person as JSON.", "max_output_tokens": 80,
              "temperature": 0.8, "extra_body": {"seed": 3}, "text": {"format": {
                  "type": "json_schema", "name": "person", "schema": schema, "strict": True}}}
        if stream:
            text = events_of(rclient, **kw)[-1].response.output_text
        else:
            text = rclient.responses.create(**kw).output_text
        assert jsonschema_rs.validator_for(schema).is_valid(json.loads(text)), text
    r = rclient.responses.create(model=MODEL, input="Reply with the JSON {\"ok\": true} and nothing else.",
                                 max_output_tokens=300, temperature=0,
                                 text={"format": {"type": "json_object"}})
    assert r.status == "completed" and isinstance(json.loads(r.output_text), dict)


@pytest.mark.parametrize("body,status,param,words", [
    ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type", ["'web_search'"]),
    ({"tools": [{"type": "function", "name": ""}]}, 400, "tools[0].name", ["non-empty"]),
    ({"background": True}, 400, "background", ["background"]),
    ({"include": ["reasoning.encrypted_content"]}, 400, "include[0]", ["not supported"]),
    ({"truncation": "auto"}, 400, "truncation", ["truncation"]),
    ({"input": []}, 400, "input", ["must not be empty"]),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type",
     ["'item_reference'"]),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     400, "input[0].content[0]", ["'input_image'"]),
    ({"input": [{"role": "robot", "content": "x"}]}, 400, "input[0].role", ["'robot'"]),
    ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]}, 400,
     "input[0].call_id", ["no function_call"]),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{x"}]},
     400, "input[0].arguments", ["not JSON"]),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, 400,
     "tool_choice", ["'nope'"]),
    ({"tools": TOOLS, "tool_choice": {"type": "file_search"}}, 400, "tool_choice",
     ["function tool only"]),
    ({"tool_choice": "required"}, 400, "tool_choice", ["`tools` must be set"]),
    ({"text": {"format": {"type": "yaml"}}}, 400, "text.format.type", ["'yaml'"]),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema",
     ["schema"]),
    ({"max_output_tokens": 100000}, 400, "max_output_tokens", ["maximum context length"]),
    ({"previous_response_id": "resp_nope"}, 404, "response_id", ["'resp_nope' not found"]),
    ({"model": "other"}, 404, "model", ["does not exist"]),
])
def test_bad_requests(rserver, body, status, param, words):
    err = check_error(post(rserver, "/v1/responses", {**BODY, **body}), status, *words)
    assert err["param"] == param


def test_unknown_ids_are_404s(rserver):
    for method, path in (("GET", "/v1/responses/resp_x"), ("DELETE", "/v1/responses/resp_x"),
                         ("POST", "/v1/responses/resp_x/cancel")):
        check_error(httpx.request(method, f"{rserver.url}{path}"), 404, "'resp_x' not found")


def test_auto_tool_choice_needs_the_server_flags(server):
    err = check_error(post(server, "/v1/responses", {**BODY, "tools": TOOLS}), 400,
                      "--enable-auto-tool-choice")
    assert err["param"] == "tool_choice"


def test_reasoning_items(engine_client):
    """deepseek_r1 reads SmolLM2's unmarked output as reasoning (R1's template opens it): a
    reasoning item, streamed as reasoning_text events, equal to chat's reasoning."""
    app = build_app(engine_client, [MODEL], log_stats_interval=None,
                    reasoning_parser="deepseek_r1")
    with ServerThread(app) as s:
        client = s.openai_client()
        kw = {"model": MODEL, "input": "Why is the sky blue?", "max_output_tokens": 12,
              "temperature": 0}
        r = client.responses.create(**kw)
        (item,) = r.output
        assert item.type == "reasoning" and item.id.startswith("rs_")
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": kw["input"]}], max_tokens=12,
            temperature=0).choices[0].message
        assert item.content[0].text == chat.reasoning and not r.output_text
        assert 0 < r.usage.output_tokens_details.reasoning_tokens <= 14
        events = events_of(client, **kw)
        types = [e.type for e in events]
        assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
        assert types[-4:] == ["response.reasoning_text.done", "response.content_part.done",
                              "response.output_item.done", "response.completed"]
        text = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        assert text == events[-1].response.output[0].content[0].text == chat.reasoning
        # The reasoning item goes back as input of the next turn.
        again = client.responses.create(model=MODEL, max_output_tokens=4, input=[
            {"role": "user", "content": kw["input"]}, item.model_dump(exclude_none=True),
            {"role": "user", "content": "Shorter?"}])
        assert again.status in ("completed", "incomplete")
