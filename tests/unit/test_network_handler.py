"""The network handler in process (no TorchServe): a packaged folder of each source staged by the prepare step, loaded
by the handler as a worker would, and batches of requests answered in the native form, the Open Inference Protocol
(JSON and binary) and through handler.py hooks; the prepare step's refusals name the file and the fix."""

import json

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

from handlers.network_model import NetworkModelHandler
from scripts import prepare_network_model, tiny_networks
from scripts.prepare_network_model import NetworkFolderError

HEADER = "Inference-Header-Content-Length"


class Context:
    """What the handler reads and writes of TorchServe's context, per request of one batch."""

    def __init__(self, model_dir, headers=()):
        self.system_properties = {"model_dir": str(model_dir), "batch_size": 8}
        self.model_yaml_config = {"handler": {"threads": 1}}
        self.manifest = {"model": {"modelName": "net", "modelVersion": "1.0"}}
        self.request_headers = list(headers)
        self.status, self.response_headers, self.content_types = {}, {}, {}

    def get_request_header(self, idx, name):
        return self.request_headers[idx].get(name) if idx < len(self.request_headers) else None

    def set_response_status(self, code, phrase, idx):
        self.status[idx] = code

    def set_response_header(self, idx, key, value):
        self.response_headers.setdefault(idx, {})[key] = value

    def set_response_content_type(self, idx, value):
        self.content_types[idx] = value


PREDICTIONS = {"Host": "x", "url_path": "", "Content-Type": "application/json"}
V2 = {"Host": "x", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    root = tmp_path_factory.mktemp("networks")
    folders = {}
    for name in ("mlp", "ranker", "csv"):
        source = tiny_networks.FOLDERS[name](root / name)
        folders[name] = root / "staged" / name
        prepare_network_model.stage(source, folders[name])
    return folders


@pytest.fixture(scope="module")
def handlers(staged):
    loaded = {}
    for name, folder in staged.items():
        handler = NetworkModelHandler()
        handler.initialize(Context(folder))
        loaded[name] = handler
    return loaded


def handle(handler, requests):
    """(status, headers, body) per request of one batch: requests are (headers, body) pairs."""
    context = Context(handler.model_dir, [headers for headers, _ in requests])
    bodies = handler.handle([{"body": body} for _, body in requests], context)
    return [(context.status.get(i, 200), context.response_headers.get(i, {}), bodies[i]) for i in range(len(bodies))]


def eager(name, *tensors):
    module = {"mlp": tiny_networks.MLP, "ranker": tiny_networks.Ranker}[name]
    with torch.inference_mode():
        return tiny_networks.seeded(module)(*tensors)


def test_native_batch_answers_each_request_as_alone_and_refuses_a_bad_one_alone(handlers):
    rows = torch.randn(3, 6)
    answers = handle(
        handlers["mlp"],
        [
            (PREDICTIONS, {"inputs": {"x": rows[:2].tolist()}}),
            (PREDICTIONS, {"inputs": {"x": [1.0, 2.0]}}),
            (PREDICTIONS, {"inputs": rows[2].tolist()}),
        ],
    )
    (s0, _, b0), (s1, _, b1), (s2, _, b2) = answers
    assert s0 == s2 == 200 and s1 == 400
    assert "input 'x'" in json.loads(b1)["message"]
    expected = eager("mlp", rows)
    assert np.allclose(json.loads(b0)["outputs"]["output0"], expected[:2].numpy(), atol=1e-6)
    assert np.allclose(json.loads(b2)["outputs"]["output0"], expected[2].numpy(), atol=1e-6)


def test_tritonclient_binary_request_is_answered_in_binary(handlers):
    ids, features = np.array([3, 7], dtype=np.int64), np.random.default_rng(0).standard_normal((2, 4), np.float32)
    inputs = [httpclient.InferInput("item_ids", [2], "INT64"), httpclient.InferInput("features", [2, 4], "FP32")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(features)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=[httpclient.InferRequestedOutput("output0")]
    )
    [(status, headers, answer)] = handle(handlers["ranker"], [({**V2, HEADER: str(json_size)}, bytearray(body))])
    assert status == 200 and HEADER in headers
    result = httpclient.InferResult.from_response_body(bytes(answer), header_length=int(headers[HEADER]))
    expected = eager("ranker", torch.from_numpy(ids), torch.from_numpy(features)).numpy()
    assert np.allclose(result.as_numpy("output0"), expected, atol=1e-6)


def test_oip_refusal_is_in_the_protocols_shape_and_names_the_input(handlers):
    bad = {
        "inputs": [
            {"name": "item_ids", "shape": [1], "datatype": "INT64", "data": [45]},
            {"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]},
        ]
    }
    [(status, _, answer)] = handle(handlers["ranker"], [(V2, bad)])
    assert status == 400
    assert set(json.loads(answer)) == {"error"} and "'item_ids'" in json.loads(answer)["error"]


def test_hooks_take_raw_csv_and_a_failing_hook_fails_its_own_request(handlers):
    text = {"Host": "x", "url_path": "", "Content-Type": "text/csv"}
    answers = handle(
        handlers["csv"], [(text, bytearray(b"1,2,3,4,5,6\n")), (text, bytearray(b"1,2,x")), (text, bytearray(b"1,2"))]
    )
    (s0, _, b0), (s1, _, b1), (s2, _, b2) = answers
    assert (s0, s1, s2) == (200, 400, 400)
    scores = eager("mlp", torch.tensor([[1.0, 2, 3, 4, 5, 6]]))[0]
    assert json.loads(b0)["label"] == tiny_networks.LABELS[int(scores.argmax())]
    assert "could not convert string to float" in json.loads(b1)["message"]
    assert json.loads(b2)["message"] == "expected 6 comma-separated numbers, got 2"


def test_metadata_route_and_describe_show_the_signature(handlers):
    [(status, _, answer)] = handle(handlers["ranker"], [({**PREDICTIONS, "url_path": "metadata"}, b"")])
    metadata = json.loads(answer)
    assert status == 200
    assert metadata["inputs"] == [
        {"name": "item_ids", "datatype": "INT64", "shape": [-1]},
        {"name": "features", "datatype": "FP32", "shape": [-1, 4]},
    ]
    assert handlers["ranker"].describe()["metadata"] == metadata


@pytest.mark.parametrize(
    ("make", "edit", "expected"),
    [
        ("mlp", lambda f: (f / "model.pt2").write_bytes(b"not a program"), "does not load with torch.export.load"),
        ("code", lambda f: (f / "signature.yaml").unlink(), "signature.yaml: is missing"),
        ("torchscript", lambda f: (f / "signature.yaml").write_text("max_rows_per_pass: 4\n"), "has no example"),
        ("csv", lambda f: (f / "handler.py").write_text("x = 1\n"), "defines neither preprocess"),
        ("code", lambda f: (f / "weights.safetensors").write_bytes(b"junk"), "does not load as a state_dict"),
    ],
)
def test_prepare_refuses_naming_the_file_and_stages_nothing(tmp_path, make, edit, expected):
    folder = tiny_networks.FOLDERS[make](tmp_path / make)
    edit(folder)
    out = tmp_path / "out"
    with pytest.raises(NetworkFolderError, match=expected):
        prepare_network_model.stage(folder, out)
    assert prepare_network_model.main(["--source", str(folder), "--out", str(out)]) == 1
    assert not out.exists()


def test_a_batch_1_program_is_refused_with_the_fix(tmp_path):
    folder = tmp_path / "one"
    folder.mkdir()
    program = torch.export.export(tiny_networks.seeded(tiny_networks.MLP), (torch.randn(1, 6),))
    torch.export.save(program, str(folder / "model.pt2"))
    with pytest.raises(NetworkFolderError, match=r"batch size 1 only.*Dim\(\"batch\"\)"):
        prepare_network_model.stage(folder, tmp_path / "out")


def test_a_program_whose_pass_is_short_computes_on_one_thread_when_threads_are_left_to_the_handler(staged):
    """handler.threads 0 (cores / workers) on a 2-core share: the tiny MLP's pass takes microseconds, so the worker
    computes it on one thread and describe says why; an explicit threads value is kept as set."""
    chosen = {}
    for threads in (0, 2):
        context = Context(staged["mlp"])
        context.model_yaml_config = {"handler": {"threads": threads}}
        handler = NetworkModelHandler()
        handler.initialize(context)
        chosen[threads] = handler.describe()
    torch.set_num_threads(1)
    assert chosen[0]["threads"] == 1 and "one thread" in chosen[0]["threads_why"]
    assert chosen[2]["threads"] == 2 and chosen[2]["threads_why"] == "set"
