"""TorchServe's gRPC APIs and the KServe v2 / Open Inference Protocol endpoints, spoken by real clients.

The gRPC client (scripts/ops/grpc_client.py) uses stubs generated from the .proto files of the installed torchserve
wheel (scripts/ops/grpc_stubs.py). Against the session server (config.properties, free ports; its gRPC ports are in
its rendered properties): every model answers a gRPC Predictions call with the same bytes as HTTP, StreamPredictions
carries the generator's NDJSON lines (one message each without per-step scheduling, one message with it),
DescribeModel shows what GET /models/<name> shows (customized metadata included, but for the generator, whose
customized describe is refused: it is served with continuousBatching), and a refusal or an unknown model is
reported as over HTTP, with the differences TorchServe 0.12 makes pinned here (docs/clients.md):
- a model's own 4xx arrives with gRPC status OK, its JSON error body unchanged (TorchServe drops a per-request status
  on gRPC); an unknown model is INTERNAL for Predictions and NOT_FOUND for DescribeModel where HTTP says 404.

The two calls that failed a TorchServe 0.12 worker (a unary call the model streams, a StreamPredictions call it
answers in one piece) are answered safely now (handlers: no piece ahead of a unary call's answer, ts_stream_next false
on every gRPC answer); the client still refuses both, as they do not do what their caller wants.

A second server (the production profile's tokens, TS_OPEN_INFERENCE_PROTOCOL=oip, classifier only) shows gRPC with
tokens and what the Open Inference Protocol switch does and does not give our models.
"""

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import requests

from scripts.ops import grpc_stubs
from scripts.ops.grpc_client import (
    EXIT_AUTH,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    GrpcError,
    TorchServeGrpc,
    answer_error,
    encode_body,
)
from scripts.ops.server import free_ports
from tests.conftest import skip_unless_served

REPO = Path(__file__).resolve().parents[2]
ROW = [0.01 * i for i in range(128)]

# Bodies each model answers (several shapes), sent as the same bytes over HTTP and gRPC.
ANSWERS = [
    ("classifier", {"inputs": ROW}),
    ("classifier", {"inputs": [ROW, [0.1] * 128]}),
    ("minilm", {"text": "TorchServe serves sentence embeddings."}),
    ("minilm", {"input": ["first text", "second text"], "model": "all-MiniLM-L6-v2"}),
    ("generator", {"prompt": "Once upon a time", "max_new_tokens": 16, "temperature": 0.8, "top_k": 50, "seed": 42}),
    ("generator", {"prompt": "Hello world", "max_new_tokens": 12}),
]
# Bodies each model refuses with its own 4xx.
REFUSALS = [
    ("classifier", {"inputs": [1, 2, 3]}),
    ("classifier", b"{not json"),
    ("classifier", b""),
    ("minilm", {"txt": "typo"}),
    ("minilm", {"text": "x" * 100_000}),
    ("generator", {"prompt": 5}),
    ("generator", {"prompt": "x", "max_new_tokens": 100_000}),
]
STREAMED = {"prompt": "Once upon a time", "max_new_tokens": 24, "temperature": 0.9, "top_k": 100, "seed": 21}


def served(server, model):
    skip_unless_served(server, model)


def http_post(server, model, raw, path="predictions"):
    return requests.post(
        f"{server.inference_url}/{path}/{model}" + ("/infer" if path == "v2/models" else ""),
        data=raw,
        headers={"Content-Type": "application/json", **server.headers("inference")},
        timeout=120,
    )


@pytest.fixture(scope="module")
def client(ts_server):
    with TorchServeGrpc.for_server(ts_server, timeout=120) as client:
        yield client


def test_ping_over_grpc(client):
    assert client.ping() == "Healthy"


@pytest.mark.parametrize(("model", "body"), ANSWERS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(ANSWERS)])
def test_prediction_is_the_http_answer_byte_for_byte(ts_server, client, model, body):
    served(ts_server, model)
    raw = encode_body(body)
    over_grpc = client.predict(model, raw)
    over_http = http_post(ts_server, model, raw)
    assert over_http.status_code == 200, over_http.text
    assert over_grpc == over_http.content
    assert answer_error(over_grpc) is None


def test_version_and_body_input_name(ts_server, client):
    """An explicit version reaches the same model; the input named "data" (TorchServe's own examples) works too."""
    served(ts_server, "classifier")
    raw = encode_body({"inputs": ROW})
    expected = http_post(ts_server, "classifier", raw).content
    version = client.describe("classifier")[0]["modelVersion"]
    assert client.predict("classifier", raw, version=version) == expected
    pb, stubs = grpc_stubs.load("inference_pb2"), grpc_stubs.load("inference_pb2_grpc")
    with grpc.insecure_channel(client.inference_target) as channel:
        request = pb.PredictionsRequest(model_name="classifier", input={"data": raw})
        assert stubs.InferenceAPIsServiceStub(channel).Predictions(request, timeout=60).prediction == expected


def test_a_unary_call_asking_to_stream_gets_the_whole_answer_and_the_worker_lives(ts_server, client):
    """Any gRPC client may send "stream": true in a unary Predictions call (ours refuses to): the generator then sends
    no piece ahead of its answer, which is the stream in one NDJSON line; TorchServe 0.12 would otherwise fail the
    worker for good. The next request is answered."""
    served(ts_server, "generator")
    pb, stubs = grpc_stubs.load("inference_pb2"), grpc_stubs.load("inference_pb2_grpc")
    raw = encode_body({**STREAMED, "stream": True})
    with grpc.insecure_channel(client.inference_target) as channel:
        request = pb.PredictionsRequest(model_name="generator", input={"body": raw})
        answer = stubs.InferenceAPIsServiceStub(channel).Predictions(request, timeout=120).prediction
    [line] = bytes(answer).splitlines()
    whole = json.loads(line)
    assert whole["done"] is True
    assert whole["text"] == json.loads(client.predict("generator", encode_body(STREAMED)))["text"]
    # A one-piece answer over StreamPredictions (a refusal) ends the stream cleanly instead of failing the worker.
    with grpc.insecure_channel(client.inference_target) as channel:
        request = pb.PredictionsRequest(model_name="generator", input={"body": b'{"prompt": 5, "stream": true}'})
        [refusal] = list(stubs.InferenceAPIsServiceStub(channel).StreamPredictions(request, timeout=60))
    assert json.loads(refusal.prediction)["code"] == 400
    assert json.loads(client.predict("generator", encode_body(STREAMED)))["text"] == whole["text"]


def test_stream_predictions_carries_the_http_stream_line_by_line(ts_server, client):
    served(ts_server, "generator")
    raw = encode_body({**STREAMED, "stream": True})
    pieces = list(client.stream_predict("generator", raw))
    over_http = http_post(ts_server, "generator", raw)
    assert over_http.status_code == 200
    assert over_http.headers["Content-Type"].startswith("application/x-ndjson")
    lines = over_http.content.splitlines(keepends=True)
    if ts_server.management().description("generator").get("continuousBatching"):
        # Per-step scheduling: TorchServe 0.12's continuous batching takes a gRPC call it sends a piece to for a
        # closed one and drops it (GRPCJob.isOpen answers the opposite), so the stream comes as one message: the
        # final line, holding the whole text.
        assert len(pieces) == 1 and json.loads(pieces[0]) == whole_stream(lines)
        pieces = lines
    else:
        assert len(pieces) >= 4  # streamed, not one message at the end
        assert pieces == lines  # one NDJSON line per gRPC message, the same bytes
    parsed = [json.loads(piece) for piece in pieces]
    assert [line["done"] for line in parsed] == [False] * (len(parsed) - 1) + [True]
    plain = json.loads(client.predict("generator", encode_body(STREAMED)))
    assert "".join(line["text"] for line in parsed) == plain["text"]


@pytest.mark.parametrize(("model", "body"), REFUSALS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(REFUSALS)])
def test_refusal_has_the_http_body_and_code_but_grpc_status_ok(ts_server, client, model, body):
    """TorchServe 0.12 drops a handler's per-request status on gRPC: the call succeeds (status OK) and the answer is
    the same JSON error body HTTP sends with the status; the code is in the body ({"code": 4xx})."""
    served(ts_server, model)
    raw = encode_body(body)
    over_http = http_post(ts_server, model, raw)
    over_grpc = client.predict(model, raw)  # no GrpcError: the gRPC status is OK
    assert 400 <= over_http.status_code < 500
    assert over_grpc == over_http.content
    error = answer_error(over_grpc)
    assert error is not None and error["code"] == over_http.status_code
    assert error["message"] == over_http.json()["message"]


def test_unknown_model_is_internal_for_predictions_and_not_found_for_describe(ts_server, client):
    over_http = http_post(ts_server, "no-such-model", b"{}")
    assert over_http.status_code == 404
    message = over_http.json()["message"]  # "Model not found: no-such-model"
    with pytest.raises(GrpcError) as predicted:
        client.predict("no-such-model", b"{}")
    assert predicted.value.status == grpc.StatusCode.INTERNAL  # HTTP: 404
    assert str(predicted.value).endswith(f"INTERNAL: {message}")
    assert predicted.value.exit_code == EXIT_NOT_FOUND
    described = requests.get(f"{ts_server.management_url}/models/no-such-model", timeout=30)
    with pytest.raises(GrpcError) as missing:
        client.describe("no-such-model")
    assert described.status_code == 404 and missing.value.status == grpc.StatusCode.NOT_FOUND
    assert str(missing.value).endswith(f"NOT_FOUND: {described.json()['message']}")


PER_WORKER = ("load_seconds", "load_phases", "cached")


def stable(description):
    """A model description without what changes from one call to the next (queue, memory) or per worker."""
    value = {key: item for key, item in description.items() if key not in ("jobQueueStatus", "workers")}
    value["workers"] = sorted((w["id"], w["pid"], w["status"]) for w in description.get("workers", []))
    metadata = description.get("customizedMetadata")
    if isinstance(metadata, str):
        metadata = json.loads(metadata)
    if isinstance(metadata, dict):  # whichever worker answers: its load time and cache fill are its own
        value["customizedMetadata"] = {k: v for k, v in metadata.items() if k not in PER_WORKER}
    return value


# The generator is served with continuousBatching, whose customized describe both clients refuse to send
# (tests/integration/test_generator_api.py).
@pytest.mark.parametrize(
    "model, customized",
    [("classifier", False), ("classifier", True), ("minilm", False), ("minilm", True), ("generator", False)],
)
def test_describe_over_grpc_shows_what_http_shows(ts_server, client, model, customized):
    served(ts_server, model)
    over_grpc = client.describe(model, customized=customized)
    over_http = ts_server.management().describe(model, customized=customized)
    assert [stable(d) for d in over_grpc] == [stable(d) for d in over_http]
    if customized:
        metadata = stable(over_grpc[0])["customizedMetadata"]
        assert {"backend", "precision", "requested_backend", "threads"} <= set(metadata)  # the handler's choices


def test_list_models_over_grpc(ts_server, client):
    listed = {entry["modelName"] for entry in client.list_models()}
    assert listed == {entry["modelName"] for entry in ts_server.management().list_models()}


# ------------------------------------------------------------------------------------------- the CLI
def cli(server, *args, stdin=None):
    command = [sys.executable, "-m", "scripts.ops.grpc_client", "--config", str(server.config_path), *args]
    return subprocess.run(command, cwd=REPO, input=stdin, capture_output=True, timeout=180)


def test_cli_predict_stream_describe_and_exit_codes(ts_server):
    served(ts_server, "classifier")
    raw = encode_body({"inputs": ROW})
    done = cli(ts_server, "predict", "classifier", raw.decode())
    assert done.returncode == EXIT_OK, done.stderr
    assert done.stdout == http_post(ts_server, "classifier", raw).content + b"\n"
    from_stdin = cli(ts_server, "predict", "classifier", "-", stdin=raw)
    assert from_stdin.stdout == done.stdout
    refused = cli(ts_server, "predict", "classifier", '{"inputs": [1, 2, 3]}')
    assert refused.returncode == EXIT_REFUSED
    assert json.loads(refused.stdout)["code"] == 400 and b"answered 400" in refused.stderr
    unknown = cli(ts_server, "predict", "no-such-model", "{}")
    assert unknown.returncode == EXIT_NOT_FOUND and b"Model not found" in unknown.stderr
    described = cli(ts_server, "describe", "classifier", "--customized")
    assert described.returncode == EXIT_OK and json.loads(described.stdout)[0]["modelName"] == "classifier"
    closed = cli(ts_server, "--inference-port", str(free_ports(1)[0]), "ping")
    assert closed.returncode == EXIT_UNREACHABLE and b"no gRPC server at" in closed.stderr
    if "generator.mar" in ts_server.props.get("load_models", ""):
        streamed = cli(ts_server, "stream", "generator", json.dumps({**STREAMED, "stream": True}))
        assert streamed.returncode == EXIT_OK, streamed.stderr
        expected = http_post(ts_server, "generator", encode_body({**STREAMED, "stream": True})).content
        got = [json.loads(line) for line in streamed.stdout.splitlines()]
        if ts_server.management().description("generator").get("continuousBatching"):
            assert got == [whole_stream(expected.splitlines())]  # one message under per-step scheduling (above)
        else:
            assert got == [json.loads(line) for line in expected.splitlines()]


def whole_stream(lines):
    """An NDJSON stream as one final line: the last line's fields with every line's text."""
    parsed = [json.loads(line) for line in lines]
    return {**parsed[-1], "text": "".join(line["text"] for line in parsed)}


# ------------------------------------------------------------------------------------------- KServe v2 path
@pytest.mark.parametrize(("model", "body"), ANSWERS[::2], ids=[m for m, _ in ANSWERS[::2]])
def test_v2_infer_path_hands_our_body_to_the_same_handler(ts_server, model, body):
    """TorchServe 0.12 routes POST /v2/models/<model>/infer to the model whether or not the Open Inference Protocol is
    switched on, with the body unchanged. A text or generation model answers our JSON there as on /predictions and
    refuses an OIP tensor body; a network (the classifier) speaks the Open Inference Protocol there: a tensor body
    is answered with OIP outputs, a malformed one refused in OIP's error shape."""
    served(ts_server, model)
    raw = encode_body(body)
    if model == "classifier":
        tensor = {"inputs": [{"name": "inputs", "shape": [1, 128], "datatype": "FP32", "data": ROW}]}
        answer = http_post(ts_server, model, encode_body(tensor), "v2/models")
        assert answer.status_code == 200, answer.content
        assert [output["name"] for output in json.loads(answer.content)["outputs"]] == ["logits"]
        refused = http_post(
            ts_server, model, encode_body({"inputs": [{"name": "inputs", "datatype": "FP32"}]}), "v2/models"
        )
        assert refused.status_code == 400 and "error" in json.loads(refused.content)
        return
    assert http_post(ts_server, model, raw, "v2/models").content == http_post(ts_server, model, raw).content
    tensor = {"id": "1", "inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": ["hello"]}]}
    assert http_post(ts_server, model, encode_body(tensor), "v2/models").status_code == 400


# ------------------------------------------------------------------------------------------- tokens and OIP
@pytest.fixture(scope="module")
def oip_server(start_ts_server):
    served_models = ["classifier"]
    return start_ts_server(
        config=REPO / "config" / "production.properties",
        models=served_models,
        name="grpc-oip",
        env={"TS_OPEN_INFERENCE_PROTOCOL": "oip"},
    )


def test_grpc_with_token_authorization(oip_server):
    raw = encode_body({"inputs": ROW})
    with TorchServeGrpc.for_server(oip_server) as client:
        assert client.predict("classifier", raw) == http_post(oip_server, "classifier", raw).content
        assert client.describe("classifier")[0]["modelName"] == "classifier"
    target = f"127.0.0.1:{oip_server.props['grpc_inference_port']}"
    management = f"127.0.0.1:{oip_server.props['grpc_management_port']}"
    for token in ("wrong", None):  # TorchServe 0.12 answers PERMISSION_DENIED (HTTP: 400 InvalidKeyException)
        with TorchServeGrpc(target, management, token=token, management_token=token) as client:
            for call in (lambda: client.predict("classifier", raw), lambda: client.describe("classifier")):
                with pytest.raises(GrpcError) as refused:
                    call()
                assert refused.value.exit_code == EXIT_AUTH
                assert refused.value.status == grpc.StatusCode.PERMISSION_DENIED
                assert "Token Authorization failed" in str(refused.value)


def test_open_inference_protocol_switch(oip_server):
    """TS_OPEN_INFERENCE_PROTOCOL=oip adds the v2 server endpoints and a gRPC service named
    org.pytorch.serve.grpc.openinference.GRPCInferenceService (KServe's clients call inference.GRPCInferenceService,
    which stays UNIMPLEMENTED); the v2 model metadata and readiness REST endpoints are not there."""
    url, headers = oip_server.inference_url, oip_server.headers("inference")
    assert requests.get(f"{url}/v2/health/ready", headers=headers, timeout=30).json() == {"ready": True}
    assert requests.get(f"{url}/v2", headers=headers, timeout=30).json()["name"] == "Torchserve"
    assert requests.get(f"{url}/v2/models/classifier", headers=headers, timeout=30).status_code == 404
    pb, stubs = grpc_stubs.load("open_inference_grpc_pb2"), grpc_stubs.load("open_inference_grpc_pb2_grpc")
    metadata = [("authorization", f"Bearer {oip_server.tokens()['inference']}")]
    with grpc.insecure_channel(f"127.0.0.1:{oip_server.props['grpc_inference_port']}") as channel:
        oip = stubs.GRPCInferenceServiceStub(channel)
        assert oip.ServerLive(pb.ServerLiveRequest(), timeout=30, metadata=metadata).live
        assert oip.ModelReady(pb.ModelReadyRequest(name="classifier"), timeout=30, metadata=metadata).ready
        kserve = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        with pytest.raises(grpc.RpcError) as missing:
            kserve(b"", timeout=30, metadata=metadata)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_open_inference_model_infer_cannot_carry_our_answers(oip_server):
    """ModelInfer turns the tensors into a JSON body ({"id", "model_name", "inputs": [...]}), which our handlers refuse,
    and expects an OIP JSON answer ({"id", "model_name", "outputs": [...]}) back: any other answer makes the frontend
    fail the worker (INTERNAL "Worker died."; TorchServe restarts it). Last in this module: it costs that worker."""
    pb, stubs = grpc_stubs.load("open_inference_grpc_pb2"), grpc_stubs.load("open_inference_grpc_pb2_grpc")
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="input-0", datatype="FP32", shape=[1, 128], contents=pb.InferTensorContents(fp32_contents=ROW)
    )
    metadata = [("authorization", f"Bearer {oip_server.tokens()['inference']}")]
    with grpc.insecure_channel(f"127.0.0.1:{oip_server.props['grpc_inference_port']}") as channel:
        oip = stubs.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            oip.ModelInfer(
                pb.ModelInferRequest(model_name="classifier", id="1", inputs=[tensor]), timeout=60, metadata=metadata
            )
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert "Worker died" in failed.value.details()
