"""Chat template rendering: sandbox, filters/globals, continue_final_message, errors."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from vllmx.tokenizer import ChatTemplateError, render_chat_template

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONV = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]


def _hf_render(template, messages, **kwargs):
    pytest.importorskip("transformers")
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

    # apply_chat_template normalizes (drops None-valued keys) before rendering
    messages = _normalize_chat_messages(messages)
    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template, **kwargs)
    return rendered[0]


def test_raise_exception_is_value_error():
    tpl = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user!') }}{% endif %}ok"
    assert render_chat_template(tpl, [{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ValueError, match="Conversation must start with user!") as ei:
        render_chat_template(tpl, [{"role": "system", "content": "x"}])
    assert isinstance(ei.value, ChatTemplateError)


def test_template_errors_are_value_errors():
    with pytest.raises(ValueError):
        render_chat_template("{% for m in messages %}", CONV)  # syntax error
    with pytest.raises(ValueError):
        render_chat_template("{{ messages[0]['content'].__class__.__mro__ }}", CONV)  # sandbox
    with pytest.raises(ValueError):
        render_chat_template("{% set ns = namespace(_x=1) %}", CONV)


def test_tojson_semantics_match_transformers():
    tools = [{"name": "get_weather", "description": "Météo — 天気 <b>&</b>", "parameters": {"b": 1, "a": [1, 2]}}]
    tpl = (
        "{{ tools | tojson }}|{{ tools | tojson(indent=2) }}|{{ tools[0] | tojson(separators=(',', ':')) }}"
        "|{{ tools[0]['parameters'] | tojson(sort_keys=true) }}"
    )
    mine = render_chat_template(tpl, CONV, tools=tools)
    assert mine.split("|")[0] == json.dumps(tools, ensure_ascii=False)
    assert "<b>&</b>" in mine and "天気" in mine  # no HTML escaping, no ascii escaping
    assert mine == _hf_render(tpl, CONV, tools=tools)


def test_strftime_now():
    out = render_chat_template("{{ strftime_now('%Y-%m-%d') }}", CONV)
    assert out == datetime.now().strftime("%Y-%m-%d")


def test_variables_and_kwargs():
    tpl = (
        "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
        "{% if documents %}{{ documents | length }}docs{% endif %}{% if enable_thinking %}T{% endif %}"
        "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}"
    )
    kwargs = dict(bos_token="<s>", eos_token="</s>", enable_thinking=True, documents=[{"title": "a", "text": "b"}])
    mine = render_chat_template(tpl, CONV, add_generation_prompt=True, **kwargs)
    assert mine == "<s>user:Hi;assistant:Hello there;1docsT></s>"
    assert mine == _hf_render(tpl, CONV, add_generation_prompt=True, **kwargs)


def test_trim_blocks_loopcontrols_and_dict():
    tpl = (
        "{% for m in messages %}\n"
        "    {% if loop.index > 1 %}{% break %}{% endif %}\n"
        "{{ m.content }}\n"
        "{% endfor %}\n"
        "{% set d = dict(a=1) %}{{ d.a }}"
    )
    mine = render_chat_template(tpl, CONV)
    assert mine == "Hi\n1"
    assert mine == _hf_render(tpl, CONV)


def test_generation_tag_is_transparent():
    tpl = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    assert render_chat_template(tpl, CONV) == "HiHello there"


def test_none_fields_dropped_and_reasoning_aliases():
    msgs = [{"role": "assistant", "content": "x", "tool_calls": None, "reasoning": "because"}]
    tpl = "{{ 'tool_calls' in messages[0] }}|{{ messages[0].reasoning_content }}|{{ messages[0].thinking }}"
    assert render_chat_template(tpl, msgs) == "False|because|because"
    assert render_chat_template(tpl, msgs) == _hf_render(tpl, msgs)


@pytest.mark.parametrize(
    "conv",
    [
        CONV,
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Trailing space "}],
        [{"role": "user", "content": [{"type": "text", "text": "multi"}, {"type": "text", "text": "part"}]}],
    ],
)
def test_continue_final_message(conv):
    tpl = (
        "{% for m in messages %}<{{ m.role }}>"
        "{% if m.content is string %}{{ m.content | trim }}{% else %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endif %}"
        "</{{ m.role }}>{% endfor %}"
    )
    mine = render_chat_template(tpl, conv, continue_final_message=True)
    assert mine == _hf_render(tpl, conv, continue_final_message=True)
    last = conv[-1]["content"]
    last = last if isinstance(last, str) else last[-1]["text"]
    assert mine.endswith(last.strip())
    assert not mine.endswith(f"</{conv[-1]['role']}>")


def test_continue_final_message_chatml():
    mine = render_chat_template(CHATML, CONV, continue_final_message=True)
    assert mine.endswith("<|im_start|>assistant\nHello there")
    assert mine == _hf_render(CHATML, CONV, continue_final_message=True)
    with pytest.raises(ValueError):
        render_chat_template(CHATML, CONV, continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(ValueError):
        render_chat_template("{{ messages | length }}", CONV, continue_final_message=True)


def test_tokenizer_apply_chat_template_errors(smollm_vllmx):
    from vllmx.tokenizer import Tokenizer

    t = Tokenizer(smollm_vllmx.backend_tokenizer, chat_template=None)
    with pytest.raises(ValueError, match="chat template"):
        t.apply_chat_template([{"role": "user", "content": "x"}])
    assert t.apply_chat_template([{"role": "user", "content": "x"}], chat_template="{{ messages[0].content }}",
                                 tokenize=False) == "x"
    with pytest.raises(ValueError):
        smollm_vllmx.apply_chat_template([])
