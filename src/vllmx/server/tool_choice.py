"""A chat request's tools and tool_choice checked and turned into a plan (vLLM's
check_tool_usage and its tool-choice schemas): "none" shows the tools to the model only;
"auto" parses the output with the server's --tool-call-parser; "required" and a named function
are forced with a JSON schema through structured outputs, so they work on any model."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

from vllmx.server.errors import OpenAIError
from vllmx.server.structured_outputs import structured_outputs_of

_NAMED_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


@dataclass
class ToolPlan:
    mode: str  # "none", "auto", "required" or "named"
    tools: list[dict] | None  # what the chat template renders
    named: str | None = None
    parallel: bool = True
    schema: dict | None = None  # the JSON schema forcing required / named calls


def _check_tools(tools: list) -> dict[str, dict]:
    """Function name -> its definition; a 400 naming the first bad tool."""
    if not tools:
        raise OpenAIError("`tools` must not be an empty array. Either provide at least one tool "
                          "or omit the field entirely.", param="tools")
    found: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if tool.get("type") != "function":
            raise OpenAIError(f"{where}.type must be 'function', got {tool.get('type')!r}",
                              param=f"{where}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise OpenAIError(f"{where}.function must be an object with a name",
                              param=f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise OpenAIError(f"{where}.function.name must be a non-empty string without "
                              f"spaces, got {name!r}", param=f"{where}.function.name")
        if name in found:
            raise OpenAIError(f"{where}: the function name {name!r} is used twice",
                              param=f"{where}.function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise OpenAIError(f"{where}.function.parameters must be a JSON schema object, got "
                              f"{type(params).__name__}", param=f"{where}.function.parameters")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise OpenAIError(f"{where}.function.description must be a string",
                              param=f"{where}.function.description")
        found[name] = fn
    return found


def _parameters(fn: dict) -> dict:
    return fn.get("parameters") or {"type": "object", "properties": {}}


def required_schema(functions: dict[str, dict], parallel: bool) -> dict:
    """vLLM's schema for tool_choice "required": a list of {"name", "parameters"} objects, one
    alternative per tool; each tool's $defs lifted to the top so that its $refs still hold."""
    defs: dict = {}
    alternatives = []
    for name, fn in functions.items():
        params = copy.deepcopy(_parameters(fn))
        for key, value in (params.pop("$defs", None) or {}).items():
            if key in defs and defs[key] != value:
                raise OpenAIError(f"tools: two tools define $defs.{key} differently; rename "
                                  f"one", param="tools")
            defs[key] = value
        # Closed, unlike vLLM's: a small model otherwise goes on writing keys a call has no
        # use for ("description": ...) until max_tokens.
        alternatives.append({"properties": {"name": {"type": "string", "enum": [name]},
                                            "parameters": params},
                             "required": ["name", "parameters"],
                             "additionalProperties": False})
    schema = {"type": "array", "minItems": 1,
              "items": {"type": "object", "anyOf": alternatives}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def plan_tools(request, auto_enabled: bool) -> ToolPlan:
    """The request's plan; OpenAIError (400) for bad tools or a tool_choice that cannot be
    honoured. auto_enabled: the server runs with --enable-auto-tool-choice and a parser."""
    choice, tools = request.tool_choice, request.tools
    parallel = request.parallel_tool_calls is not False
    if tools is None:
        if choice not in (None, "none"):
            raise OpenAIError("When using `tool_choice`, `tools` must be set.",
                              param="tool_choice")
        return ToolPlan("none", None)
    functions = _check_tools(tools)
    if choice is None:
        choice = "auto"
    if choice == "none":
        return ToolPlan("none", tools)
    if choice == "auto":
        if not auto_enabled:
            raise OpenAIError('"auto" tool choice requires --enable-auto-tool-choice and '
                              '--tool-call-parser to be set', param="tool_choice")
        return ToolPlan("auto", tools, parallel=parallel)
    if choice == "required":
        plan = ToolPlan("required", tools, parallel=parallel,
                        schema=required_schema(functions, parallel))
    elif isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or \
                not isinstance(fn.get("name"), str):
            raise OpenAIError(f"Invalid value for `tool_choice`: {json.dumps(choice)[:200]}. "
                              f"{_NAMED_USAGE}", param="tool_choice")
        if fn["name"] not in functions:
            raise OpenAIError(f"Tool '{fn['name']}' has not been passed in `tools`.",
                              param="tool_choice")
        plan = ToolPlan("named", tools, named=fn["name"], parallel=parallel,
                        schema=_parameters(functions[fn["name"]]))
    else:
        raise OpenAIError(f"Invalid value for `tool_choice`: {choice!r}! Only named tools, "
                          f'"none", "auto" or "required" are supported.', param="tool_choice")
    if structured_outputs_of(request) is not None:
        raise OpenAIError("You can only either use structured outputs (response_format, "
                          "structured_outputs, guided_*) or a forced tool_choice, not both.",
                          param="tool_choice")
    return plan
