"""The classifier through a real TorchServe started from config.properties (session server, free ports): its native
JSON at /predictions/classifier (the network handler with the classifier folder's hooks) and the Open Inference
Protocol at /v2/models/classifier/infer (tritonclient.http with its defaults)."""

import concurrent.futures
import json

import numpy as np
import pytest
import requests
import torch
import tritonclient.http as httpclient

from scripts.reliability.references import load_classifier_dir

MODEL = "classifier"


@pytest.fixture(scope="module")
def reference_model(unpacked_model):
    return load_classifier_dir(unpacked_model(MODEL))


def expected(model, rows):
    with torch.inference_mode():
        return torch.softmax(model(torch.tensor(rows, dtype=torch.float32)), dim=-1)


def random_rows(count, seed):
    return torch.randn(count, 128, generator=torch.Generator().manual_seed(seed)).tolist()


def assert_matches(answer, probabilities):
    assert answer["label"] == int(probabilities.argmax())
    assert torch.allclose(torch.tensor(answer["probabilities"]), probabilities, atol=1e-5)


def test_single_request(predict, reference_model):
    row = random_rows(1, seed=10)[0]
    response = predict(MODEL, json={"inputs": row})
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    assert_matches(response.json(), expected(reference_model, [row])[0])


def test_multi_row_request_answers_rows_in_order(predict, reference_model):
    rows = random_rows(7, seed=11)
    response = predict(MODEL, json={"inputs": rows})
    assert response.status_code == 200
    answers = response.json()
    assert isinstance(answers, list) and len(answers) == 7
    for answer, probabilities in zip(answers, expected(reference_model, rows), strict=True):
        assert_matches(answer, probabilities)


def test_64_concurrent_distinct_requests_each_get_their_own_answer(ts_server, reference_model):
    rows = random_rows(64, seed=12)
    url = f"{ts_server.inference_url}/predictions/{MODEL}"

    def send(row):
        return requests.post(url, json={"inputs": row}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
        responses = list(pool.map(send, rows))
    assert [r.status_code for r in responses] == [200] * 64
    for response, probabilities in zip(responses, expected(reference_model, rows), strict=True):
        assert_matches(response.json(), probabilities)


def test_mixed_batch_only_the_bad_request_fails(ts_server, reference_model):
    """Requests that arrive together are batched (maxBatchDelay); the invalid one alone gets 400."""
    rows = random_rows(8, seed=13)
    bodies = [{"inputs": row} for row in rows]
    bodies[3] = {"inputs": rows[3][:100]}
    url = f"{ts_server.inference_url}/predictions/{MODEL}"
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(lambda body: requests.post(url, json=body, timeout=60), bodies))
    assert [r.status_code for r in responses] == [200, 200, 200, 400, 200, 200, 200, 200]
    assert "100 values; expected 128" in responses[3].json()["message"]
    probabilities = expected(reference_model, rows)
    for index, response in enumerate(responses):
        if index != 3:
            assert_matches(response.json(), probabilities[index])


def strict_json(response):
    """The body parsed by a strict JSON parser: NaN and Infinity tokens fail the test."""
    return json.loads(response.text, parse_constant=lambda token: pytest.fail(f"{token} in {response.text[:80]}"))


def test_overflow_inside_the_model_is_a_422_and_the_batch_mates_get_strict_json(ts_server, reference_model):
    """Regression (issue 11, repro 2): 1e38 x 128 was answered 200 with NaN probabilities, which is not JSON."""
    rows = random_rows(6, seed=21)
    bodies = [{"inputs": row} for row in rows]
    bodies[2] = {"inputs": [1e38] * 128}
    bodies[4] = {"inputs": [2.9e38, -2.9e38] * 64}
    url = f"{ts_server.inference_url}/predictions/{MODEL}"
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        responses = list(pool.map(lambda body: requests.post(url, json=body, timeout=60), bodies))
    assert [r.status_code for r in responses] == [200, 200, 422, 200, 422, 200]
    answers = [strict_json(r) for r in responses]
    assert answers[2]["type"] == "InputOverflow" and "overflow inside the model" in answers[2]["message"]
    probabilities = expected(reference_model, rows)
    for index in (0, 1, 3, 5):
        assert_matches(answers[index], probabilities[index])


INVALID = [
    ("not json", {"data": b'{"inputs": [1, 2', "headers": {"Content-Type": "application/json"}}, "not valid JSON"),
    ("missing inputs", {"json": {"input": [0.0] * 128}}, "unknown field"),
    ("no fields", {"json": {}}, "missing field 'inputs'"),
    ("wrong length", {"json": {"inputs": [0.0] * 129}}, "129 values; expected 128"),
    ("non-numbers", {"json": {"inputs": ["a"] * 128}}, "not a number"),
    (
        "NaN",
        {"data": '{"inputs": [NaN' + ", 0" * 127 + "]}", "headers": {"Content-Type": "application/json"}},
        "finite",
    ),
    (
        "Infinity",
        {"data": '{"inputs": [Infinity' + ", 0" * 127 + "]}", "headers": {"Content-Type": "application/json"}},
        "finite",
    ),
    ("empty list", {"json": {"inputs": []}}, "non-empty"),
    ("no content type", {"data": b"not json at all"}, "not valid JSON"),
]


@pytest.mark.parametrize("name,request_kwargs,fragment", INVALID, ids=[case[0] for case in INVALID])
def test_invalid_request_gets_400_with_a_message_and_the_worker_keeps_serving(predict, name, request_kwargs, fragment):
    response = predict(MODEL, **request_kwargs)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == 400 and body["type"] == "InvalidRequest"
    assert fragment in body["message"]
    follow_up = predict(MODEL, json={"inputs": [0.25] * 128})
    assert follow_up.status_code == 200 and "label" in follow_up.json()


def test_prometheus_endpoint_reports_our_stage_histograms(ts_server, predict):
    assert predict(MODEL, json={"inputs": [0.5] * 128}).status_code == 200
    text = requests.get(f"{ts_server.metrics_url}/metrics", timeout=10).text
    assert "ts_inference_requests_total" in text
    for metric in ("InferenceSeconds_count", "PreprocessSeconds_bucket", "BatchRequests", "BatchRows", "Batches"):
        assert any(line.startswith(metric) and f'ModelName="{MODEL}"' in line for line in text.splitlines()), metric


def test_describe_shows_the_precision_the_worker_chose(ts_server):
    client = ts_server.management()
    [description] = client.describe(MODEL, customized=True)
    assert description["batchSize"] == 16
    assert description["workers"][0]["status"] == "READY"
    metadata = client.handler_choices(MODEL)
    assert metadata["precision"] == "fp32" and metadata["device"] == "cpu"
    assert metadata["hooks"] == ["preprocess", "postprocess"]


def test_open_inference_protocol_with_tritonclient_defaults(ts_server, reference_model):
    """infer() as tritonclient sends it by default (binary tensors): the program's logits, rows as sent."""
    rows = np.array(random_rows(3, seed=31), dtype=np.float32)
    client = httpclient.InferenceServerClient(ts_server.inference_url.removeprefix("http://"), network_timeout=60)
    tensor = httpclient.InferInput("inputs", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    result = client.infer(MODEL, [tensor])
    with torch.inference_mode():
        logits = reference_model(torch.from_numpy(rows)).numpy()
    assert result.as_numpy("logits").shape == (3, 10)
    assert np.allclose(result.as_numpy("logits"), logits, atol=1e-5)


def test_open_inference_protocol_as_curl_sends_it(ts_server, reference_model):
    row = random_rows(1, seed=32)[0]
    body = {"inputs": [{"name": "inputs", "shape": [1, 128], "datatype": "FP32", "data": row}]}
    response = requests.post(f"{ts_server.inference_url}/v2/models/{MODEL}/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    [output] = response.json()["outputs"]
    assert output["name"] == "logits" and output["shape"] == [1, 10]
    with torch.inference_mode():
        logits = reference_model(torch.tensor([row]))
    assert torch.allclose(torch.tensor(output["data"]), logits[0], atol=1e-5)
