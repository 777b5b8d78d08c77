"""The generator through a real TorchServe started from config.properties (session server, free ports).

Streaming is checked on the wire: the client reads the HTTP chunks as they arrive (requests' iter_content with
chunk_size=None yields one chunk of the chunked transfer encoding at a time). The archive is served with per-step
scheduling (continuousBatching): requests join and leave the running batch between steps.
"""

import concurrent.futures
import json
import threading
import time

import pytest
import requests

from loadtests.generator_systems import post_on_socket
from loadtests.prometheus import parse
from scripts.ops.grpc_client import TorchServeGrpc
from tests.conftest import skip_unless_served

MODEL = "generator"


@pytest.fixture(scope="module", autouse=True)
def served(ts_server):
    skip_unless_served(ts_server, MODEL)


@pytest.fixture(scope="module")
def url(ts_server):
    return f"{ts_server.inference_url}/predictions/{MODEL}"


def stream(url, body):
    """POST with "stream": true; returns (response, the raw HTTP chunks, the parsed NDJSON lines)."""
    response = requests.post(url, json={**body, "stream": True}, stream=True, timeout=60)
    chunks = [chunk for chunk in response.iter_content(chunk_size=None) if chunk]
    lines = [json.loads(line) for line in b"".join(chunks).decode("utf-8").splitlines()]
    return response, chunks, lines


def test_plain_request_answers_text_counts_and_random_weights_label(predict):
    response = predict(MODEL, json={"prompt": "Hello world", "max_new_tokens": 12})
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    answer = response.json()
    assert isinstance(answer["text"], str) and answer["text"]
    assert answer["completion_tokens"] == 12 or answer["finish_reason"] == "stop"
    assert answer["finish_reason"] in ("length", "stop") and answer["prompt_tokens"] > 0
    assert answer["model"] == {"name": "tiny-gpt2-random", "weights": "random (demo)"}
    # greedy decoding is deterministic
    assert predict(MODEL, json={"prompt": "Hello world", "max_new_tokens": 12}).json()["text"] == answer["text"]


def test_stream_arrives_in_several_chunks_that_add_up_to_the_plain_answer(predict, url):
    body = {"prompt": "Once upon a time", "max_new_tokens": 24, "temperature": 0.9, "top_k": 100, "seed": 21}
    plain = predict(MODEL, json=body).json()
    response, chunks, lines = stream(url, body)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/x-ndjson")
    assert response.headers.get("Transfer-Encoding") == "chunked"
    # Text before the final chunk: the first token's at least (later ones may share a chunk when steps share a
    # TorchServe call, handler.decode_call_ms).
    assert len(chunks) >= 2
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert "".join(line["text"] for line in lines) == plain["text"]
    final = lines[-1]
    for key in ("finish_reason", "prompt_tokens", "completion_tokens", "seed", "model"):
        assert final[key] == plain[key]


def test_concurrent_streamed_and_plain_requests_each_get_their_own_text(predict, url):
    bodies = [
        {"prompt": "Hello world", "max_new_tokens": 20, "temperature": 0.9, "seed": 11},
        {"prompt": "The quick brown fox jumps over", "max_new_tokens": 5},
        {"prompt": "Once upon a time", "max_new_tokens": 30, "temperature": 1.3, "top_k": 40, "seed": 2},
        {"prompt": "A", "max_new_tokens": 12},
    ]
    expected = [predict(MODEL, json=body).json()["text"] for body in bodies]

    def send(index):
        body = bodies[index % len(bodies)]
        if index < len(bodies):
            return requests.post(url, json=body, timeout=60).json()["text"]
        _, _, lines = stream(url, body)
        assert lines[-1]["done"] is True
        return "".join(line["text"] for line in lines)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        texts = list(pool.map(send, range(2 * len(bodies))))
    assert texts == expected + expected


@pytest.mark.parametrize(
    "body, message",
    [
        ({"prompt": ""}, "'prompt' is empty"),
        ({"prompt": "x", "max_new_tokens": -1}, "'max_new_tokens' is -1"),
        ({"prompt": "x", "max_new_tokens": 100000}, "between 1 and"),
        ({"prompt": "x", "temperature": -1}, "'temperature' is -1"),
        ({"prompt": "x", "top_k": "5"}, "'top_k' must be an integer"),
        ({"prompt": "x", "stream": True, "nucleus": 0.9}, "unknown field(s) ['nucleus']"),
        (b'{"prompt": ', "not valid JSON"),
    ],
)
def test_bad_request_gets_400_json_and_the_next_good_one_succeeds(predict, body, message):
    if isinstance(body, bytes):
        response = predict(MODEL, data=body, headers={"Content-Type": "application/json"})
    else:
        response = predict(MODEL, json=body)
    assert response.status_code == 400
    error = response.json()
    assert error["code"] == 400 and message in error["message"]
    good = predict(MODEL, json={"prompt": "Hello", "max_new_tokens": 2})
    assert good.status_code == 200 and good.json()["completion_tokens"] in (1, 2)


def test_a_tiny_temperature_does_not_fail_the_requests_batched_with_it(url):
    """Regression (issue 11, repro 1): temperature 1e-40 made choose_token raise and all 4 requests got 500."""
    good = {"prompt": "hi", "max_new_tokens": 4}
    bodies = [good, {**good, "temperature": 1e-40}, good, {**good, "temperature": 1e-300, "seed": 5}]
    for _ in range(3):  # sent together, so they share batches (batchSize 4, maxBatchDelay 10 ms)
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            responses = list(pool.map(lambda body: requests.post(url, json=body, timeout=60), bodies))
        assert [r.status_code for r in responses] == [200, 200, 200, 200], [r.text[:200] for r in responses]
        texts = {r.json()["text"] for r in responses}
        assert len(texts) == 1  # a vanishing temperature samples greedy's token


def counter(ts_server, name):
    text = requests.get(f"{ts_server.metrics_url}/metrics", timeout=30).text
    return sum(
        value for (metric, labels), value in parse(text).items() if metric == name and ("ModelName", MODEL) in labels
    )


def test_a_short_request_is_answered_while_a_long_stream_goes_on(predict, url):
    """Per-step scheduling: the short request joins the running batch and leaves as soon as it is done."""
    long_body = {"prompt": "Once upon a time", "max_new_tokens": 256, "temperature": 0.8, "seed": 5}
    ended = threading.Event()
    result = {}

    def long_stream():
        response = requests.post(url, json={**long_body, "stream": True}, stream=True, timeout=120)
        lines = []
        for line in response.iter_lines():
            lines.append(json.loads(line))
            if len(lines) == 1:
                result["first"] = True
        ended.set()
        result["lines"] = lines

    thread = threading.Thread(target=long_stream)
    thread.start()
    deadline = time.monotonic() + 60
    while "first" not in result and time.monotonic() < deadline:
        time.sleep(0.005)
    short = predict(MODEL, json={"prompt": "Hello", "max_new_tokens": 3})
    short_done_while_long_ran = not ended.is_set()
    thread.join(timeout=120)
    assert short.status_code == 200 and short.json()["completion_tokens"] == 3
    assert "Content-Length" in short.headers  # a plain answer is one response, not a chunked stream
    assert short_done_while_long_ran
    lines = result["lines"]
    assert lines[-1]["done"] is True and lines[-1]["completion_tokens"] == 256
    assert "".join(line["text"] for line in lines) == predict(MODEL, json=long_body).json()["text"]


def test_a_stream_whose_client_goes_away_stops_decoding(ts_server, predict):
    """TorchServe drops the job of a closed connection from the next step; the worker frees its rows."""
    generated, cancelled = counter(ts_server, "GeneratedTokens"), counter(ts_server, "CancelledRequests")
    body = {"prompt": "Once upon a time", "max_new_tokens": 256, "stream": True}
    with post_on_socket(f"{ts_server.inference_url}/predictions/{MODEL}", body, timeout=30) as connection:
        received = b""
        while received.count(b'"done":false') < 3:
            received += connection.recv(65536)
    # The next request runs after the worker saw the job gone; nothing else decodes meanwhile.
    assert predict(MODEL, json={"prompt": "Hi", "max_new_tokens": 1}).status_code == 200
    deadline = time.monotonic() + 30
    while counter(ts_server, "CancelledRequests") == cancelled and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counter(ts_server, "CancelledRequests") == cancelled + 1
    spent = counter(ts_server, "GeneratedTokens") - generated - 1  # less the 1-token request
    assert spent < 64, f"{spent} tokens generated for a client that left after 3 chunks"


def test_a_shared_prompt_prefix_is_reused_with_the_same_answer(predict, ts_server):
    system = "You are a helpful assistant that answers questions about TorchServe. " * 4
    first = predict(MODEL, json={"prompt": system + "What is a handler?", "max_new_tokens": 8}).json()
    describe = f"{ts_server.inference_url}/predictions/{MODEL}/1.0/describe"
    hits = requests.post(describe, timeout=30).json()["prefix_cache"]["hits"]
    again = predict(MODEL, json={"prompt": system + "What is a handler?", "max_new_tokens": 8}).json()
    other = predict(MODEL, json={"prompt": system + "What is a worker?", "max_new_tokens": 8})
    prefix_cache = requests.post(describe, timeout=30).json()["prefix_cache"]
    assert again["text"] == first["text"]  # the reused keys and values give the same tokens
    assert other.status_code == 200
    assert prefix_cache["hits"] >= hits + 2 and prefix_cache["reused_tokens"] > 0


def test_the_customized_describe_and_the_describe_route_answer_the_same_choices(ts_server, predict):
    """The project's clients ask a continuous-batching model's handler through the customized describe (safe with the
    frontend fixes; tests/integration/test_management_safety.py sends it raw), and its describe route on the inference
    API answers the same description."""
    client = ts_server.management()
    choices = client.handler_choices(MODEL)
    assert choices["scheduling"]["per_step"] is True
    assert client.description(MODEL)["continuousBatching"] is True
    with TorchServeGrpc.for_server(ts_server) as grpc_client:
        over_grpc = grpc_client.describe(MODEL, customized=True)[0]["customizedMetadata"]
    over_grpc = json.loads(over_grpc) if isinstance(over_grpc, str) else over_grpc
    assert over_grpc["limits"] == choices["limits"]
    described = requests.post(f"{ts_server.inference_url}/predictions/{MODEL}/1.0/describe", timeout=30)
    assert described.status_code == 200
    assert described.json()["limits"] == choices["limits"] and described.json()["limits"]["max_new_tokens"] > 0
    assert predict(MODEL, json={"prompt": "Hello", "max_new_tokens": 2}).status_code == 200
