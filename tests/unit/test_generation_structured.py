"""Structured outputs in-process: ``response_format`` on the native, completions and chat routes of the demo
generator (random weights), decoded through the generation loop per step (scripts.ops.handler_loader's
ContinuousFrontend plays TorchServe's continuous batching) and as whole batches.

Every constrained answer is checked with ``jsonschema`` against the schema it was asked for: the random weights
would write anything, so a valid answer can only come from the grammar's mask.
"""

import json

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.core.errors import RequestError
from handlers.core.http import RequestView
from handlers.generation import structured
from handlers.generation.openai_api import CHAT_ROUTE, COMPLETIONS_ROUTE
from handlers.generation.requests import FieldError, Served
from handlers.generation.routes import GENERATION_ROUTES
from scripts.ops.handler_loader import ContinuousFrontend, load_handler, set_requests, statuses
from tests.unit.test_generation_logprobs import assert_model_values

JSON = {"Content-Type": "application/json"}
HI = [{"role": "user", "content": "Give me JSON"}]

# Bounded schemas (every string, array and integer has a limit), so an answer always closes within max_tokens
# whatever the random weights draw; together they cover objects, arrays, enums, anyOf/null, $ref and booleans.
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 5},
        "minItems": 1,
        "maxItems": 4,
    },
    "flags": {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "kind": {"enum": ["a", "b", 3]},
            "note": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]},
        },
        "required": ["ok", "kind", "note"],
        "additionalProperties": False,
    },
    "refs": {  # as Pydantic writes a nested model
        "$defs": {
            "Point": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "boolean"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/Point"}, "maxItems": 2}},
        "required": ["points"],
        "additionalProperties": False,
    },
}


def schema_format(name):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


@pytest.fixture(scope="module")
def model_dir(prepared_model_dir):
    return prepared_model_dir("generator")


@pytest.fixture(scope="module")
def stepper(model_dir, decode_step):
    torch.set_num_threads(1)
    return load_handler(model_dir, "generator", {"decode_step": decode_step}, continuous_batching=True)


@pytest.fixture(scope="module")
def whole(model_dir, decode_step):
    return load_handler(model_dir, "generator", {"decode_step": decode_step})


@pytest.fixture(scope="module")
def served(whole):
    handler, _ = whole
    loaded = handler.loaded
    return Served(handler.model_name, loaded.info, loaded.limits, loaded.tokenizer)


def chat_body(response_format, seed, **extra):
    return {
        "messages": HI,
        "max_tokens": 160,
        "temperature": 1.0,
        "seed": seed,
        "response_format": response_format,
        **extra,
    }


def content(job):
    assert job.status == 200, job.text
    [choice] = json.loads(job.text)["choices"]
    return choice["message"]["content"], choice["finish_reason"]


def test_200_constrained_answers_of_the_random_model_all_parse_and_validate(stepper):
    """Four schemas, 50 seeds each, decoded per step 16 at a time beside unconstrained requests."""
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    jobs = []
    for seed in range(50):
        for name in SCHEMAS:
            jobs.append((name, frontend.submit(chat_body(schema_format(name), seed), {"url_path": CHAT_ROUTE})))
        frontend.submit({"prompt": "free text", "max_new_tokens": 8, "seed": seed, "temperature": 1.0})
    frontend.run()
    for name, job in jobs:
        text, finish_reason = content(job)
        assert finish_reason == "stop", (name, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    assert len(jobs) == 200


def test_an_unconstrained_row_answers_as_alone_beside_constrained_ones(whole):
    """One request's grammar never touches its batch-mates: the free-text answer is the one it gets alone."""
    handler, context = whole
    free = {"prompt": "Once upon a time", "max_new_tokens": 20, "temperature": 0.9, "seed": 5}
    set_requests(context, [JSON])
    [alone] = handler.handle([{"body": free}], context)
    constrained = {**free, "response_format": schema_format("person"), "max_new_tokens": 60}
    set_requests(context, [JSON, JSON, JSON])
    answers = handler.handle([{"body": constrained}, {"body": free}, {"body": {**constrained, "seed": 6}}], context)
    assert statuses(context, 3) == [200, 200, 200]
    assert json.loads(answers[1]) == json.loads(alone)
    for answer in (answers[0], answers[2]):
        jsonschema.validate(json.loads(json.loads(answer)["text"]), SCHEMAS["person"])


def test_greedy_and_the_native_and_completions_routes_are_constrained_too(whole):
    handler, context = whole
    native = {"prompt": "Hi", "max_new_tokens": 80, "response_format": schema_format("flags")}
    completion = {"prompt": "Hi", "max_tokens": 80, "temperature": 0, "response_format": schema_format("numbers")}
    set_requests(context, [JSON, {**JSON, "url_path": COMPLETIONS_ROUTE}])
    answers = handler.handle([{"body": native}, {"body": completion}], context)
    assert statuses(context, 2) == [200, 200]
    native_answer, completion_answer = (json.loads(answer) for answer in answers)
    assert native_answer["finish_reason"] == "stop"
    jsonschema.validate(json.loads(native_answer["text"]), SCHEMAS["flags"])
    [choice] = completion_answer["choices"]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["text"]), SCHEMAS["numbers"])


def test_json_mode_answers_a_json_object_or_a_prefix_of_one_when_max_tokens_ends_it(stepper):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    jobs = [
        frontend.submit(chat_body({"type": "json_object"}, seed, max_tokens=40), {"url_path": CHAT_ROUTE})
        for seed in range(8)
    ]
    frontend.run()
    reasons = set()
    for job in jobs:
        text, finish_reason = content(job)
        reasons.add(finish_reason)
        assert text.startswith("{")
        if finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:  # OpenAI's behaviour: the answer is cut where max_tokens ended it
            assert finish_reason == "length"
            with pytest.raises(json.JSONDecodeError):
                json.loads(text)
    assert reasons <= {"stop", "length"}


def test_a_schema_cut_by_max_tokens_ends_with_length_and_a_prefix(whole):
    handler, context = whole
    body = {"prompt": "Hi", "max_new_tokens": 3, "response_format": schema_format("person")}
    set_requests(context, [JSON])
    [answer] = handler.handle([{"body": body}], context)
    answer = json.loads(answer)
    assert answer["finish_reason"] == "length" and answer["completion_tokens"] == 3
    text, start = answer["text"], '{"name": "'  # the schema's only start: its first required property
    assert text and (start.startswith(text) or text.startswith(start))


def test_streamed_constrained_chat_adds_up_to_a_valid_answer(stepper):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    job = frontend.submit(chat_body(schema_format("refs"), 4, stream=True), {"url_path": CHAT_ROUTE})
    frontend.run()
    # The first token's call, then the rest (one call or several: handler.decode_call_ms lets steps share one).
    assert job.status == 200 and len(job.chunks) >= 2
    events = [json.loads(e[len("data: ") :]) for e in job.text.split("\n\n") if e.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS["refs"])


def test_each_of_n_choices_decodes_under_its_own_grammar_state(whole, stepper):
    """n = 3 under one schema: every choice is a valid document of its own and is exactly the request alone with
    seed + i (a grammar state shared by the choices would take the tokens of all three and break each document)."""
    body = chat_body(schema_format("person"), 11)
    handler, context = whole
    set_requests(context, [{**JSON, "url_path": CHAT_ROUTE}] * 4)
    answers = handler.handle(
        [{"body": {**body, "n": 3}}] + [{"body": {**body, "seed": 11 + i}} for i in range(3)], context
    )
    assert statuses(context, 4) == [200] * 4
    together = json.loads(answers[0])["choices"]
    alone = [json.loads(answer)["choices"][0] for answer in answers[1:]]
    assert [choice["message"]["content"] for choice in together] == [choice["message"]["content"] for choice in alone]
    assert len({choice["message"]["content"] for choice in together}) > 1  # three different draws
    for choice in together:
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMAS["person"])

    handler, context = stepper  # per-step scheduling admits the choices together, as rows of their own
    frontend = ContinuousFrontend(handler, context)
    job = frontend.submit({**body, "n": 3}, {"url_path": CHAT_ROUTE})
    frontend.run()
    assert job.status == 200, job.text
    assert [c["message"]["content"] for c in json.loads(job.text)["choices"]] == [
        c["message"]["content"] for c in together
    ]


def test_logprobs_of_a_constrained_request_are_the_models_own_before_the_grammars_mask(whole):
    """Greedy under a schema takes the likeliest token the grammar allows, and reports the model's unmasked values:
    where the model's own favourite was not allowed, the chosen token is not the first of ``top``."""
    handler, context = whole
    body = {"prompt": "Hi", "max_new_tokens": 80, "response_format": schema_format("flags")}
    set_requests(context, [JSON, JSON])
    answers = handler.handle([{"body": {**body, "logprobs": 3}}, {"body": body}], context)
    assert statuses(context, 2) == [200, 200]
    asked, plain = (json.loads(answer) for answer in answers)
    assert asked["text"] == plain["text"] and asked["finish_reason"] == "stop"  # asking changes no token
    jsonschema.validate(json.loads(asked["text"]), SCHEMAS["flags"])
    entries = asked["logprobs"]
    assert len(entries) == asked["completion_tokens"]
    assert_model_values(handler, handler.loaded.tokenizer.encode("Hi"), entries, 3)
    assert any(entry["top"][0]["token_id"] != entry["token_id"] for entry in entries)


def parse(route, body, served):
    route = GENERATION_ROUTES[route]
    try:
        return route.parse(body, RequestView(None, 0), served)
    except RequestError as error:
        raise route.refusal(error) from None


def deep(levels):
    schema = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


BAD_FORMATS = {
    "not an object": ("json", "must be an object"),
    "unknown type": ({"type": "yaml"}, "'response_format.type' is 'yaml'"),
    "type not a string": ({"type": ["json_object"]}, "'response_format.type'"),
    "no json_schema": ({"type": "json_schema"}, "'response_format.json_schema' must be an object"),
    "bad name": ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "json_schema.name"),
    "no schema": ({"type": "json_schema", "json_schema": {"name": "x"}}, "missing field 'response_format.json_schema"),
    "schema not an object": ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "JSON schema object"),
    "strict not a bool": (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}},
        "'response_format.json_schema.strict' must be true or false",
    ),
    "too deep": (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": deep(40)}},
        f"at most {structured.MAX_SCHEMA_DEPTH} are allowed",
    ),
    "too big": (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["v" * 50] * 2000}}},
        f"at most {structured.MAX_SCHEMA_CHARS} are allowed",
    ),
    "missing $ref": (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nowhere"}}},
        "cannot be compiled",
    ),
    "unknown type in schema": (
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "tuple"}}},
        "cannot be compiled",
    ),
    "unsatisfiable": (
        {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}},
        },
        "cannot be compiled",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_FORMATS))
def test_a_bad_response_format_is_a_400_naming_why_in_each_routes_shape(served, name):
    value, message = BAD_FORMATS[name]
    for route, body in (
        (CHAT_ROUTE, {"messages": HI}),
        (COMPLETIONS_ROUTE, {"prompt": "Hi"}),
        ("", {"prompt": "Hi"}),
    ):
        with pytest.raises(RequestError) as refused:
            parse(route, {**body, "response_format": value}, served)
        error = refused.value
        assert error.code == 400 and message in error.message, (name, route, error.message)
        if route:
            assert error.to_body()["error"]["param"] == "response_format"


HOSTILE = {
    "recursive $ref": {
        "$defs": {
            "node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "additionalProperties": False}
        },
        "$ref": "#/$defs/node",
    },
    "enormous enum": {"enum": [f"value-{i}" for i in range(5000)]},
    "nested regex": {"type": "string", "pattern": "^(a+)+(b|c|d+)*[x-z]{2,40}$"},
    "huge repetition": {"type": "string", "pattern": "^(x{1,1000}){1,1000}$"},
    "many properties": {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(1500)},
        "required": [f"p{i}" for i in range(1500)],
    },
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_schemas_are_compiled_within_the_parsers_limits_or_refused_and_the_worker_goes_on(whole, name):
    """Each is answered (a valid prefix, or a whole valid document) or refused with a 400; never a crash."""
    handler, context = whole
    body = {
        "prompt": "Hi",
        "max_new_tokens": 24,
        "temperature": 1.0,
        "seed": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "h", "schema": HOSTILE[name]}},
    }
    set_requests(context, [JSON, JSON])
    answers = handler.handle([{"body": body}, {"body": {"prompt": "Hi", "max_new_tokens": 2}}], context)
    status = statuses(context, 2)
    assert status[1] == 200
    answer = json.loads(answers[0])
    if status[0] == 400:
        assert "response_format" in answer["message"]
    else:
        assert status[0] == 200 and answer["finish_reason"] in ("stop", "length")
        if answer["finish_reason"] == "stop":
            jsonschema.validate(json.loads(answer["text"]), HOSTILE[name])


def test_a_constrained_request_is_not_answered_from_the_similarity_cache(served):
    plain = parse(CHAT_ROUTE, {"messages": HI, "seed": 1}, served)
    constrained = parse(CHAT_ROUTE, {"messages": HI, "seed": 1, "response_format": {"type": "json_object"}}, served)
    assert plain.lookup.text is not None and plain.structured is None
    assert constrained.lookup.text is None and constrained.lookup.skip == "response_format"
    assert parse(CHAT_ROUTE, {"messages": HI, "response_format": {"type": "text"}}, served).structured is None


def test_the_mask_is_the_same_computed_in_the_background_or_when_the_token_is_chosen(whole, monkeypatch):
    """The background thread only moves the mask's work off the step: answers are identical either way."""
    handler, context = whole
    body = {
        "prompt": "Hi",
        "max_new_tokens": 80,
        "temperature": 1.0,
        "seed": 9,
        "response_format": schema_format("refs"),
    }
    set_requests(context, [JSON])
    [background] = handler.handle([{"body": body}], context)
    monkeypatch.setattr(structured, "BACKGROUND_MASKS", False)
    set_requests(context, [JSON])
    [inline] = handler.handle([{"body": body}], context)
    assert json.loads(background)["text"] == json.loads(inline)["text"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
near_formats = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "json_object", "json_schema"]) | json_values},
    optional={
        "json_schema": st.fixed_dictionaries(
            {}, optional={"name": st.text(max_size=70) | json_values, "schema": json_values, "strict": json_values}
        )
        | json_values
    },
)


@settings(max_examples=300, deadline=None)
@given(value=json_values | near_formats)
def test_any_response_format_is_free_text_a_format_or_a_field_error(value):
    try:
        parsed = structured.parse_response_format(value)
    except FieldError as error:
        assert error.field == "response_format" and error.code == 400 and error.message
        return
    assert parsed is None or parsed.kind in ("json_object", "json_schema")


def test_a_grammar_that_outgrows_the_parsers_limits_while_decoding_fails_its_request_with_a_400_alone():
    """A schema can compile and still outgrow llguidance's parser limits once the text reaches some point (the
    fuzzer found one: "Current row has 4007 items; max is 2000"): that is the request's doing, so a 400 naming
    response_format for that row alone, while another row of the same step goes on; any other grammar failure
    stays a server error."""
    from handlers.generation.decoding import ConstraintFailed, SamplingSettings, Sequence, append_tokens

    limit = structured.grammar_failure(
        "the output grammar refused token 91", "Parser Error: row has 4007 items; max is 2000"
    )
    assert limit.status == 400 and str(limit).startswith("response_format: the schema is too complex")
    assert structured.grammar_failure("the output grammar failed", "unexpected state").status == 500

    class Outgrown:
        def mask(self, logits, stop_token_ids):
            raise limit

        def advance(self, token, more):
            raise AssertionError("never reached")

    constrained = Sequence([1, 2], SamplingSettings(max_new_tokens=4), constraint=Outgrown())
    free = Sequence([1, 2], SamplingSettings(max_new_tokens=4))
    chosen = append_tokens(torch.zeros(2, 8), [constrained, free], frozenset())
    assert free in chosen and constrained not in chosen
    assert constrained.error_status == 400 and "response_format" in (constrained.error or "")
    assert isinstance(limit, ConstraintFailed)
