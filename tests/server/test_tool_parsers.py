"""Every tool and reasoning parser on outputs in its model family's exact format: the message
read whole, the same output streamed with a chunk boundary at every character (one character
a step, and two chunks split at each position) adding up to that message, and malformed or
cut-off outputs coming back as content without a crash."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vllmx.reasoning import REASONING_PARSERS, get_reasoning_parser
from vllmx.server.chat_output import ChatOutputParser, ChatStreamState
from vllmx.server.tool_choice import ToolPlan
from vllmx.server.tool_parsers import TOOL_PARSERS, get_tool_parser

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"},
                                         "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"guests": {"type": "array"},
                                         "opts": {"type": "object"}}}}},
]
REQUEST = SimpleNamespace(tools=TOOLS)
PARIS = ("get_weather", {"city": "Paris", "unit": "celsius"})
CET = ("get_time", {"zone": "CET"})

# (tool parser, reasoning parser, model output, reasoning, content, calls)
CASES = [
    ("hermes", None, ('I\'ll check both.\n<tool_call>\n{"name": "get_weather", "arguments": '
     '{"city": "Paris", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
     '"arguments": {"zone": "CET"}}\n</tool_call>'), None, "I'll check both.\n", [PARIS, CET]),
    ("hermes", "qwen3", ('<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n'
     '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
     '</tool_call>'), "\nThe user wants the weather.\n", "\n\n", [PARIS]),
    ("hermes", None, "Paris is sunny today.", None, "Paris is sunny today.", []),
    ("llama3_json", None, ('{"name": "get_weather", "parameters": {"city": "Paris", "unit": '
     '"celsius"}}; {"name": "get_time", "parameters": {"zone": "CET"}}'), None, "",
     [PARIS, CET]),
    ("llama3_json", None, '<|python_tag|>{"name": "get_time", "parameters": {"zone": "CET"}}',
     None, "", [CET]),
    ("llama3_json", None, "It is {sunny} in Paris.", None, "It is {sunny} in Paris.", []),
    ("llama4_json", None, '{"name": "get_time", "parameters": {"zone": "CET"}}', None, "",
     [CET]),
    ("llama4_pythonic", None, "<|python_start|>[get_time(zone='CET')]<|python_end|>", None,
     "", [CET]),
    ("seed_oss", "seed_oss", ("<seed:think>The user wants the weather.</seed:think>"
     "<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</seed:tool_call>"),
     "The user wants the weather.", "", [PARIS]),
    ("mistral", None, ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", '
     '"unit": "celsius"}}, {"name": "get_time", "arguments": {"zone": "CET"}}]'), None, "",
     [PARIS, CET]),
    ("mistral", None, ('Let me look.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": '
     '"celsius"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}'), None, "Let me look.",
     [PARIS, CET]),
    ("mistral", "mistral", ('[THINK]Weather needs a tool.[/THINK][TOOL_CALLS]get_time[ARGS]'
     '{"zone": "CET"}'), "Weather needs a tool.", "", [CET]),
    ("pythonic", None, "[get_weather(city='Paris', unit='celsius'), get_time(zone=\"CET\")]",
     None, "", [PARIS, CET]),
    ("pythonic", None, ("<|python_start|>[book(guests=['Ann', 'Bo'], opts={'late': True})]"
     "<|python_end|>"), None, "", [("book", {"guests": ["Ann", "Bo"], "opts": {"late": True}})]),
    ("qwen3_coder", None, ("Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
     "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
     None, "Checking.\n", [("get_weather", {"city": "Paris", "days": 3})]),
    ("qwen3_xml", "qwen3", ("<think>\nhm\n</think>\n\n<tool_call>\n<function=get_time>\n"
     "<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
     "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\n"
     "celsius\n</parameter>\n</function>\n</tool_call>"), "\nhm\n", "\n\n", [CET, PARIS]),
    ("deepseek_v3", "deepseek_r1", ("Weather first.\n</think>\n\nChecking.<｜tool▁calls▁begin｜>"
     "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", "
     "\"unit\": \"celsius\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
     "get_time\n```json\n{\"zone\": \"CET\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
     "Weather first.\n", "\n\nChecking.", [PARIS, CET]),
    ("deepseek_v31", None, ("Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
     "<｜tool▁sep｜>{\"city\": \"Paris\", \"unit\": \"celsius\"}<｜tool▁call▁end｜>"
     "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"CET\"}<｜tool▁call▁end｜>"
     "<｜tool▁calls▁end｜>"), None, "Checking.", [PARIS, CET]),
    ("glm45", "glm45", ("<think>The user asks about Paris.</think>\nI will check.\n<tool_call>"
     "get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days"
     "</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"), "The user asks about Paris.",
     "\nI will check.\n", [("get_weather", {"city": "Paris", "days": 3})]),
    ("kimi_k2", None, ("Sure.<|tool_calls_section_begin|><|tool_call_begin|>"
     "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"unit\": "
     "\"celsius\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1"
     "<|tool_call_argument_begin|>{\"zone\": \"CET\"}<|tool_call_end|>"
     "<|tool_calls_section_end|>"), None, "Sure.", [PARIS, CET]),
    ("granite", None, ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", '
     '"unit": "celsius"}}, {"name": "get_time", "arguments": {"zone": "CET"}}]'), None, "",
     [PARIS, CET]),
    ("granite", "granite", ('Here is my thought process: a tool. Here is my response: '
     '<tool_call>[{"name": "get_time", "arguments": {"zone": "CET"}}]'), " a tool. ", "",
     [CET]),
    ("internlm", None, ('Let me check.<|action_start|><|plugin|>\n{"name": "get_weather", '
     '"parameters": {"city": "Paris", "unit": "celsius"}}<|action_end|>'), None,
     "Let me check.", [PARIS]),
    ("minimax_m2", "minimax_m2", ('The user asks for weather.\n</think>\n\n<minimax:tool_call>\n'
     '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n<parameter '
     'name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="zone">'
     'CET</parameter>\n</invoke>\n</minimax:tool_call>'), "The user asks for weather.\n", "\n\n",
     [("get_weather", {"city": "Paris", "days": 3}), CET]),
    ("functiongemma", None, ("<start_function_call>call:get_weather{city:<escape>Paris<escape>,"
     "unit:<escape>celsius<escape>}<end_function_call><start_function_call>call:book{guests:"
     "[<escape>Ann, Jr.<escape>,<escape>Bo<escape>],opts:{late:true,n:2}}<end_function_call>"),
     None, "", [PARIS, ("book", {"guests": ["Ann, Jr.", "Bo"], "opts": {"late": True, "n": 2}})]),
    ("openai", "openai_gptoss", ("<|channel|>analysis<|message|>Need the weather tool.<|end|>"
     "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
     "<|message|>{\"city\":\"Paris\",\"unit\":\"celsius\"}<|call|>"), "Need the weather tool.",
     "", [PARIS]),
    ("openai", "openai_gptoss", ("<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant"
     "<|channel|>final<|message|>Hello there!"), "Simple.", "Hello there!", []),
]


def reader(tool_parser, reasoning_parser, prompt=""):
    plan = ToolPlan("auto", TOOLS) if tool_parser else ToolPlan("none", None)
    return ChatOutputParser(plan, get_tool_parser(tool_parser)() if tool_parser else None,
                            get_reasoning_parser(reasoning_parser)() if reasoning_parser
                            else None, REQUEST, prompt)


def stream(r: ChatOutputParser, chunks: list[str]) -> tuple[str, str, list]:
    state, reasoning, content, calls = ChatStreamState(r), "", "", {}
    for k, chunk in enumerate(chunks):
        for delta in state.step(chunk, final=k == len(chunks) - 1):
            reasoning += delta.get("reasoning", "")
            content += delta.get("content", "")
            for tc in delta.get("tool_calls", []):
                if "id" in tc:  # the first delta of a call: its name alone
                    assert tc["index"] == len(calls) and tc["function"]["arguments"] == ""
                    calls[tc["index"]] = [tc["id"], tc["function"]["name"], ""]
                else:
                    calls[tc["index"]][2] += tc["function"]["arguments"]
    return reasoning, content, [calls[i] for i in sorted(calls)]


def test_every_parser_has_a_recorded_case():
    assert {c[0] for c in CASES} == set(TOOL_PARSERS)
    assert {c[1] for c in CASES} - {None} == set(REASONING_PARSERS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_parse_whole(case):
    tp, rp, text, reasoning, content, calls = case
    msg = reader(tp, rp).message(text)
    assert msg["reasoning"] == reasoning
    assert (msg["content"] or "") == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg.get("tool_calls", [])] == calls
    assert len({c["id"] for c in msg.get("tool_calls", [])}) == len(calls)
    if tp == "kimi_k2":
        assert [c["id"] for c in msg.get("tool_calls", [])] == ["functions.get_weather:0",
                                                         "functions.get_time:1"]
    if tp == "mistral":
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in msg.get("tool_calls", []))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_streamed_deltas_add_up_at_every_boundary(case):
    tp, rp, text, *_ = case
    r = reader(tp, rp)
    msg = r.message(text)
    want = (msg["reasoning"] or "", msg["content"] or "",
            [(c["function"]["name"], c["function"]["arguments"])
             for c in msg.get("tool_calls", [])])
    splits = [list(text)] + [[text[:k], text[k:]] for k in range(len(text) + 1)]
    for chunks in splits:
        reasoning, content, calls = stream(r, chunks)
        assert (reasoning, content, [(n, a) for _, n, a in calls]) == want, chunks


MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),
    ("hermes", "<tool_call>\n[1, 2]\n</tool_call> and more"),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": '),
    ("llama3_json", '{"name": "get_time", "parameters": {}} trailing words'),
    ("mistral", "[TOOL_CALLS]not json at all"),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "CET"}'),
    ("pythonic", "[get_weather(city=Paris)]"),
    ("pythonic", "[get_weather(city='Paris'"),
    ("qwen3_coder", "<tool_call>\nno function here\n</tool_call>"),
    ("qwen3_xml", "<tool_call>\n<function=get_time>\n<parameter=zone>\nCE"),
    ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>garbage<｜tool▁call▁end｜>"),
    ("deepseek_v31", "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\"<｜tool▁call▁end｜>"),
    ("glm45", "<tool_call></tool_call>"),
    ("kimi_k2", ("<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1]"
                "<|tool_call_end|>")),
    ("granite", "<|tool_call|>[{\"name\": 3}]"),
    ("internlm", "<|action_start|><|plugin|>\nnot json<|action_end|>"),
    ("minimax_m2", "<minimax:tool_call>\n<invoke>\n</minimax:tool_call>"),
    ("functiongemma", "<start_function_call>call:f{x:<escape>open}<end_function_call>"),
    ("openai", ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json"
               "<|call|>")),
]


@pytest.mark.parametrize("tp,text", MALFORMED)
def test_malformed_output_is_content(tp, text):
    r = reader(tp, None)
    msg = r.message(text)
    assert "tool_calls" not in msg  # (vLLM leaves the key out when there are none)
    assert msg["content"] and msg["content"].strip()
    for chunks in [list(text)] + [[text[:k], text[k:]] for k in range(len(text) + 1)]:
        stream(r, chunks)  # no crash, whatever it could send before the text went wrong


@pytest.mark.parametrize("rp,prompt,text,reasoning,content", [
    ("deepseek_r1", "<｜Assistant｜><think>\n", "Let me think.\n</think>\n\nParis.",
     "Let me think.\n", "\n\nParis."),
    ("deepseek_r1", "", "<think>Cut off while thinking", "Cut off while thinking", ""),
    ("qwen3", "<|im_start|>assistant\n", "<think>\nhmm\n</think>\n\nParis.", "\nhmm\n",
     "\n\nParis."),
    ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", "Paris.", None, "Paris."),
    ("qwen3", "<|im_start|>assistant\n<think>\n", "hmm\n</think>\n\nParis.", "hmm\n",
     "\n\nParis."),
    ("glm45", "<|assistant|>", "<think>a</think>b", "a", "b"),
    ("minimax_m2", "", "a</think>b", "a", "b"),
    ("mistral", "", "[THINK]a[/THINK]b", "a", "b"),
    ("mistral", "", "No thinking here.", None, "No thinking here."),
    ("granite", "", "Here's my thought process: a. Here's my response: b.", " a. ", " b."),
    ("granite", "", "Just an answer.", None, "Just an answer."),
    ("openai_gptoss", "", "<|channel|>final<|message|>Hi.<|return|>", None, "Hi."),
])
def test_reasoning_parsers(rp, prompt, text, reasoning, content):
    r = reader(None, rp, prompt)
    msg = r.message(text)
    assert (msg["reasoning"], msg["content"]) == (reasoning, content)
    for chunks in [list(text)] + [[text[:k], text[k:]] for k in range(len(text) + 1)]:
        got = stream(r, chunks)
        assert got[:2] == (reasoning or "", content), chunks


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="choose from deepseek_v3, deepseek_v31"):
        get_tool_parser("hermes2")
    with pytest.raises(ValueError, match="choose from deepseek_r1, glm45"):
        get_reasoning_parser("r1")
