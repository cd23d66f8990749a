"""A request's structured-output constraint from its fields, as vLLM reads them: OpenAI's
response_format (json_schema, json_object, structural_tag; text is none), vLLM's
structured_outputs object, or the older guided_json / guided_regex / guided_choice /
guided_grammar. At most one source; the grammar itself is checked by the engine (a bad schema,
regex or grammar is a 400 naming llguidance's error)."""

from __future__ import annotations

import json

from vllmx.sampling_params import StructuredOutputsParams
from vllmx.server.errors import OpenAIError

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}
_FORMATS = ("text", "json_object", "json_schema", "structural_tag")


def _from_response_format(rf) -> StructuredOutputsParams | None:
    if rf.type not in _FORMATS:
        raise OpenAIError(f"response_format.type must be one of {', '.join(_FORMATS)}, got "
                          f"{rf.type!r}", param="response_format")
    if rf.type == "text":
        return None
    if rf.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if rf.type == "structural_tag":
        if not rf.structures or not rf.triggers:
            raise OpenAIError("response_format of type structural_tag needs 'structures' and "
                              "'triggers'", param="response_format")
        return StructuredOutputsParams(structural_tag=json.dumps(
            {"structures": rf.structures, "triggers": rf.triggers}))
    schema = (rf.json_schema or {}).get("schema")
    if not isinstance(schema, (dict, bool)):
        raise OpenAIError("response_format of type json_schema needs json_schema.schema, a "
                          "JSON schema object", param="response_format.json_schema")
    return StructuredOutputsParams(json=schema)


def structured_outputs_of(request) -> StructuredOutputsParams | None:
    """The request's constraint, or None; OpenAIError (400) for a malformed or doubled one."""
    found: dict[str, StructuredOutputsParams] = {}
    try:
        if request.response_format is not None:
            so = _from_response_format(request.response_format)
            if so is not None:
                found["response_format"] = so
        if request.structured_outputs is not None:
            found["structured_outputs"] = StructuredOutputsParams.from_dict(
                request.structured_outputs)
        for name, key in _GUIDED.items():
            if getattr(request, name) is not None:
                found[name] = StructuredOutputsParams(**{key: getattr(request, name)})
    except (ValueError, TypeError) as e:
        param = next((n for n in ("structured_outputs", *_GUIDED) if n in str(e)), None)
        raise OpenAIError(str(e), param=param or "structured_outputs") from e
    if len(found) > 1:
        raise OpenAIError(f"give one structured output constraint, got {', '.join(found)}",
                          param=next(iter(found)))
    return next(iter(found.values()), None)
