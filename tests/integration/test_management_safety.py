"""Management calls sent raw, as curl and dashboards send them, must never stop a model serving (the session server).

TorchServe 0.12's frontend is patched at install (scripts/frontend_fixes): these tests fail on the unpatched jar —
the customized describe of the continuous-batching generator wedged it, a negative worker count took a model's
workers away, a huge one started workers until the host stopped answering, and the generator scaled to two workers
stopped answering.
"""

import concurrent.futures
import json
import threading
import time
import zipfile
from pathlib import Path

import pytest
import requests

from scripts.frontend_fixes.__main__ import installed_jar, marker
from scripts.ops.grpc_client import TorchServeGrpc
from tests.conftest import skip_unless_served

GENERATOR = "generator"
CLASSIFIER = "classifier"
ANSWER_TIMEOUT = 60


@pytest.fixture(scope="module")
def mgmt(ts_server):
    return ts_server.management_url


def generates(ts_server, tokens=2):
    """A short generation answers 200 with its tokens."""
    answer = requests.post(
        f"{ts_server.inference_url}/predictions/{GENERATOR}",
        json={"prompt": "Hello", "max_new_tokens": tokens, "temperature": 0},
        timeout=ANSWER_TIMEOUT,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def classifies(ts_server):
    answer = requests.post(
        f"{ts_server.inference_url}/predictions/{CLASSIFIER}", json={"inputs": [0.1] * 128}, timeout=ANSWER_TIMEOUT
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def workers(mgmt, model):
    return requests.get(f"{mgmt}/models/{model}", timeout=30).json()[0]["workers"]


def handler_metadata(description):
    """customizedMetadata: TorchServe passes the handler's describe on as JSON (a string over gRPC)."""
    metadata = description["customizedMetadata"]
    return json.loads(metadata) if isinstance(metadata, str) else metadata


def test_the_installed_frontend_carries_the_fixes():
    assert marker(installed_jar()) is not None, "run `make install` (python -m scripts.frontend_fixes)"


@pytest.mark.parametrize("spelling", ["/models/{m}", "/models/{m}/all", "/models/{m}/{v}"])
def test_a_raw_customized_describe_of_the_generator_is_answered_once_and_it_keeps_serving(ts_server, mgmt, spelling):
    skip_unless_served(ts_server, GENERATOR)
    version = requests.get(f"{mgmt}/models/{GENERATOR}", timeout=30).json()[0]["modelVersion"]
    url = mgmt + spelling.format(m=GENERATOR, v=version)
    for _ in range(2):  # the second describe is answered too: the first one left the queue
        described = requests.get(url, params={"customized": "true"}, timeout=ANSWER_TIMEOUT)
        assert described.status_code == 200, described.text
        body = described.json()
        assert body[0]["modelName"] == GENERATOR
        if not spelling.endswith("/all"):  # TorchServe answers /all itself, without asking the handler
            metadata = handler_metadata(body[0])
            assert metadata["scheduling"]["per_step"] is True
        assert generates(ts_server)["completion_tokens"] == 2


@pytest.mark.parametrize("model", [CLASSIFIER, "minilm"])
def test_a_raw_customized_describe_of_a_whole_batch_model_is_answered_and_it_keeps_serving(ts_server, mgmt, model):
    skip_unless_served(ts_server, model)
    body = {"inputs": [0.1] * 128} if model == CLASSIFIER else {"text": "still serving"}
    for spelling in (f"/models/{model}", f"/models/{model}/1.0"):
        described = requests.get(mgmt + spelling, params={"customized": "true"}, timeout=ANSWER_TIMEOUT)
        assert described.status_code == 200, described.text
        assert handler_metadata(described.json()[0])["identity"].startswith("sha256:")
        answer = requests.post(f"{ts_server.inference_url}/predictions/{model}", json=body, timeout=ANSWER_TIMEOUT)
        assert answer.status_code == 200, answer.text


def test_a_customized_describe_while_generating_is_answered_and_the_generation_finishes(ts_server, mgmt):
    skip_unless_served(ts_server, GENERATOR)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        long = pool.submit(generates, ts_server, 24)
        described = requests.get(f"{mgmt}/models/{GENERATOR}", params={"customized": "true"}, timeout=ANSWER_TIMEOUT)
        assert described.status_code == 200
        assert long.result(timeout=ANSWER_TIMEOUT)["completion_tokens"] == 24
    assert generates(ts_server)["completion_tokens"] == 2


def test_a_customized_describe_over_grpc_is_answered_and_the_generator_keeps_serving(ts_server):
    skip_unless_served(ts_server, GENERATOR)
    with TorchServeGrpc.for_server(ts_server) as client:
        for _ in range(2):
            described = client.describe(GENERATOR, customized=True)
            assert handler_metadata(described[0])["scheduling"]["per_step"] is True
            assert generates(ts_server)["completion_tokens"] == 2


@pytest.mark.parametrize(
    "query, problem",
    [
        ("min_worker=-1", "0 or more"),
        ("min_worker=0&max_worker=-1", "0 or more"),
        ("min_worker=3&max_worker=2", "max_worker cannot be less than min_worker"),
        ("min_worker=100000&max_worker=100000", "workers per model"),
        ("min_worker=1&max_worker=100000", "workers per model"),
        ("min_worker=abc", "must be an integer"),
        ("min_worker=1.5", "must be an integer"),
    ],
)
def test_a_bad_worker_count_is_a_400_and_the_model_keeps_its_workers(ts_server, mgmt, query, problem):
    skip_unless_served(ts_server, CLASSIFIER)
    before = [worker["pid"] for worker in workers(mgmt, CLASSIFIER)]
    answer = requests.put(f"{mgmt}/models/{CLASSIFIER}?{query}&synchronous=true", timeout=ANSWER_TIMEOUT)
    assert answer.status_code == 400, answer.text
    assert problem in answer.json()["message"]
    assert [worker["pid"] for worker in workers(mgmt, CLASSIFIER)] == before
    assert classifies(ts_server)["label"] in range(10)


def test_a_bad_worker_count_over_grpc_is_refused_and_the_model_keeps_its_workers(ts_server, mgmt):
    skip_unless_served(ts_server, CLASSIFIER)
    from scripts.ops.grpc_client import GrpcError

    before = [worker["pid"] for worker in workers(mgmt, CLASSIFIER)]
    with TorchServeGrpc.for_server(ts_server) as client, pytest.raises(GrpcError, match="workers per model"):
        client.scale(CLASSIFIER, min_worker=100000, max_worker=100000)
    assert [worker["pid"] for worker in workers(mgmt, CLASSIFIER)] == before
    assert classifies(ts_server)["label"] in range(10)


@pytest.fixture
def archive_without_worker_counts(ts_server):
    """classifier.mar as `classifier-noworkers.mar` in the server's store, its model-config.yaml without minWorkers and
    maxWorkers (which would win over the register call's initial_workers), removed afterwards."""
    store = Path(ts_server.props["model_store"])
    target = store / "classifier-noworkers.mar"
    with zipfile.ZipFile(store / "classifier.mar") as source, zipfile.ZipFile(target, "w") as copy:
        for entry in source.infolist():
            data = source.read(entry)
            if entry.filename == "model-config.yaml":
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not line.startswith(("minWorkers", "maxWorkers"))).encode()
            copy.writestr(entry, data)
    yield target.name
    target.unlink()


def test_registering_with_a_huge_worker_count_is_refused_and_leaves_nothing_registered(
    ts_server, mgmt, archive_without_worker_counts
):
    skip_unless_served(ts_server, CLASSIFIER)
    params = {"url": archive_without_worker_counts, "model_name": "classifier-huge", "initial_workers": 100000}
    answer = requests.post(f"{mgmt}/models", params=params, timeout=ANSWER_TIMEOUT)
    assert answer.status_code == 400, answer.text
    assert "workers per model" in answer.json()["message"]
    assert requests.get(f"{mgmt}/models/classifier-huge", timeout=30).status_code == 404
    # The same call with a sane count registers it (the refusal was about the count, not the archive).
    answer = requests.post(f"{mgmt}/models", params={**params, "initial_workers": 1}, timeout=300)
    try:
        assert answer.status_code == 200, answer.text
        assert len(workers(mgmt, "classifier-huge")) == 1
    finally:
        requests.delete(f"{mgmt}/models/classifier-huge", timeout=120)
    assert classifies(ts_server)["label"] in range(10)


def flood(url, body, stop, answers):
    """Post ``body`` to ``url`` until ``stop`` is set, recording each status (0: no answer within the timeout)."""
    while not stop.is_set():
        try:
            answers.append(requests.post(url, json=body, timeout=ANSWER_TIMEOUT).status_code)
        except requests.RequestException:
            answers.append(0)


@pytest.mark.parametrize("call", ["unregister", "scale to 0"])
def test_every_request_in_flight_is_answered_when_a_model_is_unregistered_or_scaled_to_0(
    ts_server, mgmt, archive_without_worker_counts, call
):
    """0.12 left the requests queued for the model (and those its stopped worker held) without an answer."""
    skip_unless_served(ts_server, CLASSIFIER)
    name = "classifier-flooded"
    params = {"url": archive_without_worker_counts, "model_name": name, "initial_workers": 1, "batch_size": 4}
    assert requests.post(f"{mgmt}/models", params=params, timeout=300).status_code == 200
    url = f"{ts_server.inference_url}/predictions/{name}"
    stop, answers = threading.Event(), []
    clients = [
        threading.Thread(target=flood, args=(url, {"inputs": [[0.1] * 128] * 64}, stop, answers)) for _ in range(6)
    ]
    try:
        for client in clients:
            client.start()
        time.sleep(2)
        if call == "unregister":
            assert requests.delete(f"{mgmt}/models/{name}", timeout=120).status_code == 200
        else:
            scaled = requests.put(f"{mgmt}/models/{name}?min_worker=0&max_worker=0&synchronous=true", timeout=120)
            assert scaled.status_code == 200, scaled.text
            time.sleep(12)  # what waits is answered once the model has stayed without workers for 10 s
        time.sleep(1)
    finally:
        stop.set()
        for client in clients:
            client.join(ANSWER_TIMEOUT + 10)
        requests.delete(f"{mgmt}/models/{name}", timeout=120)
    assert answers.count(200) > 0, answers
    assert 0 not in answers, f"{answers.count(0)} requests got no answer"
    assert set(answers) <= {200, 404, 500, 503}, answers
    assert classifies(ts_server)["label"] in range(10)


def test_the_generator_scaled_to_two_workers_answers_and_scales_back(ts_server, mgmt):
    skip_unless_served(ts_server, GENERATOR)
    scaled = requests.put(f"{mgmt}/models/{GENERATOR}?min_worker=2&max_worker=2&synchronous=true", timeout=300)
    try:
        assert scaled.status_code == 200, scaled.text
        assert len(workers(mgmt, GENERATOR)) == 2
        # Each worker gets requests: two at once, then one alone after the other worker went idle.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: generates(ts_server, 4), range(2)))
        assert [answer["completion_tokens"] for answer in answers] == [4, 4]
        for _ in range(3):
            assert generates(ts_server)["completion_tokens"] == 2
    finally:
        back = requests.put(f"{mgmt}/models/{GENERATOR}?min_worker=1&max_worker=1&synchronous=true", timeout=300)
        assert back.status_code == 200, back.text
    assert generates(ts_server)["completion_tokens"] == 2
