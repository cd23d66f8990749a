"""Chat template rendering, compatible with transformers' `apply_chat_template`.

Templates come from model repositories and are untrusted: they run in jinja2's
`ImmutableSandboxedEnvironment` with the same options, filters and globals that
transformers provides (`tojson`, `raise_exception`, `strftime_now`, a restricted
`dict` and `namespace`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplateError", "compile_chat_template", "render_chat_template", "select_chat_template"]


class ChatTemplateError(ValueError):
    """A chat template failed to render (including `raise_exception(...)` in the template)."""


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationTag(jinja2.ext.Extension):
    """Accept `{% generation %}...{% endgeneration %}` blocks (rendered transparently)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message):
    raise ChatTemplateError(str(message))


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Unlike jinja's builtin, no HTML escaping; exposes json.dumps' options.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):  # noqa: N805 - same signature trick as jinja's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}."
            )


@lru_cache(maxsize=64)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile (cached) a chat template in the sandboxed environment."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"Invalid chat template: {e}") from e


def _plain(value: Any) -> Any:
    """Rebuild template inputs from plain JSON-like types (rich objects become inert placeholders)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return _plain(value.item())  # numpy scalars
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _normalize_messages(messages) -> list[dict]:
    messages = _plain(getattr(messages, "messages", messages))
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise TypeError(f"Chat messages should be dicts, but got {message!r}.")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def select_chat_template(
    own: str | dict[str, str] | None, chat_template: str | None = None, tools: list | None = None
) -> str:
    """Pick the template to use, like transformers' `get_chat_template`: `own` may be a dict of
    named templates, `chat_template` a template string or the name of one of them."""
    if isinstance(own, dict):
        if chat_template is not None and chat_template in own:
            return own[chat_template]
        if chat_template is None:
            if tools is not None and "tool_use" in own:
                return own["tool_use"]
            if "default" in own:
                return own["default"]
            raise ValueError(
                "This model has multiple chat templates with no default specified! Pass a chat template or the "
                f"name of one: {sorted(own)}."
            )
        return chat_template
    if chat_template is not None:
        return chat_template
    if own is None:
        raise ValueError("Cannot apply a chat template: the tokenizer has none and no chat_template was passed.")
    return own


def render_chat_template(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    **kwargs: Any,
) -> str:
    """Render one conversation with `template`, as transformers' `render_jinja_template` does.

    `kwargs` (e.g. `bos_token`, `eos_token`, `enable_thinking`) become template variables.
    With `continue_final_message`, the text is cut right after the final message's content so
    that the model continues it (it may name the field to continue, default "content").
    Any template error is raised as :class:`ChatTemplateError` (a `ValueError`).
    """
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
    compiled = compile_chat_template(template)
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, dict):
                raise ValueError("Tools should be JSON schemas (dicts).")
    if documents is not None:
        for document in documents:
            if not isinstance(document, dict):
                raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    tools = _plain(tools)
    documents = _plain(documents)
    kwargs = _plain(kwargs)
    chat = _normalize_messages(messages)

    final_message = None
    if continue_final_message:
        if not chat:
            raise ValueError("continue_final_message is set but the conversation is empty!")
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final_message = chat[-1].get(field)
        if final_message is None:
            raise ValueError(f'continue_final_message is set but the final message has no "{field}" to continue!')
        fields = [field]
        if field in _REASONING_FIELDS:
            fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final_message]
        if not any(f in template for f in fields):
            raise ValueError(
                f'continue_final_message is set to "{field}" but this is not an accepted field in the chat_template'
            )
        if isinstance(final_message, (list, tuple)):
            for block in reversed(final_message):
                if isinstance(block, dict) and "text" in block:
                    final_message = block["text"]
                    block["text"] = block["text"] + _CONTINUE_TAG
                    break
            else:
                raise ValueError(
                    "continue_final_message is set but we could not find any text to continue in the final message!"
                )
        else:
            for f in fields:
                chat[-1][f] = chat[-1][f] + _CONTINUE_TAG

    try:
        rendered = compiled.render(
            messages=chat,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(e.message or str(e)) from e

    if continue_final_message:
        tag = _CONTINUE_TAG.strip()
        if final_message.strip() not in rendered or tag not in rendered:
            raise ValueError(
                "continue_final_message is set but the final message does not appear in the chat after applying "
                "the chat template (the template may delete portions of the final message)."
            )
        loc = rendered.rindex(tag)
        if rendered[loc : loc + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            rendered = rendered[:loc]
        else:
            rendered = rendered[:loc].rstrip()
    return rendered
