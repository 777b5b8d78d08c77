"""The generator's OpenAI completions and chat completions, in process (no server): parsing onto the native
generation request, refusals (OpenAI-shaped, one request of a batch at a time), server-sent-event framing, stop
sequences, top_p, and the chat template (the model's own, or the plain fallback).

The demo model's weights are random: assertions compare texts produced two ways (streamed vs not, batched vs alone,
with vs without a stop sequence), never their meaning.
"""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.core.errors import RequestError
from handlers.core.http import RequestView
from handlers.generation import chat
from handlers.generation.decoding import SamplingSettings, choose_token
from handlers.generation.openai_api import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    NEUTRAL,
    Served,
)
from handlers.generation.requests import MAX_SEED, GenerationLimits
from handlers.generation.routes import GENERATION_ROUTES
from handlers.generation.streaming import AnswerText
from scripts.ops.handler_loader import ChunkRecorder, load_handler, set_requests, statuses

JSON = {"Content-Type": "application/json"}
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def generator(prepared_model_dir, decode_step):
    return load_handler(prepared_model_dir("generator"), "generator", {"decode_step": decode_step})


@pytest.fixture(scope="module")
def served(generator):
    handler, _ = generator
    loaded = handler.loaded
    return Served(handler.model_name, loaded.info, loaded.limits, loaded.tokenizer)


def run(handler, context, requests):
    """requests: [(route, body)] -> (raw answers, intermediate messages), all in one batch."""
    set_requests(context, [{**JSON, "url_path": route} for route, _ in requests])
    recorder = ChunkRecorder()
    handler.stream_sink = recorder
    answers = handler.handle([{"body": body} for _, body in requests], context)
    return answers, recorder.messages


def parse_openai(path, body, served):
    """One body through its route's parser, refused in the route's error shape as the handler refuses it."""
    route = GENERATION_ROUTES[path]
    try:
        return route.parse(body, RequestView(None, 0), served)
    except RequestError as error:
        raise route.refusal(error) from None


def one(handler, context, route, body):
    [answer], messages = run(handler, context, [(route, body)])
    return answer, messages


def events(text):
    """Server-sent events -> the parsed data of each (the final [DONE] as the string "[DONE]")."""
    assert text.endswith("\n\n")
    parsed = []
    for event in text.split("\n\n")[:-1]:
        assert event.startswith("data: ") and "\n" not in event
        data = event[len("data: ") :]
        parsed.append(data if data == "[DONE]" else json.loads(data))
    return parsed


def stream_events(messages, final, idx=0):
    return [event for message in messages if idx in message for event in events(message[idx])] + events(final)


def chat_text(events_):
    return "".join(e["choices"][0]["delta"].get("content", "") for e in events_ if e != "[DONE]" and e["choices"])


# ------------------------------------------------------------------------------------------------------ answers
def test_completion_answers_text_completion_with_usage(generator):
    handler, context = generator
    body = {"model": "generator", "prompt": "Hello world", "max_tokens": 12, "temperature": 0}
    answer, messages = one(handler, context, COMPLETIONS_ROUTE, body)
    native, _ = one(handler, context, "", {"prompt": "Hello world", "max_new_tokens": 12})
    answer, native = json.loads(answer), json.loads(native)
    assert statuses(context, 1) == [200] and messages == []
    assert answer["object"] == "text_completion" and answer["id"].startswith("cmpl-")
    assert answer["model"] == "generator" and isinstance(answer["created"], int)
    assert answer["system_fingerprint"] == "tiny-gpt2-random; weights: random (demo)"
    [choice] = answer["choices"]
    assert choice == {"text": native["text"], "index": 0, "logprobs": None, "finish_reason": native["finish_reason"]}
    assert answer["usage"] == {
        "prompt_tokens": native["prompt_tokens"],
        "completion_tokens": native["completion_tokens"],
        "total_tokens": native["prompt_tokens"] + native["completion_tokens"],
    }


def test_chat_answers_chat_completion_with_an_assistant_message(generator):
    handler, context = generator
    body = {"model": "generator", "messages": HI, "max_tokens": 10, "seed": 3}
    answer = json.loads(one(handler, context, CHAT_ROUTE, body)[0])
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    [choice] = answer["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("length", "stop") and choice["index"] == 0
    assert answer["usage"]["completion_tokens"] <= 10
    again = json.loads(one(handler, context, CHAT_ROUTE, body)[0])
    assert again["choices"] == answer["choices"] and again["id"] != answer["id"]


def test_openai_fields_map_onto_the_generation_request(served):
    body = {"prompt": "Hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 11, "stop": ["x", "yz"]}
    request = parse_openai(COMPLETIONS_ROUTE, body, served)
    assert request.settings == SamplingSettings(max_new_tokens=7, temperature=0.5, top_k=0, seed=11, top_p=0.9)
    assert request.stop == ("x", "yz") and request.stream is False
    assert request.prompt_ids == served.tokenizer.encode("Hi")
    assert parse_openai(COMPLETIONS_ROUTE, {**body, "stop": "x"}, served).stop == ("x",)


def test_defaults_are_openais_sampling_with_the_handler_default_length(served):
    request = parse_openai(COMPLETIONS_ROUTE, {"model": "generator", "prompt": "Hi"}, served)
    assert request.settings.temperature == 1.0 and request.settings.top_p == 1.0 and request.stop == ()
    assert request.settings.max_new_tokens == served.limits.default_max_new_tokens
    assert 0 <= request.settings.seed <= MAX_SEED
    # null means "not given" for every optional field (OpenAI's are nullable), as clients that send None expect
    nulls = {key: None for key in ("max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "logprobs")}
    assert parse_openai(COMPLETIONS_ROUTE, {"prompt": "Hi", **nulls}, served).settings.temperature == 1.0


def test_neutral_values_of_unservable_fields_and_ignored_fields_are_accepted(served):
    completion = {
        "prompt": ["Hi"],  # a list of one prompt
        "n": 1,
        "best_of": 1,
        "echo": False,
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "logit_bias": {},
        "suffix": "",
        "user": "someone",
    }
    assert parse_openai(COMPLETIONS_ROUTE, completion, served).prompt_ids == served.tokenizer.encode("Hi")
    conversation = {
        "messages": HI,
        "logprobs": False,
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "modalities": ["text"],
        "user": "someone",
        "metadata": {"k": "v"},
        "store": False,
        "service_tier": "auto",
        "max_completion_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": False},
    }
    request = parse_openai(CHAT_ROUTE, conversation, served)
    assert request.settings.max_new_tokens == 5 and request.answers.include_usage is True


# ------------------------------------------------------------------------------------------------------ refusals
TOO_MANY = 10**6
BAD_COMPLETIONS = {
    "prompt missing": ({}, 400, "prompt", "missing field 'prompt'"),
    "prompt null": ({"prompt": None}, 400, "prompt", "'prompt' must be a string"),
    "prompt token ids": ({"prompt": [1, 2, 3]}, 400, "prompt", "'prompt' as token ids is not served"),
    "prompt token id lists": ({"prompt": [[1, 2]]}, 400, "prompt", "as token ids"),
    "several prompts": ({"prompt": ["a", "b"]}, 400, "prompt", "'prompt' has 2 prompts"),
    "no prompts": ({"prompt": []}, 400, "prompt", "'prompt' has 0 prompts"),
    "empty prompt": ({"prompt": ""}, 400, "prompt", "'prompt' is empty"),
    "prompt far too long": ({"prompt": "x" * 1_000_000}, 400, "prompt", "handler.max_prompt_tokens"),
    "max_tokens huge": ({"max_tokens": TOO_MANY}, 400, "max_tokens", "between 1 and 256 (handler.max_new_tokens)"),
    "max_tokens 0": ({"max_tokens": 0}, 400, "max_tokens", "'max_tokens' is 0"),
    "max_tokens string": ({"max_tokens": "8"}, 400, "max_tokens", "'max_tokens' must be an integer"),
    "max_tokens float": ({"max_tokens": 8.0}, 400, "max_tokens", "'max_tokens' must be an integer"),
    "temperature negative": ({"temperature": -0.5}, 400, "temperature", "Expected a value >= 0, but got -0.5"),
    "temperature 1e30": ({"temperature": 1e30}, 400, "temperature", "Expected a value <= 2, but got 1e+30"),
    "temperature 5 (OpenAI's bound)": ({"temperature": 5}, 400, "temperature", "Expected a value <= 2, but got 5"),
    "temperature 2.0000001": ({"temperature": 2.0000001}, 400, "temperature", "decimal above maximum value"),
    "temperature NaN": ({"temperature": float("nan")}, 400, "temperature", "Expected a value >= 0, but got nan"),
    "temperature -inf": ({"temperature": float("-inf")}, 400, "temperature", "decimal below minimum value"),
    "temperature NaN string": ({"temperature": "NaN"}, 400, "temperature", "'temperature' must be a number"),
    "temperature bool": ({"temperature": True}, 400, "temperature", "'temperature' must be a number"),
    "top_p above 1": ({"top_p": 1.5}, 400, "top_p", "'top_p' is 1.5; it must be between 0 and 1"),
    "top_p negative": ({"top_p": -0.1}, 400, "top_p", "'top_p' is -0.1"),
    "top_p infinite": ({"top_p": float("inf")}, 400, "top_p", "'top_p' is inf"),
    "top_p string": ({"top_p": "0.9"}, 400, "top_p", "'top_p' must be a number"),
    "seed negative": ({"seed": -1}, 400, "seed", "'seed' is -1"),
    "seed above 2**64": ({"seed": 2**64 + 1}, 400, "seed", "'seed' is 18446744073709551617"),
    "seed float": ({"seed": 1.0}, 400, "seed", "'seed' must be an integer"),
    "stop 100 sequences": ({"stop": ["a"] * 100}, 400, "stop", "'stop' has 100 sequences; at most 4"),
    "stop 10 KB": ({"stop": ["x" * 10_000]}, 400, "stop", "'stop[0]' has 10000 characters; it must have 1 to 256"),
    "stop empty string": ({"stop": ""}, 400, "stop", "'stop' has 0 characters"),
    "stop number": ({"stop": 5}, 400, "stop", "'stop' must be a string or a list of strings"),
    "stop list of numbers": ({"stop": [5]}, 400, "stop", "'stop[0]' must be a string"),
    "n 9": ({"n": 9}, 400, "n", "'n' is 9; it must be between 1 and 8 (handler.max_n)"),
    "n 0": ({"n": 0}, 400, "n", "'n' is 0"),
    "stream string": ({"stream": "true"}, 400, "stream", "'stream' must be true or false"),
    "stream_options without stream": ({"stream_options": {"include_usage": True}}, 400, "stream_options", "only"),
    "stream_options unknown": ({"stream": True, "stream_options": {"x": 1}}, 400, "stream_options", "['x']"),
    "logprobs 6": ({"logprobs": 6}, 400, "logprobs", "'logprobs' is 6; it must be between 0 and 5"),
    "echo": ({"echo": True}, 400, "echo", "'echo' is True"),
    "best_of 2": ({"best_of": 2}, 400, "best_of", "'best_of' is 2"),
    "presence_penalty": ({"presence_penalty": 0.5}, 400, "presence_penalty", "cannot honour"),
    "frequency_penalty": ({"frequency_penalty": -2}, 400, "frequency_penalty", "cannot honour"),
    "logit_bias": ({"logit_bias": {"50256": -100}}, 400, "logit_bias", "cannot honour"),
    "suffix": ({"suffix": "end"}, 400, "suffix", "cannot honour"),
    "unknown field": ({"max_new_tokens": 5}, 400, "max_new_tokens", "unknown field(s) ['max_new_tokens']"),
    "other model": ({"model": "gpt-4o"}, 404, "model", "the model 'gpt-4o' is not served here"),
}


@pytest.mark.parametrize("name", sorted(BAD_COMPLETIONS))
def test_bad_completion_gets_its_own_openai_error_and_the_batch_is_answered(generator, name):
    handler, context = generator
    change, status, param, message = BAD_COMPLETIONS[name]
    good = {"model": "generator", "prompt": "Hello", "max_tokens": 3, "temperature": 0}
    bad = {"model": "generator", "prompt": "Hello", **change}
    if name == "prompt missing":
        del bad["prompt"]
    answers, _ = run(handler, context, [(COMPLETIONS_ROUTE, good), (COMPLETIONS_ROUTE, bad), ("", {"prompt": "Hi"})])
    assert statuses(context, 3) == [200, status, 200]
    error = json.loads(answers[1])["error"]
    assert message in error["message"] and error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["code"] == OPENAI_CODES.get(name, "model_not_found" if status == 404 else "invalid_request")
    assert json.loads(answers[0])["usage"]["completion_tokens"] == 3


# The codes OpenAI's API answers for a temperature outside its bounds.
OPENAI_CODES = {
    "temperature negative": "decimal_below_min_value",
    "temperature 1e30": "decimal_above_max_value",
    "temperature 5 (OpenAI's bound)": "decimal_above_max_value",
    "temperature 2.0000001": "decimal_above_max_value",
    "temperature NaN": "decimal_below_min_value",
    "temperature -inf": "decimal_below_min_value",
}


def test_openai_routes_follow_openais_temperature_bounds_and_the_native_api_keeps_its_own(generator):
    handler, context = generator
    requests = [
        (CHAT_ROUTE, {"messages": HI, "max_tokens": 2, "temperature": 5, "seed": 1}),
        (COMPLETIONS_ROUTE, {"prompt": "Hi", "max_tokens": 2, "temperature": 2, "seed": 1}),
        ("", {"prompt": "Hi", "max_new_tokens": 2, "temperature": 5, "seed": 1}),  # handler.max_temperature 5.0
    ]
    answers, _ = run(handler, context, requests)
    assert statuses(context, 3) == [400, 200, 200]
    error = json.loads(answers[0])["error"]
    assert error["code"] == "decimal_above_max_value" and error["param"] == "temperature"
    assert "Expected a value <= 2, but got 5 instead" in error["message"]


def test_a_model_limit_below_openais_is_still_enforced_on_the_openai_routes(prepared_model_dir):
    handler, context = load_handler(prepared_model_dir("generator"), "generator", {"max_temperature": 1.0})
    answers, _ = run(handler, context, [(COMPLETIONS_ROUTE, {"prompt": "Hi", "max_tokens": 2, "temperature": 1.5})])
    assert statuses(context, 1) == [400]
    assert "(handler.max_temperature)" in json.loads(answers[0])["error"]["message"]


BAD_CHATS = {
    "messages missing": (None, 400, "missing field 'messages'"),
    "messages not a list": ("Hi", 400, "'messages' must be a list"),
    "messages empty": ([], 400, "'messages' is empty"),
    "too many messages": ([{"role": "user", "content": ""}] * 300, 400, "'messages' has 300 messages"),
    "message not an object": (["Hi"], 400, "'messages[0]' must be an object"),
    "tool without call id": ([{"role": "tool", "content": "x"}], 400, "its 'tool_call_id' must name the call"),
    "call id on a user": ([{"role": "user", "content": "x", "tool_call_id": "1"}], 400, "only a message of role tool"),
    "unknown role": ([{"role": "robot", "content": "x"}], 400, "'messages[0].role' is 'robot'"),
    "no content": ([{"role": "user"}], 400, "'messages[0]' has no 'content'"),
    "null content": ([{"role": "user", "content": None}], 400, "'messages[0].content' must be a string"),
    "image part": (
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
        400,
        "'messages[0].content[0]' must be an object",
    ),
    "tool calls": (
        [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}],
        400,
        "'messages[0].tool_calls[0]' must be",
    ),
    "far too long": ([{"role": "user", "content": "x" * 1_000_000}], 400, "handler.max_prompt_tokens"),
    "too many tokens": ([{"role": "user", "content": "\x01" * 300}], 400, "'messages' has 3"),
    "lone surrogate": ([{"role": "user", "content": "a\ud800"}], 400, "not valid Unicode"),
}


@pytest.mark.parametrize("name", sorted(BAD_CHATS))
def test_bad_chat_gets_its_own_openai_error(generator, name):
    handler, context = generator
    messages, status, message = BAD_CHATS[name]
    bad = {"model": "generator"} if messages is None else {"model": "generator", "messages": messages}
    good = {"messages": HI, "max_tokens": 2}
    answers, _ = run(handler, context, [(CHAT_ROUTE, bad), (CHAT_ROUTE, good)])
    assert statuses(context, 2) == [status, 200]
    error = json.loads(answers[0])["error"]
    assert message in error["message"] and error["param"] == "messages"


@pytest.mark.parametrize(
    "change, param",
    [
        ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"logprobs": 1}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens"),
        ({"max_completion_tokens": 10**9}, "max_completion_tokens"),
        ({"prompt": "Hi"}, "prompt"),  # a completions field sent to chat is unknown there
    ],
)
def test_chat_refuses_what_it_cannot_honour_naming_the_field(served, change, param):
    with pytest.raises(RequestError) as refused:
        parse_openai(CHAT_ROUTE, {"messages": HI, **change}, served)
    assert refused.value.code == 400 and refused.value.to_body()["error"]["param"] == param


def test_every_unservable_field_is_refused_unless_neutral(served):
    for key in NEUTRAL:
        route = COMPLETIONS_ROUTE if key in ("echo", "best_of", "suffix") else CHAT_ROUTE
        body = {"prompt": "Hi"} if route == COMPLETIONS_ROUTE else {"messages": HI}
        with pytest.raises(RequestError) as refused:
            parse_openai(route, {**body, key: "something else"}, served)
        assert refused.value.to_body()["error"]["param"] == key


def test_unparseable_body_and_unknown_route_are_refused(generator):
    handler, context = generator
    answers, _ = run(
        handler, context, [(CHAT_ROUTE, b'{"messages": '), ("v1/embeddings", {"input": "x"}), (CHAT_ROUTE, None)]
    )
    assert statuses(context, 3) == [400, 404, 400]
    assert "not valid JSON" in json.loads(answers[0])["error"]["message"]
    assert "v1/chat/completions" in json.loads(answers[1])["message"]  # the base's 404 names the served routes
    assert "must be a JSON object" in json.loads(answers[2])["error"]["message"]


def test_the_native_api_is_unchanged_and_takes_no_openai_fields(generator):
    handler, context = generator
    answers, _ = run(handler, context, [("", {"prompt": "Hi", "top_p": 0.5}), ("", {"prompt": "Hi", "stop": "x"})])
    assert statuses(context, 2) == [400, 400]
    assert all("unknown field(s)" in json.loads(answer)["message"] for answer in answers)


# ------------------------------------------------------------------------------------------------------ streaming
def test_streamed_chat_is_sse_chunks_that_add_up_to_the_plain_answer(generator):
    handler, context = generator
    body = {"model": "generator", "messages": HI, "max_tokens": 24, "temperature": 0.9, "seed": 21}
    plain = json.loads(one(handler, context, CHAT_ROUTE, body)[0])
    final, messages = one(handler, context, CHAT_ROUTE, {**body, "stream": True})
    assert context.get_response_content_type(0) == "text/event-stream"
    got = stream_events(messages, final)
    assert len(messages) >= 3 and got[-1] == "[DONE]"
    chunks = got[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert chat_text(chunks) == plain["choices"][0]["message"]["content"]
    assert all("usage" not in c for c in chunks)  # only with stream_options.include_usage


def test_sse_chunks_on_the_wire_are_event_streams_for_their_request_only(generator):
    from handlers.generation.streaming import send_chunks
    from tests.unit.test_generator_handler import FakeSocket, parse_predict_response

    handler, context = generator
    requests = [
        (CHAT_ROUTE, {"messages": HI, "max_tokens": 10, "temperature": 0, "stream": True}),
        ("", {"prompt": "Hi"}),
    ]
    set_requests(context, [{**JSON, "url_path": route} for route, _ in requests])
    context.request_ids = {0: "request-0", 1: "request-1"}
    context.cl_socket = FakeSocket()
    handler.stream_sink = send_chunks  # the real path: ts.handler_utils.utils.send_intermediate_predict_response
    try:
        handler.handle([{"body": body} for _, body in requests], context)
        messages = [parse_predict_response(message) for message in context.cl_socket.sent]
    finally:
        del context.cl_socket
        context.request_ids = None
    assert len(messages) >= 2
    for code, predictions in messages:
        assert code == 200 and list(predictions) == ["request-0"]
        chunk = predictions["request-0"]
        assert chunk["headers"]["ts_stream_next"] == "true" and chunk["content_type"] == "text/event-stream"
        [event] = events(chunk["body"])
        assert event["object"] == "chat.completion.chunk" and event["choices"][0]["finish_reason"] is None


def test_streamed_completion_with_usage_ends_with_a_usage_chunk_then_done(generator):
    handler, context = generator
    body = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.8, "seed": 5}
    plain = json.loads(one(handler, context, COMPLETIONS_ROUTE, body)[0])
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    final, messages = one(handler, context, COMPLETIONS_ROUTE, streamed)
    got = stream_events(messages, final)
    *chunks, usage_chunk, done = got
    assert done == "[DONE]" and usage_chunk["choices"] == [] and usage_chunk["usage"] == plain["usage"]
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]


def test_native_ndjson_sse_and_plain_requests_share_one_batch(generator):
    handler, context = generator
    native = {"prompt": "Hello", "max_new_tokens": 12, "temperature": 0.7, "seed": 9}
    completion = {"prompt": "Hello", "max_tokens": 12, "temperature": 0.7, "seed": 9}
    requests = [
        ("", {**native, "stream": True}),
        (COMPLETIONS_ROUTE, {**completion, "stream": True}),
        (COMPLETIONS_ROUTE, completion),
        ("", native),
    ]
    answers, messages = run(handler, context, requests)
    assert statuses(context, 4) == [200] * 4
    assert all(set(message) <= {0, 1} for message in messages)
    ndjson = [json.loads(message[0]) for message in messages if 0 in message] + [json.loads(answers[0])]
    sse = stream_events(messages, answers[1], idx=1)[:-1]
    text = json.loads(answers[3])["text"]
    assert "".join(line["text"] for line in ndjson) == text
    assert "".join(c["choices"][0]["text"] for c in sse) == text == json.loads(answers[2])["choices"][0]["text"]


def test_a_stream_that_fails_before_its_first_chunk_gets_a_plain_error_after_it_an_error_event(generator, monkeypatch):
    handler, context = generator
    import handlers.generation.loop as loop_module

    def broken_generate(*args, **kwargs):
        raise RuntimeError("simulated decoding failure")

    monkeypatch.setattr(loop_module, "generate", broken_generate)
    body = {"messages": HI, "stream": True}
    answers, _ = run(handler, context, [(CHAT_ROUTE, body), ("", {"prompt": "Hi", "stream": True})])
    assert statuses(context, 2) == [500, 500]
    assert json.loads(answers[0])["error"]["type"] == "server_error"  # JSON, which the client reads with the status
    assert context.get_response_content_type(0) == "application/json"
    assert json.loads(answers[1])["done"] is True  # the native NDJSON stream keeps its documented last line

    # After a chunk went out the status is 200 already: the stream ends with an error event, then [DONE].
    from handlers.generation.openai_api import ChatAnswers

    closing = ChatAnswers("chatcmpl-x", 0, "generator", "").stream_error(RequestError("x", 500).to_openai_body())
    assert events(closing) == [
        {"error": {"message": "x", "type": "server_error", "param": None, "code": "invalid_request"}},
        "[DONE]",
    ]


# ------------------------------------------------------------------------------------------------------ stop
def unstopped(handler, context, route, body):
    answer = json.loads(one(handler, context, route, body)[0])
    choice = answer["choices"][0]
    return choice.get("text", choice.get("message", {}).get("content")), answer


def test_stop_sequence_ends_the_text_before_it_with_finish_reason_stop(generator):
    handler, context = generator
    body = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}
    text, free = unstopped(handler, context, COMPLETIONS_ROUTE, body)
    stop = text[10:13]
    cut = text.index(stop)
    answer = json.loads(one(handler, context, COMPLETIONS_ROUTE, {**body, "stop": [stop, "\x00never"]})[0])
    choice = answer["choices"][0]
    assert choice["text"] == text[:cut] and choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] < free["usage"]["completion_tokens"]  # it left the batch early
    # streamed: the same text, and no piece of the stop sequence ever went out
    final, messages = one(handler, context, COMPLETIONS_ROUTE, {**body, "stop": stop, "stream": True})
    chunks = stream_events(messages, final)[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == text[:cut]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_the_earliest_of_several_stop_sequences_wins_in_chat(generator):
    handler, context = generator
    body = {"messages": HI, "max_tokens": 40, "temperature": 0}
    text, _ = unstopped(handler, context, CHAT_ROUTE, body)
    early, late = text[4:6], text[20:23]
    answer = json.loads(one(handler, context, CHAT_ROUTE, {**body, "stop": [late, early]})[0])
    assert answer["choices"][0]["message"]["content"] == text[: text.index(early)]
    assert answer["choices"][0]["finish_reason"] == "stop"


class CharTokenizer:
    """Each token id is one character (chr(id)): stop sequences can be checked against exact texts."""

    def decode(self, ids, **kwargs):
        return "".join(chr(i) for i in ids)


def test_answer_text_holds_back_what_could_become_a_stop_sequence():
    text = AnswerText(CharTokenizer(), [ord("p")], stop=("END", "xy"))
    sent = []
    for char in "abcENxEN":
        text.push(ord(char))
        sent.append(text.take())
    # "E" and "EN" could start "END", "x" could start "xy": held back until they cannot
    assert sent == ["a", "b", "c", "", "", "EN", "x", ""] and not text.stopped
    text.push(ord("D"))
    assert text.stopped and text.text == "abcENx" and text.take() == "" and text.rest() == ""
    text.push(ord("z"))  # nothing changes once stopped
    assert text.text == "abcENx"
    free = AnswerText(CharTokenizer(), [ord("p")], stop=("END",))
    for char in "aEN":
        free.push(ord(char))
    assert free.take() == "a"
    free.finish()
    assert free.rest() == "EN" and not free.stopped  # generation ended: the held-back text was not a stop


# ------------------------------------------------------------------------------------------------------ top_p
def test_top_p_zero_is_greedy_and_top_p_one_draws_as_without_it():
    logits = torch.randn(512, generator=torch.Generator().manual_seed(0))
    draw = lambda s: choose_token(logits, s, torch.Generator().manual_seed(4))  # noqa: E731
    assert draw(SamplingSettings(1, temperature=1.0, top_p=0.0)) == int(logits.argmax())
    assert draw(SamplingSettings(1, temperature=1.0, top_p=1.0)) == draw(SamplingSettings(1, temperature=1.0))


def test_top_p_draws_only_from_the_nucleus():
    logits = torch.tensor([4.0, 3.0, 0.5] + [-5.0] * 509)
    probabilities = torch.softmax(logits.double(), -1)
    assert probabilities[:2].sum() > 0.9 > probabilities[0]
    generator = torch.Generator().manual_seed(1)
    draws = {choose_token(logits, SamplingSettings(1, temperature=1.0, top_p=0.9), generator) for _ in range(300)}
    assert draws == {0, 1}


# ------------------------------------------------------------------------------------------------------ chat template
def test_without_a_chat_template_messages_render_as_plain_role_lines(served):
    assert not chat.has_chat_template(served.tokenizer)  # the demo model has none
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hi", "name": "bot", "refusal": None},
        {"role": "developer", "content": "Answer in English."},
        {"role": "user", "content": "again <|endoftext|>"},
    ]
    request = parse_openai(CHAT_ROUTE, {"messages": messages}, served)
    expected = (
        "system: Be brief.\nuser: Hello\nthere\nassistant (bot): Hi\nsystem: Answer in English.\n"
        "user: again <|endoftext|>\nassistant:"
    )
    assert served.tokenizer.decode(request.prompt_ids) == expected
    # The special token written in a message is text, not the end-of-text token: a message cannot end the prompt.
    assert served.tokenizer.convert_tokens_to_ids("<|endoftext|>") not in request.prompt_ids


def test_a_model_chat_template_is_rendered_as_transformers_does(prepared_model_dir, served):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepared_model_dir("generator") / "lm", local_files_only=True)
    tokenizer.chat_template = (
        "{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}"
    )
    with_template = Served(served.model_name, served.model_info, served.limits, tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    request = parse_openai(CHAT_ROUTE, {"messages": messages}, with_template)
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert request.prompt_ids == list(expected)
    assert tokenizer.decode(request.prompt_ids).endswith("<|endoftext|>assistant\n")

    tokenizer.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(RequestError, match="the model's chat template refused 'messages': Conversation roles"):
        parse_openai(CHAT_ROUTE, {"messages": messages}, with_template)


def test_describe_names_the_openai_routes_the_template_and_the_choices_limit(generator):
    handler, context = generator
    set_requests(context, [{"describe": "True"}])
    [described] = handler.handle([{"body": b""}], context)
    described = json.loads(described)
    assert described["openai"] == {
        "routes": ["/predictions/generator/1.0/v1/completions", "/predictions/generator/1.0/v1/chat/completions"],
        "chat_template": "plain",
        "tools": True,  # the plain template shows tools
    }
    assert described["limits"]["max_n"] == handler.loaded.limits.max_n > 1


# ------------------------------------------------------------------------------------------------------ fuzzing
LIMITS = GenerationLimits(
    max_prompt_tokens=16,
    max_new_tokens=64,
    default_max_new_tokens=8,
    max_temperature=5.0,
    vocab_size=512,
    max_prompt_chars=17 * 16,
    max_n=4,
)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "echo",
    "user",
    "best_of",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
]
near_valid = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.text(max_size=40) | st.lists(st.text(max_size=10), max_size=2) | json_values,
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]), "content": json_values}
            ),
            max_size=3,
        )
        | json_values,
        "max_tokens": st.integers(-3, 100) | json_scalars,
        "temperature": st.floats() | json_scalars,
        "top_p": st.floats() | json_scalars,
        "seed": st.integers(-3, 2**65) | json_scalars,
        "stop": st.lists(st.text(max_size=300), max_size=6) | json_values,
        "n": st.integers(-1, 3) | json_scalars,
        "logprobs": st.booleans() | st.integers(-1, 6) | json_scalars,
        "top_logprobs": st.integers(-1, 21) | json_scalars,
        "stream": json_scalars,
        "model": st.sampled_from(["generator", "other"]) | json_scalars,
    },
) | st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)


@settings(max_examples=300, deadline=None)
@given(body=near_valid | json_values, chat_route=st.booleans())
def test_any_openai_body_is_accepted_within_limits_or_refused_with_a_4xx(served, body, chat_route):
    limited = Served(served.model_name, served.model_info, LIMITS, served.tokenizer)
    try:
        request = parse_openai(CHAT_ROUTE if chat_route else COMPLETIONS_ROUTE, body, limited)
    except RequestError as error:
        assert error.code in (400, 404) and error.to_body()["error"]["message"]
        return
    assert 1 <= len(request.prompt_ids) <= LIMITS.max_prompt_tokens
    assert 1 <= request.settings.max_new_tokens <= LIMITS.max_new_tokens
    assert 0 <= request.settings.temperature <= LIMITS.max_temperature and 0 <= request.settings.top_p <= 1
    assert 0 <= request.settings.seed <= MAX_SEED and len(request.stop) <= 4
    assert all(1 <= len(stop) <= 256 for stop in request.stop) and isinstance(request.stream, bool)
    assert request.settings.logprobs is None or 0 <= request.settings.logprobs <= (20 if chat_route else 5)
    assert 1 <= request.n <= LIMITS.max_n
