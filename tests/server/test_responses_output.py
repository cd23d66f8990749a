"""Responses output items and streaming events over every recorded tool / reasoning parser
output (tests/server/test_tool_parsers.py's cases): streamed with chunk boundaries at every
character or whole, the events come in vLLM's order, numbered, each item opened, grown and
closed, and the items they close equal the unstreamed items of the same output."""

from __future__ import annotations

import json

import pytest

from tests.server.test_tool_parsers import CASES, reader
from vllmx.server.chat_output import ChatStreamState
from vllmx.server.responses_output import ResponseEventStream, output_items

_DELTAS = {"reasoning": "response.reasoning_text.delta", "message": "response.output_text.delta",
           "function_call": "response.function_call_arguments.delta"}
_DONE = {"reasoning": ["response.reasoning_text.done", "response.content_part.done"],
         "message": ["response.output_text.done", "response.content_part.done"],
         "function_call": ["response.function_call_arguments.done"]}


def events(r, chunks: list[str]) -> tuple[list[dict], list[dict]]:
    state, stream, out = ChatStreamState(r), ResponseEventStream(), []
    for k, chunk in enumerate(chunks):
        out += stream.step(state.step(chunk, final=k == len(chunks) - 1), None)
    out += stream.finish("completed")
    return [json.loads(e.split("data: ", 1)[1]) for e in out], stream.output


def check_order(evs: list[dict]) -> None:
    """Each item: added, (its part added), deltas, its done events, output_item.done."""
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    i, index = 0, 0
    while i < len(evs):
        added = evs[i]
        assert added["type"] == "response.output_item.added", added
        assert added["output_index"] == index
        kind, item_id = added["item"]["type"], added["item"]["id"]
        i += 1
        if kind != "function_call":
            assert evs[i]["type"] == "response.content_part.added"
            i += 1
        grown = ""
        while evs[i]["type"] == _DELTAS[kind]:
            assert evs[i]["item_id"] == item_id and evs[i]["output_index"] == index
            grown += evs[i]["delta"]
            i += 1
        for kind_done in _DONE[kind]:
            assert evs[i]["type"] == kind_done and evs[i]["item_id"] == item_id
            i += 1
        done = evs[i]
        assert done["type"] == "response.output_item.done" and done["item"]["id"] == item_id
        item = done["item"]
        whole = item["arguments"] if kind == "function_call" else item["content"][0]["text"]
        assert grown == whole
        i, index = i + 1, index + 1


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_stream_items_equal_whole_items(case):
    tp, rp, text, reasoning, _, calls = case
    r = reader(tp, rp)
    whole = output_items(r.message(text), None, "completed")
    assert [i["type"] for i in whole if i["type"] == "function_call"] == \
        ["function_call"] * len(calls)
    assert any(i["type"] == "reasoning" for i in whole) == bool(reasoning)
    for chunks in (list(text), [text]):
        evs, items = events(r, chunks)
        check_order(evs)
        assert without_ids(items) == without_ids(whole), chunks
        assert [e["item"] for e in evs if e["type"] == "response.output_item.done"] == items


def test_whitespace_alone_is_the_answer():
    r = reader("hermes", None)
    evs, items = events(r, ["\n", " "])
    check_order(evs)
    assert without_ids(items) == without_ids(output_items(r.message("\n "), None, "completed"))
    assert items[0]["content"][0]["text"] == "\n "


def test_incomplete_message_status():
    _, items = events(reader(None, None), ["Hello"])
    stream = ResponseEventStream()
    stream.step([{"content": "Hi"}], [{"token": "Hi", "logprob": -0.5}])
    done = [json.loads(e.split("data: ", 1)[1]) for e in stream.finish("incomplete")]
    assert done[-1]["item"]["status"] == "incomplete"
    assert done[0]["logprobs"] == [{"token": "Hi", "logprob": -0.5}]
    assert items[0]["status"] == "completed"
