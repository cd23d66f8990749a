"""Structured outputs over HTTP: response_format (json_schema, json_object), vLLM's
structured_outputs object (json, regex, choice, grammar) and the older guided_* fields, in chat
and completions, streamed and not; every answer valid; bad constraints are 400s in OpenAI's
shape naming the problem; the official client's parse() helpers with a pydantic model."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema_rs
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.conftest import MODEL
from tests.server.test_errors import check_error, post
from tests.structured_output.schemas import PERSON, PRODUCT, PROMPTS, SEGMENT

USER = [{"role": "user", "content": PROMPTS["person"]}]


def json_schema_format(schema: dict, name: str = "answer") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                   "strict": True}}


def valid(schema: dict, text: str) -> bool:
    return jsonschema_rs.validator_for(schema).is_valid(json.loads(text))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name,schema", [("person", PERSON), ("product", PRODUCT),
                                         ("segment", SEGMENT)])
def test_chat_json_schema(client, name, schema, stream):
    for temperature, seed in ((0.0, None), (0.8, 7)):
        kw = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[name]}],
              "temperature": temperature, "seed": seed, "max_tokens": 250,
              "response_format": json_schema_format(schema)}
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kw))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            choice = client.chat.completions.create(**kw).choices[0]
            text, finish = choice.message.content, choice.finish_reason
        assert finish == "stop" and valid(schema, text), text


def test_stream_equals_full_under_a_schema(client):
    kw = {"model": MODEL, "messages": USER, "temperature": 0, "max_tokens": 250,
          "response_format": json_schema_format(PERSON)}
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = client.chat.completions.create(stream=True, **kw)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full


def test_chat_json_object_and_structured_outputs_fields(client):
    out = client.chat.completions.create(
        model=MODEL, messages=USER, temperature=0, max_tokens=200,
        response_format={"type": "json_object"})
    assert isinstance(json.loads(out.choices[0].message.content), dict)
    for so, check in (
            ({"choice": ["Paris", "London", "Rome"]}, lambda t: t in ("Paris", "London", "Rome")),
            ({"regex": r"[A-Z][a-z]{2,9}, [0-9]{4}"},
             lambda t: re.fullmatch(r"[A-Z][a-z]{2,9}, [0-9]{4}", t)),
            ({"grammar": 'start: "The capital is " CITY "."\nCITY: "Paris" | "Lyon"'},
             lambda t: t in ("The capital is Paris.", "The capital is Lyon."))):
        for stream in (False, True):
            kw = {"model": MODEL, "temperature": 0.7, "seed": 3, "max_tokens": 40,
                  "messages": [{"role": "user", "content": "The capital of France?"}],
                  "extra_body": {"structured_outputs": so}}
            if stream:
                text = "".join(c.choices[0].delta.content or ""
                               for c in client.chat.completions.create(stream=True, **kw)
                               if c.choices)
            else:
                text = client.chat.completions.create(**kw).choices[0].message.content
            assert check(text), (so, text)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_constrained(client, stream):
    cases = [
        ({"response_format": json_schema_format(SEGMENT)}, lambda t: valid(SEGMENT, t)),
        ({"structured_outputs": {"json": json.dumps(PRODUCT), "disable_any_whitespace": True}},
         lambda t: valid(PRODUCT, t) and "\n" not in t),
        ({"guided_regex": r"\d{3}-\d{4}"}, lambda t: re.fullmatch(r"\d{3}-\d{4}", t)),
        ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
        ({"structured_outputs": {"grammar": 'root ::= "A" [0-9] [0-9]'}},
         lambda t: re.fullmatch(r"A\d\d", t)),
    ]
    for extra, check in cases:
        kw = {"model": MODEL, "prompt": PROMPTS["segment"], "temperature": 0.8, "seed": 11,
              "max_tokens": 250, "n": 2, "extra_body": extra}
        if stream:
            texts = ["", ""]
            for c in client.completions.create(stream=True, **kw):
                for ch in c.choices:
                    texts[ch.index] += ch.text
        else:
            texts = [c.text for c in client.completions.create(**kw).choices]
        assert all(check(t) for t in texts), (extra, texts)


class Address(BaseModel):
    city: str = Field(max_length=20)
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)
    role: Literal["engineer", "doctor", "artist"]
    address: Address


@pytest.mark.parametrize("api", ["chat", "beta"])
def test_openai_parse_with_a_pydantic_model(client, api):
    """The client sends Person's strict JSON schema and parses the answer into a Person."""
    completions = client.chat.completions if api == "chat" else client.beta.chat.completions
    out = completions.parse(model=MODEL, messages=USER, response_format=Person,
                            temperature=0, max_tokens=250)
    person = out.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)
    assert person.role in ("engineer", "doctor", "artist") and 0 <= person.age <= 120
    assert Person.model_validate_json(out.choices[0].message.content) == person


@pytest.mark.parametrize("extra,words", [
    ({"response_format": json_schema_format({"type": "object", "properties": {
        "a": {"$ref": "#/$defs/missing"}}})}, ["Invalid JSON schema", "/$defs/missing"]),
    ({"response_format": json_schema_format({"type": "integr"})}, ["Invalid JSON schema",
                                                                   "integr"]),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     ["json_schema.schema"]),
    ({"structured_outputs": {"json": "{not json"}}, ["Invalid JSON schema", "not valid JSON"]),
    ({"structured_outputs": {"regex": "[a-"}}, ["Invalid regex", "unclosed character class"]),
    ({"structured_outputs": {"grammar": "start: undefined_rule"}},
     ["Invalid grammar", "undefined_rule"]),
    ({"structured_outputs": {"choice": []}}, ["choice must be a non-empty list"]),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, ["only use one kind"]),
    ({"structured_outputs": {"pattern": "a"}}, ["unknown field", "pattern"]),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     ["one structured output constraint", "response_format", "structured_outputs"]),
    ({"structured_outputs": {"structural_tag": json.dumps({"triggers": ["<f"], "structures": [
        {"begin": "<g>", "schema": {}, "end": "</g>"}]})}}, ["starts with none of the triggers"]),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_constraints_are_400s(server, client, extra, words, path):
    body = {"model": MODEL, "max_tokens": 5, **extra}
    body.update({"messages": USER} if "chat" in path else {"prompt": "Hi"})
    check_error(post(server, path, body), 400, *words)
    body["stream"] = True  # refused before the stream starts
    check_error(post(server, path, body), 400, *words)
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)  # still serving
    assert out.choices[0].text is not None


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError, match="Invalid regex"):
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=5,
                                       extra_body={"structured_outputs": {"regex": "(a"}})
