"""JSON schemas the structured-output tests ask for: nested objects, enums, arrays, $ref,
required and optional fields, bounded so that a small model's answer ends (maxLength,
maxItems, integer ranges)."""

PERSON = {  # nested object, pattern, required
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}

PRODUCT = {  # enums, arrays, booleans, an optional field
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                 "minItems": 1, "maxItems": 3},
        "in_stock": {"type": "boolean"},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["color", "size", "tags", "in_stock"],
    "additionalProperties": False,
}

SEGMENT = {  # $ref to $defs, an array of referenced objects
    "type": "object",
    "$defs": {
        "point": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99},
                           "y": {"type": "integer", "minimum": -99, "maximum": 99}},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
    },
    "properties": {
        "start": {"$ref": "#/$defs/point"},
        "end": {"$ref": "#/$defs/point"},
        "via": {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2},
    },
    "required": ["start", "end"],
    "additionalProperties": False,
}

LIST_OF_CHOICES = {  # a top-level array of enum-valued objects
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]},
                       "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    },
    "minItems": 1,
    "maxItems": 3,
}

SCHEMAS = {"person": PERSON, "product": PRODUCT, "segment": SEGMENT, "answers": LIST_OF_CHOICES}
PROMPTS = {
    "person": "Give a person's name, age and address as JSON.",
    "product": "Describe a T-shirt for sale as JSON.",
    "segment": "A line segment from (1, 2) to (5, 7) as JSON:",
    "answers": "Is the sky blue? Is grass red? Answer as JSON.",
}
