"""GGUF metadata as plain Python values, read with the `gguf` package."""

from __future__ import annotations

from typing import Any

from gguf import GGUFReader, GGUFValueType


def _field_value(field) -> Any:
    types = field.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        sub = types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return field.parts[field.data[0]].tolist()[0]


def read_gguf_metadata(reader: GGUFReader) -> dict[str, Any]:
    """All key/value fields of a GGUF file: strings decoded, arrays as lists."""
    return {
        name: _field_value(field)
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }
