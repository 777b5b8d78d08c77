"""The generator through a real TorchServe started from config.properties (session server, free ports).

Streaming is checked on the wire: the client reads the HTTP chunks as they arrive (requests' iter_content with
chunk_size=None yields one chunk of the chunked transfer encoding at a time).
"""

import concurrent.futures
import json

import pytest
import requests

MODEL = "generator"


@pytest.fixture(scope="module", autouse=True)
def served(ts_server):
    if f"{MODEL}.mar" not in ts_server.props.get("load_models", ""):
        pytest.skip(f"{MODEL} is not served by this session's server (TS_TEST_MODELS)")


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
    assert len(chunks) >= 4  # several text chunks before the final one
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
