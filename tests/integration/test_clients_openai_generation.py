"""The generator through the real `openai` client (pinned in requirements), unchanged, against the session's TorchServe.

The client is pointed at ``/predictions/generator/1.0/v1`` with client defaults; every answer is compared with the same
request sent over plain HTTP. The demo model's weights are random: texts are compared, never their meaning.
"""

import json
from typing import Literal

import jsonschema
import pydantic
import pytest
import requests

from tests.conftest import skip_unless_served

MODEL = "generator"
SEEDED = {"max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]

openai = pytest.importorskip("openai")
FORMAT = "response_format"
UNCOMPILABLE = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nowhere"}}}


@pytest.fixture(scope="module", autouse=True)
def served(ts_server):
    skip_unless_served(ts_server, MODEL)


@pytest.fixture(scope="module")
def base_url(ts_server):
    return f"{ts_server.inference_url}/predictions/{MODEL}/1.0/v1"


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=base_url, api_key="unused") as client:
        yield client


def post(base_url, path, body, **kwargs):
    return requests.post(f"{base_url}/{path}", json=body, timeout=60, **kwargs)


def test_completion_equals_the_same_request_over_http(client, base_url):
    completion = client.completions.create(model=MODEL, prompt="Once upon a time", **SEEDED)
    over_http = post(base_url, "completions", {"model": MODEL, "prompt": "Once upon a time", **SEEDED})
    assert over_http.status_code == 200 and over_http.headers["Content-Type"].startswith("application/json")
    expected = over_http.json()
    assert completion.object == "text_completion" and completion.model == MODEL
    [choice] = completion.choices
    assert choice.text == expected["choices"][0]["text"] and choice.text
    assert choice.finish_reason == expected["choices"][0]["finish_reason"] in ("length", "stop")
    assert completion.usage.model_dump(exclude_none=True) == expected["usage"]
    assert completion.usage.completion_tokens <= SEEDED["max_tokens"]


def test_chat_completion_equals_the_same_request_over_http(client, base_url):
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, **SEEDED)
    expected = post(base_url, "chat/completions", {"model": MODEL, "messages": MESSAGES, **SEEDED}).json()
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    [choice] = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected["choices"][0]["message"]["content"]
    assert choice.finish_reason == expected["choices"][0]["finish_reason"]
    assert answer.usage.prompt_tokens == expected["usage"]["prompt_tokens"] > 0


def test_streamed_chat_arrives_in_several_chunks_that_join_to_the_plain_answer(client):
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, **SEEDED)
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **SEEDED
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert len(content) >= 4 and {c.object for c in chunks} == {"chat.completion.chunk"}
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in content][-1] == plain.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage  # include_usage: the last chunk


def test_streamed_completion_is_server_sent_events_on_the_wire(base_url):
    body = {"model": MODEL, "prompt": "Hello", "stream": True, **SEEDED}
    plain = post(base_url, "completions", {**body, "stream": False}).json()
    response = post(base_url, "completions", body, stream=True)
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    raw = b"".join(chunk for chunk in response.iter_content(chunk_size=None) if chunk).decode("utf-8")
    events = [event.removeprefix("data: ") for event in raw.split("\n\n") if event]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]


def test_stop_sequences_end_the_text_with_finish_reason_stop(client):
    free = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=40, temperature=0)
    text = free.choices[0].text
    stop = text[8:11]
    stopped = client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=40, temperature=0, stop=[stop, "\u0001"]
    )
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=40, temperature=0, stop=stop, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == text[: text.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "call, body, status, error_class, param",
    [
        ("completions", {"prompt": "x", "max_tokens": 100000}, 400, "BadRequestError", "max_tokens"),
        ("completions", {"prompt": "x", "logprobs": 6}, 400, "BadRequestError", "logprobs"),
        ("completions", {"prompt": [1, 2, 3]}, 400, "BadRequestError", "prompt"),
        ("completions", {"prompt": "x", "n": 9}, 400, "BadRequestError", "n"),
        ("chat", {"messages": MESSAGES, "temperature": -1}, 400, "BadRequestError", "temperature"),
        ("chat", {"messages": MESSAGES, "temperature": 5}, 400, "BadRequestError", "temperature"),  # OpenAI's bound: 2
        ("completions", {"prompt": "x", "temperature": 2.5}, 400, "BadRequestError", "temperature"),
        ("chat", {"messages": MESSAGES, "stop": ["a"] * 5}, 400, "BadRequestError", "stop"),
        ("chat", {"messages": MESSAGES, "stream": True, "top_p": 2}, 400, "BadRequestError", "top_p"),
        ("chat", {"messages": MESSAGES, "model": "gpt-4o"}, 404, "NotFoundError", "model"),
        ("chat", {"messages": MESSAGES, "response_format": {"type": "yaml"}}, 400, "BadRequestError", FORMAT),
        ("chat", {"messages": MESSAGES, "response_format": {"type": "json_schema"}}, 400, "BadRequestError", FORMAT),
        ("chat", {"messages": MESSAGES, "response_format": UNCOMPILABLE}, 400, "BadRequestError", FORMAT),
    ],
)
def test_a_bad_request_raises_the_client_error_of_the_http_status(
    client, base_url, call, body, status, error_class, param
):
    body = {"model": MODEL, **body}
    path = "completions" if call == "completions" else "chat/completions"
    over_http = post(base_url, path, body)
    assert over_http.status_code == status and over_http.json()["error"]["param"] == param
    create = client.completions.create if call == "completions" else client.chat.completions.create
    with pytest.raises(getattr(openai, error_class)) as raised:
        create(**body)
    assert raised.value.status_code == status and raised.value.param == param
    assert over_http.json()["error"]["message"] in str(raised.value)


def test_the_native_api_still_answers_beside_the_openai_routes(predict, base_url):
    native = predict(MODEL, json={"prompt": "Hello", "max_new_tokens": 8})
    assert native.status_code == 200 and native.json()["model"]["weights"] == "random (demo)"
    wrong_route = post(base_url, "embeddings", {"input": "x"})
    assert wrong_route.status_code == 404 and "v1/chat/completions" in wrong_route.json()["message"]


# ------------------------------------------------------------------------------------------------ structured outputs
class Tag(pydantic.BaseModel):
    label: str = pydantic.Field(max_length=8)
    weight: int = pydantic.Field(ge=0, le=9)


class Card(pydantic.BaseModel):
    """Bounded fields, so that the random weights close the document well within max_tokens."""

    name: str = pydantic.Field(max_length=10)
    kind: Literal["a", "b", "c"]
    ok: bool
    tags: list[Tag] = pydantic.Field(max_length=2)


@pytest.mark.parametrize("api", ["chat.completions", "beta.chat.completions"])
def test_parse_with_a_pydantic_model_works_unchanged(client, api):
    """The client sends the model's strict JSON schema as response_format and parses the answer into the model
    (it raises on a refusal, on finish_reason "length" and on an answer that does not validate)."""
    completions = client.chat.completions if api == "chat.completions" else client.beta.chat.completions
    for seed in range(3):
        answer = completions.parse(
            model=MODEL, messages=MESSAGES, response_format=Card, max_tokens=200, temperature=1.0, seed=seed
        )
        [choice] = answer.choices
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Card)
        assert Card.model_validate_json(choice.message.content) == choice.message.parsed


def test_a_streamed_json_schema_answer_joins_to_a_valid_document(client, base_url):
    schema = Card.model_json_schema()
    response_format = {"type": "json_schema", "json_schema": {"name": "card", "schema": schema, "strict": True}}
    body = {"messages": MESSAGES, "max_tokens": 200, "temperature": 1.0, "seed": 7, "response_format": response_format}
    plain = post(base_url, "chat/completions", {"model": MODEL, **body}).json()
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **body))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain["choices"][0]["message"]["content"] and chunks[-1].choices[0].finish_reason == "stop"
    Card.model_validate_json(text)


def test_parse_with_n_and_logprobs_gives_every_choice_its_own_document(client):
    """Each choice decodes under its own grammar state: both parse into the model; their logprobs' bytes join to
    their own text (the values are the model's before the grammar's mask: docs/generation.md)."""
    answer = client.chat.completions.parse(
        model=MODEL,
        messages=MESSAGES,
        response_format=Card,
        max_tokens=200,
        temperature=1.0,
        seed=5,
        n=2,
        logprobs=True,
        top_logprobs=2,
    )
    assert [choice.index for choice in answer.choices] == [0, 1]
    for choice in answer.choices:
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Card)
        content = choice.logprobs.content
        assert b"".join(bytes(entry.bytes) for entry in content).decode("utf-8", "replace") == choice.message.content
        assert all(len(entry.top_logprobs) == 2 for entry in content)


def test_json_mode_on_completions_answers_json_or_its_prefix(client):
    completion = client.completions.create(
        model=MODEL, prompt="JSON:", max_tokens=60, seed=3, extra_body={"response_format": {"type": "json_object"}}
    )
    [choice] = completion.choices
    assert choice.text.startswith("{")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.text), dict)


# ------------------------------------------------------------------------------------------------ logprobs and n
def test_chat_logprobs_and_n_through_the_client_equal_the_same_request_over_http(client, base_url):
    body = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 3, "n": 2, **SEEDED}
    answer = client.chat.completions.create(model=MODEL, **body)
    expected = post(base_url, "chat/completions", {"model": MODEL, **body}).json()
    assert [choice.index for choice in answer.choices] == [0, 1]
    for choice, want in zip(answer.choices, expected["choices"], strict=True):
        assert choice.message.content == want["message"]["content"] and choice.finish_reason == want["finish_reason"]
        content = choice.logprobs.content
        assert [entry.model_dump() for entry in content] == want["logprobs"]["content"]
        assert all(len(entry.top_logprobs) == 3 and entry.logprob <= 0 for entry in content)
        assert b"".join(bytes(entry.bytes) for entry in content).decode("utf-8", "replace") == choice.message.content
    # choice i is the same request with seed + i and n = 1; usage counts the prompt once
    alone = [
        client.chat.completions.create(model=MODEL, **{**body, "n": 1, "seed": SEEDED["seed"] + i}) for i in range(2)
    ]
    assert [a.choices[0].message.content for a in alone] == [c.message.content for c in answer.choices]
    assert answer.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert answer.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_streamed_choices_carry_their_index_and_logprobs(client):
    body = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 1, "n": 2, **SEEDED}
    plain = client.chat.completions.create(model=MODEL, **body)
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **body))
    for choice in plain.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content
        assert mine[-1].finish_reason == choice.finish_reason
        tokens = [entry.token for c in mine if c.logprobs for entry in c.logprobs.content]
        assert tokens == [entry.token for entry in choice.logprobs.content]


def test_completion_logprobs_are_the_legacy_shape(client):
    completion = client.completions.create(model=MODEL, prompt="Once upon a time", logprobs=2, **SEEDED)
    [choice] = completion.choices
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == completion.usage.completion_tokens
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs) and logprobs.text_offset[0] == 0


@pytest.mark.parametrize(
    "call, body, param",
    [
        ("chat", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"messages": MESSAGES, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("chat", {"messages": MESSAGES, "logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
        ("chat", {"messages": MESSAGES, "n": 0}, "n"),
        ("chat", {"messages": MESSAGES, "n": 10**9}, "n"),
        ("completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
        ("completions", {"prompt": "x", "n": 9, "stream": True}, "n"),
    ],
)
def test_bad_logprobs_and_n_are_refused_naming_the_field(client, call, body, param):
    create = client.completions.create if call == "completions" else client.chat.completions.create
    with pytest.raises(openai.BadRequestError) as raised:
        create(model=MODEL, **body)
    assert raised.value.status_code == 400 and raised.value.param == param


# A tool small enough for the demo's 256-token prompt limit (the tools are part of the prompt; the demo tokenizer
# spends about a token per character of JSON); strict, as the client's parse helpers ask of tools.
CLOCK = {
    "type": "object",
    "properties": {"zone": {"enum": ["utc", "cet"]}, "hour": {"type": "integer", "minimum": 0, "maximum": 23}},
    "required": ["zone", "hour"],
    "additionalProperties": False,
}
CLOCK_TOOL = {"type": "function", "function": {"name": "clock", "parameters": CLOCK, "strict": True}}
ASK_TIME = [{"role": "user", "content": "Time?"}]
ONE_CALL = {"max_tokens": 150, "temperature": 1.0, "parallel_tool_calls": False}


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "clock"}}])
def test_required_and_named_tool_choice_give_calls_whose_arguments_validate(client, tool_choice):
    """Through the client's parse helper (it parses a strict tool's arguments): arguments the random weights write are
    valid only because the grammar holds them to the parameters' schema."""
    for seed in range(3):
        answer = client.chat.completions.parse(
            model=MODEL, messages=ASK_TIME, tools=[CLOCK_TOOL], tool_choice=tool_choice, seed=seed, **ONE_CALL
        )
        [choice] = answer.choices
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_") and call.function.name == "clock"
        assert json.loads(call.function.arguments) == call.function.parsed_arguments
        jsonschema.validate(call.function.parsed_arguments, CLOCK)


def test_streamed_tool_calls_accumulate_to_the_plain_answer(client):
    body = {"model": MODEL, "messages": ASK_TIME, "tools": [CLOCK_TOOL], "tool_choice": "required", "seed": 11}
    plain = client.chat.completions.create(**body, **ONE_CALL)
    with client.chat.completions.stream(**body, **ONE_CALL) as stream:
        final = stream.get_final_completion()
    [choice], [plain_choice] = final.choices, plain.choices
    assert choice.finish_reason == plain_choice.finish_reason == "tool_calls"
    streamed = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert streamed == [(c.function.name, c.function.arguments) for c in plain_choice.message.tool_calls]
    jsonschema.validate(json.loads(streamed[0][1]), CLOCK)


def test_a_follow_up_turn_with_the_tool_result_is_answered(client):
    first = client.chat.completions.create(
        model=MODEL, messages=ASK_TIME, tools=[CLOCK_TOOL], tool_choice="required", seed=3, **ONE_CALL
    )
    message = first.choices[0].message
    [call] = message.tool_calls
    history = [
        *ASK_TIME,
        message.model_dump(exclude_none=True),  # the assistant's call as the client holds it
        {"role": "tool", "tool_call_id": call.id, "content": "12:00"},
    ]
    # Without the tools this time: the demo's 256-token prompt limit cannot hold them and the history together.
    answer = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, seed=3)
    [choice] = answer.choices
    assert choice.message.tool_calls is None and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("length", "stop") and answer.usage.prompt_tokens > 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [CLOCK_TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
        ({"tools": [CLOCK_TOOL, CLOCK_TOOL]}, "tools"),
        ({"tools": [CLOCK_TOOL], "response_format": {"type": "json_object"}}, FORMAT),
    ],
)
def test_bad_tools_are_refused_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=ASK_TIME, max_tokens=4, **body)
    assert refused.value.status_code == 400 and refused.value.param == param
