"""Tool calling and reasoning through the server on SmolLM2 with the official openai client:
tool_choice required / named forced by structured outputs give valid calls, streamed and not;
auto parses the model's hermes-format output (the output steered there by a regex, as SmolLM2
does not call tools by itself); a reasoning parser splits off `reasoning`; bad tools and
tool_choice values are 400s in OpenAI's shape."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema_rs
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.conftest import MODEL, ServerThread
from tests.server.test_errors import check_error, post
from vllmx.server.app import build_app

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string",
                                                             "maxLength": 20}},
                   "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_server(engine_client):
    app = build_app(engine_client, [MODEL], log_stats_interval=None,
                    enable_auto_tool_choice=True, tool_call_parser="hermes",
                    reasoning_parser="deepseek_r1")
    with ServerThread(app) as s:
        yield s


@pytest.fixture(scope="module")
def tool_client(tool_server) -> openai.OpenAI:
    return tool_server.openai_client()


def streamed(client, **kw):
    """(reasoning, content, calls, finish_reason) put together from a stream's deltas."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        delta = ch.delta
        reasoning += getattr(delta, "reasoning", None) or ""
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function.name, tc
                assert not tc.function.arguments  # the name comes first, alone
                calls[tc.index] = [tc.id, tc.function.name, ""]
            else:
                assert tc.function.name is None and tc.id is None
                calls[tc.index][2] += tc.function.arguments or ""
        finish = ch.finish_reason or finish
    return reasoning, content, [calls[i] for i in sorted(calls)], finish


def answer(client, stream: bool, **kw):
    """(content, [(name, arguments)], finish_reason) of one choice, streamed or not (each
    call's id checked: vLLM's chatcmpl-tool-...)."""
    if stream:
        _, content, calls, finish = streamed(client, **kw)
        return content, [(n, a) for _, n, a in calls], finish
    choice = client.chat.completions.create(**kw).choices[0]
    calls = choice.message.tool_calls or []
    assert all(c.id.startswith("chatcmpl-tool-") for c in calls)
    return (choice.message.content, [(c.function.name, c.function.arguments) for c in calls],
            choice.finish_reason)


def check_calls(calls, names=None):
    assert calls
    for name, arguments in calls:
        assert name in SCHEMAS and (names is None or name in names)
        assert jsonschema_rs.validator_for(SCHEMAS[name]).is_valid(json.loads(arguments)), \
            arguments


@pytest.mark.parametrize("stream", [False, True])
def test_required_gives_valid_calls(tool_client, stream):
    for temperature, seed in ((0.0, None), (0.9, 1), (0.9, 2)):
        content, calls, finish = answer(
            tool_client, stream, model=MODEL, messages=USER, tools=TOOLS,
            tool_choice="required", temperature=temperature, seed=seed, max_tokens=200)
        assert finish == "tool_calls" and content == ""  # vLLM's: "", not null
        check_calls(calls)


class GetWeather(BaseModel):
    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=7)


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "GetWeather"}}])
def test_openai_parse_with_a_pydantic_tool(tool_client, choice):
    """The client's pydantic_function_tool (strict schema) and parse(): the forced call's
    arguments come back parsed into the model."""
    out = tool_client.chat.completions.parse(
        model=MODEL, messages=USER, tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice=choice, temperature=0, max_tokens=200)
    calls = out.choices[0].message.tool_calls
    assert calls and all(isinstance(c.function.parsed_arguments, GetWeather) for c in calls)
    assert GetWeather.model_validate_json(calls[0].function.arguments) == \
        calls[0].function.parsed_arguments


@pytest.mark.parametrize("stream", [False, True])
def test_required_with_several_choices(tool_client, stream):
    # One call a choice (parallel_tool_calls off): sampled at temperature 1, a choice free to
    # list calls may go on listing them past max_tokens, and a cut-off list is no call at all.
    kw = {"model": MODEL, "messages": USER, "tools": TOOLS, "tool_choice": "required",
          "parallel_tool_calls": False, "n": 3, "temperature": 1.0, "seed": 5, "max_tokens": 200}
    if stream:
        calls: dict = {}
        for chunk in tool_client.chat.completions.create(stream=True, **kw):
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    got = calls.setdefault(ch.index, {}).setdefault(tc.index, ["", ""])
                    got[0] += tc.function.name or ""
                    got[1] += tc.function.arguments or ""
        per_choice = [list(calls[i].values()) for i in sorted(calls)]
    else:
        out = tool_client.chat.completions.create(**kw)
        per_choice = [[(c.function.name, c.function.arguments) for c in ch.message.tool_calls]
                      for ch in out.choices]
    assert len(per_choice) == 3
    for calls_of_choice in per_choice:
        check_calls(calls_of_choice)


def test_required_without_parallel_calls_gives_one(tool_client):
    for seed in range(3):
        choice = tool_client.chat.completions.create(
            model=MODEL, messages=USER, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=200).choices[0]
        assert len(choice.message.tool_calls) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_named_function(tool_client, stream):
    content, calls, finish = answer(
        tool_client, stream, model=MODEL, messages=USER, tools=TOOLS, max_tokens=200,
        temperature=0, tool_choice={"type": "function", "function": {"name": "get_time"}})
    # OpenAI's finish for a named call; vLLM's content beside it: "", not null (streamed: no
    # content delta past the role chunk's "")
    assert finish == "stop" and content == "" and len(calls) == 1
    check_calls(calls, names={"get_time"})


def test_stream_equals_full(tool_client):
    kw = {"model": MODEL, "messages": USER, "tools": TOOLS, "tool_choice": "required",
          "temperature": 0, "max_tokens": 200}
    full = tool_client.chat.completions.create(**kw).choices[0].message.tool_calls
    _, _, calls, _ = streamed(tool_client, **kw)
    assert [(n, a) for _, n, a in calls] == [(c.function.name, c.function.arguments)
                                             for c in full]


HERMES_REGEX = (r'<think>[a-z ]{1,30}</think>I will check\.\n<tool_call>\n\{"name": "get_weather", '
                r'"arguments": \{"city": "(Paris|Lyon)", "unit": "celsius"\}\}\n</tool_call>')


@pytest.mark.parametrize("stream", [False, True])
def test_auto_parses_hermes_calls_and_reasoning(tool_client, stream):
    kw = {"model": MODEL, "messages": USER, "tools": TOOLS, "temperature": 0,
          "max_tokens": 120, "extra_body": {"structured_outputs": {"regex": HERMES_REGEX}}}
    if stream:
        reasoning, content, calls, finish = streamed(tool_client, **kw)
        calls = [(n, a) for _, n, a in calls]
    else:
        m = tool_client.chat.completions.create(**kw).choices[0]
        finish, msg = m.finish_reason, m.message
        reasoning, content = msg.reasoning, msg.content
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    assert finish == "tool_calls"
    assert reasoning and "think" not in reasoning
    assert content == "I will check.\n"
    assert len(calls) == 1 and calls[0][0] == "get_weather"
    assert json.loads(calls[0][1])["unit"] == "celsius"


def test_tool_choice_none_gives_text(tool_client):
    m = tool_client.chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, tool_choice="none", max_tokens=8,
        temperature=0).choices[0]
    assert m.message.tool_calls in (None, []) and m.finish_reason in ("stop", "length")


def test_earlier_tool_calls_in_the_conversation(tool_client):
    """An assistant's call (arguments as JSON text) and the tool's answer reach the template."""
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    out = tool_client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                              tool_choice="none", max_tokens=4)
    assert out.choices[0].finish_reason in ("stop", "length")


CHAT = {"model": MODEL, "messages": USER, "max_tokens": 4}


@pytest.mark.parametrize("body,param,words", [
    ({"tools": []}, "tools", ["must not be an empty array"]),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", ["'function'"]),
    ({"tools": [{"type": "function"}]}, "tools[0].function", ["name"]),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name",
     ["non-empty"]),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", ["twice"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
     "tools[0].function.parameters", ["JSON schema object"]),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", ["Tool 'nope' has not been passed in `tools`."]),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice",
     ["Invalid value for `tool_choice`"]),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", ["Only named tools"]),
    ({"tool_choice": "required"}, "tool_choice", ["`tools` must be set"]),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", ["not both"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}],
      "tool_choice": "required"}, None, ["nonsense"]),
])
def test_bad_tools_are_400s(tool_server, body, param, words):
    err = check_error(post(tool_server, "/v1/chat/completions", {**CHAT, **body}), 400, *words)
    if param is not None:
        assert err["param"] == param


def test_auto_needs_the_server_flags(server):
    check_error(post(server, "/v1/chat/completions", {**CHAT, "tools": TOOLS}), 400,
                "--enable-auto-tool-choice")


def test_unknown_parser_names_are_start_up_errors(engine_client):
    with pytest.raises(ValueError, match="hermes.*llama3_json"):
        build_app(engine_client, [MODEL], tool_call_parser="nope", log_stats_interval=None)
    with pytest.raises(ValueError, match="deepseek_r1"):
        build_app(engine_client, [MODEL], reasoning_parser="nope", log_stats_interval=None)
    with pytest.raises(ValueError, match="requires --tool-call-parser"):
        build_app(engine_client, [MODEL], enable_auto_tool_choice=True,
                  log_stats_interval=None)


@pytest.mark.parametrize("flags,words", [
    (["--tool-call-parser", "nope"], "invalid tool call parser: 'nope' (choose from"),
    (["--reasoning-parser", "nope"], "invalid reasoning parser: 'nope' (choose from"),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
])
def test_serve_refuses_bad_parser_flags_before_loading(flags, words):
    from tests.server.test_cli_serve import _run

    proc = _run("--port", "1", *flags)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and words in out, out


# Renders each tool's name and its JSON as transformers' templates do (tools | tojson).
TOOL_TEMPLATE = ("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
                 "</tools>{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                 "{% if m.tool_calls %}{% for c in m.tool_calls %}<call>"
                 "{{ c.function.arguments | tojson }}</call>{% endfor %}{% endif %}"
                 "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


def test_tools_reach_the_chat_template(engine_client):
    app = build_app(engine_client, [MODEL], log_stats_interval=None,
                    chat_template=TOOL_TEMPLATE)
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}]
    with ServerThread(app) as s:
        r = post(s, "/tokenize", {"model": MODEL, "messages": messages, "tools": [WEATHER]})
        text = post(s, "/detokenize", {"model": MODEL, "tokens": r.json()["tokens"]}).json()
    want = (f"<tools>{json.dumps(WEATHER, ensure_ascii=False)}\n</tools><user>"
            f"{USER[0]['content']}<assistant><call>{{\"city\": \"Paris\"}}</call><assistant>")
    assert text["prompt"] == want  # arguments as a mapping, as vLLM hands them to templates
