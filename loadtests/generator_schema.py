"""The schema-constrained requests of the generator load test (loadtests/generator_user.py) and their check, apart
from Locust so the comparison's tests import them without Locust's gevent patching."""

import json

import jsonschema

# The constrained requests' schema (docs/generation.md's example): every field bounded, so a document closes well
# within CONSTRAINED_MAX_TOKENS even from random weights; a request cut short by max_tokens would not parse.
REVIEW_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "open": {"type": "boolean"},
    },
    "required": ["city", "rating", "open"],
    "additionalProperties": False,
}
REVIEW_FORMAT = {"type": "json_schema", "json_schema": {"name": "review", "strict": True, "schema": REVIEW_SCHEMA}}
CONSTRAINED_MAX_TOKENS = 256


def schema_error(text, schema=REVIEW_SCHEMA):
    """None when ``text`` is a JSON document valid against ``schema``, else why not."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return None
