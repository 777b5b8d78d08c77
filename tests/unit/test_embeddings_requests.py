"""Embedding request validation and response shapes at the model's own URL and OpenAI's route
(handlers/text/dialects/native.py, openai.py), without a model."""

import pytest
import torch

from handlers.core.errors import RequestError
from handlers.text.cache import CachedRow
from handlers.text.dialects.native import EmbeddingRequest, parse_embedding, write_embedding
from handlers.text.dialects.openai import OpenAIEmbeddingRequest, parse_embeddings
from handlers.text.requests.common import TextLimits
from handlers.text.requests.embedding import NO_PROMPTS, VectorSpace

JSON = "application/json"
LIMITS = TextLimits(max_inputs=4, max_text_chars=100, max_request_chars=250)


SPACE = VectorSpace(384)


def parse(body, content_type=JSON, limits=LIMITS):
    return parse_embedding(body, content_type, SPACE, limits)


def format_response(request, rows, model_name):
    return write_embedding(request, rows, model_name, SPACE)


def test_plain_text_body_is_one_text():
    request = parse("A sentence.", "text/plain")
    assert isinstance(request, EmbeddingRequest) and (request.texts, request.truncate) == (["A sentence."], True)


def test_plain_text_bytes_are_decoded_as_utf8():
    assert parse("café ☕".encode(), "text/plain").texts == ["café ☕"]


def test_text_field_and_truncate_flag():
    request = parse({"text": "hello", "truncate": False})
    assert isinstance(request, EmbeddingRequest) and (request.texts, request.truncate) == (["hello"], False)


def test_openai_shape_with_a_string_or_a_list():
    single = parse({"input": "one", "model": "whatever", "user": "u1", "encoding_format": "float", "dimensions": 384})
    assert isinstance(single, OpenAIEmbeddingRequest) and (single.texts, single.names) == (["one"], ["'input'"])
    many = parse({"input": ["a", "b", "c"]})
    assert many.texts == ["a", "b", "c"] and many.names == ["'input'[0]", "'input'[1]", "'input'[2]"]


def test_json_body_that_torchserve_could_not_parse_is_parsed_here():
    assert parse(b'{"text": "from bytes"}', "application/octet-stream").texts == ["from bytes"]


BAD = {
    "invalid utf-8 json": (b'{"text": "\xff"}', JSON, "not valid UTF-8"),
    "invalid utf-8 text": (b"caf\xe9", "text/plain", "not valid UTF-8 (byte 3)"),
    "invalid json": (b'{"text": ', JSON, "not valid JSON"),
    "json string": ("just a string", JSON, "JSON object"),
    "json list": (["a", "b"], JSON, "got list"),
    "json number": (b"42", JSON, "got int"),
    "empty body": (None, JSON, "body is empty"),
    "empty plain text": ("", "text/plain", "body is empty"),
    "whitespace plain text": ("  \n\t ", "text/plain", "body is empty"),
    "missing text": ({"txt": "x"}, JSON, "missing field 'text'"),
    "both text and input": ({"text": "a", "input": "b"}, JSON, "not both"),
    "unknown field": ({"text": "a", "normalize": False}, JSON, "unknown field(s) ['normalize']"),
    "openai field on text shape": ({"text": "a", "model": "m"}, JSON, "unknown field(s) ['model']"),
    "empty text": ({"text": ""}, JSON, "'text' is empty"),
    "text not a string": ({"text": 5}, JSON, "'text' is int, not a string"),
    "null text": ({"text": None}, JSON, "'text' is NoneType"),
    "lone surrogate": ({"text": "bad \ud800 text"}, JSON, "unpaired surrogate at character 4"),
    "truncate not bool": ({"text": "a", "truncate": "no"}, JSON, "'truncate' must be true or false"),
    "empty input list": ({"input": []}, JSON, "non-empty list"),
    "input object": ({"input": {"a": 1}}, JSON, "non-empty list"),
    "non-string item": ({"input": ["a", 3]}, JSON, "'input'[1] is int, not a string"),
    "token id array": ({"input": [[101, 102]]}, JSON, "token-id arrays are not supported"),
    "token ids for langchain": ({"input": [[101, 102]]}, JSON, "check_embedding_ctx_length=False"),
    "one token id array": ({"input": [101, 7592, 102]}, JSON, "'input' is token ids: token-id arrays"),
    "empty item": ({"input": ["a", ""]}, JSON, "'input'[1] is empty"),
    "unknown encoding": ({"input": "a", "encoding_format": "float16"}, JSON, "use one of 'float', 'base64', 'int8'"),
    "null encoding": ({"input": "a", "encoding_format": None}, JSON, "'encoding_format' None is not supported"),
    "other dimensions": ({"input": "a", "dimensions": 256}, JSON, "'dimensions' 256 is not supported"),
    "dimensions as string": ({"input": "a", "dimensions": "384"}, JSON, "'dimensions' '384'"),
    "model not a string": ({"input": "a", "model": 1}, JSON, "'model' must be a string"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_request_is_refused_with_a_message_naming_the_problem(case):
    body, content_type, fragment = BAD[case]
    with pytest.raises(RequestError) as raised:
        parse(body, content_type)
    assert raised.value.code == 400
    assert fragment in raised.value.message


TOO_LARGE = {
    "too many inputs": (
        {"input": ["a"] * 5},
        JSON,
        "'input' has 5 items; at most 4 are allowed per request (handler.max_inputs)",
    ),
    "long text field": ({"text": "x" * 101}, JSON, "'text' has 101 characters; handler.max_text_chars is 100"),
    "long input string": ({"input": "é" * 101}, JSON, "'input' has 101 characters; handler.max_text_chars is 100"),
    "long list item": (
        {"input": ["a", "🙂" * 101]},
        JSON,
        "'input'[1] has 101 characters; handler.max_text_chars is 100",
    ),
    "long plain text": ("y" * 101, "text/plain", "body has 101 characters; handler.max_text_chars is 100"),
    "long plain text bytes": (("ü" * 101).encode(), "text/plain", "body has 101 characters"),
    "long but only whitespace": ({"text": " " * 101}, JSON, "handler.max_text_chars is 100"),  # length first
    "texts together too long": (
        {"input": ["z" * 100, "z" * 100, "z" * 51]},
        JSON,
        "the request's texts have 251 characters together; handler.max_request_chars is 250",
    ),
}


@pytest.mark.parametrize("case", sorted(TOO_LARGE))
def test_a_request_over_a_size_limit_gets_413_naming_the_limit(case):
    body, content_type, message = TOO_LARGE[case]
    with pytest.raises(RequestError) as raised:
        parse(body, content_type)
    assert (raised.value.code, raised.value.error_type) == (413, "RequestTooLarge")
    assert message in raised.value.message


def test_requests_at_every_size_limit_are_accepted():
    assert parse({"text": "x" * 100}).texts == ["x" * 100]
    assert parse("🙂" * 100, "text/plain").texts == ["🙂" * 100]
    assert len(parse({"input": ["z" * 100, "z" * 100, "z" * 50]}).texts) == 3
    assert len(parse({"input": ["a"] * 4}).texts) == 4


def row(values, tokens, truncated=False):
    return CachedRow(torch.tensor(values, dtype=torch.float32), tokens, truncated)


def test_text_response_has_the_embedding_and_the_truncation_flag():
    answer = format_response(parse({"text": "a"}), [row([0.6, 0.8], 3, True)], "minilm")
    assert answer == {"embedding": [pytest.approx(0.6), pytest.approx(0.8)], "truncated": True}


def test_openai_response_lists_rows_in_order_and_counts_tokens():
    request = parse({"input": ["a", "b", "c"]})
    rows = [row([1.0, 0.0], 4), row([0.0, 1.0], 7, True), row([0.6, 0.8], 3)]
    answer = format_response(request, rows, "minilm")
    assert answer["object"] == "list" and answer["model"] == "minilm"
    assert [item["index"] for item in answer["data"]] == [0, 1, 2]
    assert all(item["object"] == "embedding" for item in answer["data"])
    assert [item["embedding"] for item in answer["data"]] == [r.value.tolist() for r in rows]
    assert [item["truncated"] for item in answer["data"]] == [False, True, False]
    assert answer["usage"] == {"prompt_tokens": 14, "total_tokens": 14}


def test_base64_encoding_is_the_little_endian_float32_bytes_the_openai_client_decodes():
    import base64

    import numpy as np

    request = parse({"input": ["a", "b"], "encoding_format": "base64"})
    values = [[0.1, -2.5, 3e-8], [1.0, 0.0, -0.0]]
    answer = format_response(request, [row(v, 2) for v in values], "minilm")
    decoded = [np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in answer["data"]]
    for got, want in zip(decoded, values, strict=True):
        assert np.array_equal(got, np.array(want, dtype=np.float32))
    assert parse({"input": "a"}).encoding == "float"


def test_a_non_finite_row_is_a_500_in_base64_as_in_float():
    request = parse({"input": ["a"], "encoding_format": "base64"})
    answer = format_response(request, [row([float("nan"), 0.0], 2)], "minilm")
    assert isinstance(answer, RequestError) and answer.code == 500 and "non-finite" in answer.message


def test_floats_are_marked_float32_so_to_json_prints_their_shortest_text():
    from handlers.core.http import to_json

    answer = format_response(parse({"text": "a"}), [row([0.1, -0.2], 3)], "minilm")
    assert to_json(answer) == '{"embedding":[0.1,-0.2],"truncated":false}'


def route(body, content_type=JSON):
    return parse_embeddings(body, content_type, SPACE, LIMITS, NO_PROMPTS, "minilm")


def test_openai_route_takes_the_openai_shape_naming_the_served_model():
    request = route({"input": ["a"], "model": "minilm", "encoding_format": "base64", "dimensions": 384})
    assert (request.texts, request.encoding, request.served_model) == (["a"], "base64", "minilm")
    assert route({"input": "a"}).served_model == "minilm"  # 'model' left out: the URL's model
    answer = format_response(request, [row([1.0, 0.0], 2)], "manifest-name")
    assert answer["model"] == "minilm"


ROUTE_BAD = {
    "other model": ({"input": "a", "model": "text-embedding-3-small"}, 404, "send model='minilm'"),
    "text shape": ({"text": "a", "model": "minilm"}, 400, "takes OpenAI's embeddings body"),
    "plain text": (b"just text", 400, "takes OpenAI's embeddings body"),
    "dimensions 7": ({"input": "a", "model": "minilm", "dimensions": 7}, 400, "fixed 384 dimensions"),
}


@pytest.mark.parametrize("case", sorted(ROUTE_BAD))
def test_openai_route_refuses_what_it_cannot_serve(case):
    body, code, fragment = ROUTE_BAD[case]
    with pytest.raises(RequestError) as raised:
        route(body, "text/plain" if isinstance(body, bytes) else JSON)
    assert raised.value.code == code and fragment in raised.value.message, raised.value.message


def test_openai_error_body_is_what_openai_clients_read():
    error = RequestError("model 'x' is not served", code=404, error_type="ModelNotFound")
    assert error.to_openai_body() == {
        "error": {
            "message": "model 'x' is not served",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    assert RequestError("boom", code=500, error_type="InternalServerError").to_openai_body()["error"]["type"] == (
        "server_error"
    )


def test_each_api_gets_its_own_error_shape_with_the_message_where_its_clients_read_it():
    from handlers.core.errors import COHERE, NATIVE, OPENAI, RERANK_V1, TEI, ShapedError, error_body, shaped

    error = RequestError("'top_n' must be a positive integer", code=400)
    assert error_body(error, NATIVE) == {"code": 400, "type": "InvalidRequest", "message": error.message}
    assert error_body(error, OPENAI)["error"]["message"] == error.message
    assert error_body(error, COHERE) == {"message": error.message}
    assert error_body(error, RERANK_V1) == {"message": error.message, "detail": error.message}
    assert error_body(error, TEI) == {"error": error.message, "error_type": "Validation"}
    assert error_body(RequestError("boom", code=500), TEI)["error_type"] == "Backend"
    moved = shaped(error, COHERE)
    assert isinstance(moved, ShapedError) and moved.to_body() == {"message": error.message} and moved.code == 400
    assert ShapedError("x", 404, "model").to_body()["error"]["param"] == "model"  # OpenAI's by default
