"""A team's own PyTorch networks served by a real TorchServe: each tiny folder of scripts/tiny_networks.py (an exported
MLP with only model.pt2, a ranker with int64 ids and a signature file, a sequence model of dynamic length, model code
with weights, a TorchScript file, a model.pt2 with handler.py hooks reading raw CSV) packaged with the template
`make package` picks (`scripts.package --template-for`), on one shared server. Clients call as outsiders do:
tritonclient.http with its default settings (binary outputs), raw JSON bodies of the Open Inference Protocol as curl
sends them, the native form, text/csv. Every answer is compared with the eager module computed here."""

import concurrent.futures
import json
import subprocess
import sys

import numpy as np
import pytest
import requests
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import tiny_networks
from tests.conftest import REPO, template_for_cli

NAMES = {
    "t-mlp": "mlp",
    "t-ranker": "ranker",
    "t-seq": "sequence",
    "t-code": "code",
    "t-ts": "torchscript",
    "t-csv": "csv",
    "t-mlp-ov": "mlp",
}
# Every archive packages with --var backends=none (eager serves, and packaging takes seconds), except one: the MLP
# with an OpenVINO candidate at fp32 (it converts in about a second; AOTInductor's minute of compilation stays in
# tests/unit/test_network_backends.py), kept even where the ranking puts it behind eager (a 2-layer program's speed
# is noise) and served at fp32, so that a compiled backend's answers through TorchServe can be held to the fp32 gate.
COMPILED = "t-mlp-ov"
PACKAGE_OPTIONS = {
    COMPILED: ["--var", "backends=openvino", "--var", "rank_seconds=1", "--var", "keep_slower=true"]
    + ["--config", "handler.precision=fp32"],
}
FUZZED = "t-ranker"  # ids with a range and float features: the richest signature of the set


class Networks:
    def __init__(self, folders, store, server):
        self.folders, self.store, self.server = folders, store, server
        self.url = server.inference_url

    def client(self):
        return httpclient.InferenceServerClient(self.url.removeprefix("http://"), network_timeout=60)

    def post(self, path, **kwargs):
        return requests.post(f"{self.url}/{path}", timeout=60, **kwargs)

    def pid(self, model):
        return [worker["pid"] for worker in self.server.management().description(model)["workers"]]


def package(name, folder, store):
    command = [sys.executable, "-m", "scripts.package", template_for_cli(folder), "--name", name]
    command += ["--var", f"model_dir={folder}", "--store", str(store)]
    command += PACKAGE_OPTIONS.get(name, ["--var", "backends=none"])
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def networks(start_ts_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("network-folders")
    folders = {name: tiny_networks.FOLDERS[kind](root / name) for name, kind in NAMES.items()}
    assert {template_for_cli(folder) for folder in folders.values()} == {"network-model"}
    store = tmp_path_factory.mktemp("network-store")
    running = {name: package(name, folder, store) for name, folder in folders.items()}
    for name, process in running.items():
        output, _ = process.communicate(timeout=900)
        assert process.returncode == 0, f"packaging {name} failed:\n{output}"
    server = start_ts_server(name="network-models", models=sorted(folders), store=store)
    return Networks(folders, store, server)


def eager(kind, *arrays):
    modules = {
        "mlp": tiny_networks.MLP,
        "ranker": tiny_networks.Ranker,
        "sequence": tiny_networks.Sequence,
        "torchscript": tiny_networks.Sequence,
        "csv": tiny_networks.MLP,
    }
    module = tiny_networks.code_module() if kind == "code" else tiny_networks.seeded(modules[kind])
    with torch.inference_mode():
        return module(*(torch.from_numpy(np.asarray(a)) for a in arrays)).numpy()


def infer_input(name, array, datatype):
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_tritonclient_defaults_against_each_network(networks):
    """infer() with InferInput/set_data_from_numpy and InferRequestedOutput as they come: binary inputs, binary
    outputs (the Inference-Header-Content-Length framing both ways)."""
    rng = np.random.default_rng(0)
    client = networks.client()
    x = rng.standard_normal((3, 6), dtype=np.float32)
    result = client.infer("t-mlp", [infer_input("x", x, "FP32")], outputs=[httpclient.InferRequestedOutput("output0")])
    assert np.allclose(result.as_numpy("output0"), eager("mlp", x), atol=1e-6)
    ids, features = np.array([0, 39, 5], dtype=np.int64), rng.standard_normal((3, 4), dtype=np.float32)
    inputs = [infer_input("item_ids", ids, "INT64"), infer_input("features", features, "FP32")]
    assert np.allclose(client.infer("t-ranker", inputs).as_numpy("output0"), eager("ranker", ids, features), atol=1e-6)
    x5 = rng.standard_normal((2, 5), dtype=np.float32)
    assert np.allclose(
        client.infer("t-code", [infer_input("x", x5, "FP32")]).as_numpy("output0"), eager("code", x5), atol=1e-5
    )
    tokens, mask = rng.integers(0, 30, (2, 9)), np.ones((2, 9), np.float32)
    inputs = [infer_input("tokens", tokens, "INT64"), infer_input("mask", mask, "FP32")]
    assert np.allclose(client.infer("t-ts", inputs).as_numpy("output0"), eager("torchscript", tokens, mask), atol=1e-5)


def test_raw_json_oip_as_curl_sends_it_and_the_classification_extension(networks):
    body = {
        "id": "7",
        "inputs": [
            {"name": "item_ids", "shape": [2], "datatype": "INT64", "data": [3, 4]},
            {"name": "features", "shape": [2, 4], "datatype": "FP32", "data": [[0.5, 0, 0, 1], [1, 1, 0, 0]]},
        ],
        "outputs": [{"name": "output0"}, {"name": "output0", "parameters": {"classification": 1}}],
    }
    answer = networks.post(
        "v2/models/t-ranker/infer", data=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 200, answer.text
    value = answer.json()
    assert value["id"] == "7" and value["model_name"] == "t-ranker"
    expected = eager("ranker", [3, 4], np.array([[0.5, 0, 0, 1], [1, 1, 0, 0]], np.float32))
    scores, classes = value["outputs"]
    assert scores["shape"] == [2, 3] and np.allclose(scores["data"], expected.reshape(-1), atol=1e-6)
    labels = [text.split(":")[2] for text in classes["data"]]
    assert labels == [tiny_networks.LABELS[i] for i in expected.argmax(1)]


def test_native_form_on_predictions(networks):
    tokens, mask = [[1, 2, 3, 4, 5]], [[1.0, 1.0, 1.0, 1.0, 0.0]]
    answer = networks.post("predictions/t-seq", json={"inputs": {"tokens": tokens, "mask": mask}})
    assert answer.status_code == 200, answer.text
    expected = eager("sequence", tokens, np.array(mask, np.float32))
    assert np.allclose(answer.json()["outputs"]["output0"], expected, atol=1e-6)


def test_concurrent_requests_of_different_shapes_equal_eager(networks):
    rng = np.random.default_rng(1)
    bodies = []
    for length in (3, 5, 3, 8, 5, 2, 8, 3):
        rows = int(rng.integers(1, 4))
        tokens = rng.integers(0, 30, (rows, length))
        mask = (rng.random((rows, length)) > 0.2).astype(np.float32)
        bodies.append((tokens, mask))

    def call(pair):
        tokens, mask = pair
        body = {"inputs": {"tokens": tokens.tolist(), "mask": mask.tolist()}}
        return networks.post("predictions/t-seq", json=body)

    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(call, bodies))
    for (tokens, mask), answer in zip(bodies, answers, strict=True):
        assert answer.status_code == 200, answer.text
        assert np.allclose(answer.json()["outputs"]["output0"], eager("sequence", tokens, mask), atol=1e-5)


def test_each_bad_tensor_fails_alone_and_the_worker_lives(networks):
    before = networks.pid("t-ranker")
    good = {"inputs": {"item_ids": [1, 2], "features": [[0.0, 0.1, 0.2, 0.3], [1.0, 1.0, 1.0, 1.0]]}}
    bad = {
        "item_ids": {"inputs": {"item_ids": [1, 45], "features": [[0.0] * 4, [0.0] * 4]}},  # beyond the range
        "features": {"inputs": {"item_ids": [1], "features": [[0.0] * 5]}},  # one value too many
        "item_ids ": {"inputs": {"item_ids": [1.5], "features": [[0.0] * 4]}},  # a fraction for an id
    }
    bodies = [good, *bad.values(), good]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: networks.post("predictions/t-ranker", json=body), bodies))
    expected = eager("ranker", [1, 2], np.array(good["inputs"]["features"], np.float32))
    for answer in (answers[0], answers[-1]):
        assert answer.status_code == 200 and np.allclose(answer.json()["outputs"]["output0"], expected, atol=1e-6)
    for name, answer in zip(bad, answers[1:-1], strict=True):
        assert answer.status_code == 400, answer.text
        assert f"input '{name.strip()}'" in answer.json()["message"]
    client = networks.client()
    with pytest.raises(InferenceServerException, match="item_ids") as refused:
        ids, features = np.array([49], np.int64), np.zeros((1, 4), np.float32)
        client.infer("t-ranker", [infer_input("item_ids", ids, "INT64"), infer_input("features", features, "FP32")])
    assert refused.value.status() == "400"
    assert networks.pid("t-ranker") == before


def test_handler_py_reads_raw_csv_text_and_its_refusal_is_a_400(networks):
    line = "0.5,1,2,-1,0,3"
    answer = networks.post("predictions/t-csv", data=line, headers={"Content-Type": "text/csv"})
    assert answer.status_code == 200, answer.text
    scores = eager("csv", np.array([[float(v) for v in line.split(",")]], np.float32))[0]
    assert answer.json() == {
        "label": tiny_networks.LABELS[int(scores.argmax())],
        "scores": pytest.approx(scores.tolist(), abs=1e-6),
    }
    refused = networks.post("predictions/t-csv", data="1,2", headers={"Content-Type": "text/csv"})
    assert refused.status_code == 400 and refused.json()["message"] == "expected 6 comma-separated numbers, got 2"
    # The protocol path skips the hooks: the program's own tensors.
    x = np.array([[float(v) for v in line.split(",")]], np.float32)
    assert np.allclose(
        networks.client().infer("t-csv", [infer_input("x", x, "FP32")]).as_numpy("output0"), scores[None], atol=1e-6
    )


def test_metadata_where_torchserve_leaves_it_to_the_model(networks):
    """TorchServe answers GET /v2/models/<m> itself (404); the protocol's metadata is at the model's metadata route
    and in the customized describe."""
    assert requests.get(f"{networks.url}/v2/models/t-ranker", timeout=30).status_code == 404
    answer = networks.post("predictions/t-ranker/1.0/metadata")
    assert answer.status_code == 200, answer.text
    assert answer.json()["inputs"] == [
        {"name": "item_ids", "datatype": "INT64", "shape": [-1]},
        {"name": "features", "datatype": "FP32", "shape": [-1, 4]},
    ]
    choices = networks.server.management().handler_choices("t-ranker")
    assert choices["metadata"] == answer.json()


def test_a_batch_1_program_is_refused_at_package_time(networks, tmp_path):
    folder = tmp_path / "one-row"
    folder.mkdir()
    program = torch.export.export(tiny_networks.seeded(tiny_networks.MLP), (torch.randn(1, 6),))
    torch.export.save(program, str(folder / "model.pt2"))
    process = package("t-one", folder, networks.store)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 1
    assert "batch size 1 only" in output and 'Dim("batch")' in output and "Traceback" not in output
    assert not (networks.store / "t-one.mar").exists()


def test_a_compiled_backend_serves_through_torchserve_with_eagers_answers_and_says_so(networks):
    """The archive packaged with an OpenVINO candidate serves it (backend auto, precision fp32), describes the choice
    and every candidate in the customized describe and the metadata route, and answers what eager answers within the
    fp32 gate (1e-5 relative), as the eager-served archive of the same MLP does exactly."""
    choices = networks.server.management().handler_choices(COMPILED)
    assert (choices["backend"], choices["precision"], choices["requested_backend"]) == ("openvino", "fp32", "auto")
    assert choices["backend_reason"].startswith("rank ")
    candidates = choices["backends"]["candidates"]
    [fp32] = [c for c in candidates if (c["backend"], c["precision"]) == ("openvino", "fp32")]
    assert fp32["gate_max_relative"] <= 1e-5 and fp32["gate_min_cosine"] >= 0.9999 and fp32["ms_per_row"] > 0
    eager_choices = networks.server.management().handler_choices("t-mlp")
    assert (eager_choices["backend"], eager_choices["precision"]) == ("eager", "fp32")
    assert eager_choices["backend_reason"].startswith("eager: backends/manifest.json lists none")

    metadata = networks.post(f"predictions/{COMPILED}/1.0/metadata").json()
    assert metadata["parameters"]["backend"] == "openvino" and metadata["parameters"]["candidates"] == candidates

    x = np.random.default_rng(5).standard_normal((7, 6), dtype=np.float32)
    answer = networks.post(f"predictions/{COMPILED}", json={"inputs": {"x": x.tolist()}})
    assert answer.status_code == 200, answer.text
    got, expected = np.array(answer.json()["outputs"]["output0"]), eager("mlp", x)
    assert np.abs(got - expected).max() / np.abs(expected).max() <= 1e-5
    binary = networks.client().infer(COMPILED, [infer_input("x", x, "FP32")]).as_numpy("output0")
    assert np.abs(binary - expected).max() / np.abs(expected).max() <= 1e-5


def test_a_short_fuzz_campaign_against_a_served_network(networks):
    """150 tensor-grammar cases (valid and invalid, every dialect) from 4 clients against the served ranker, each
    judged against the engine computing that request alone in process: 0 5xx, every case right, no worker restart
    (`make reliability` runs the long campaign)."""
    from scripts.reliability import fuzz

    row = fuzz.archive_network_campaign(networks.server, FUZZED, networks.store, requests=150, seed=3, clients=4)
    details = row.details
    assert details["counts"] == {name: 0 for name in fuzz.NETWORK_CLASSES}, row.figure
    assert not [status for status in details["statuses"] if status == "0" or status.startswith("5")]
    assert details["pids_before"] and details["pids_before"] == details["pids_after"]
    assert details["worker_restarts"] == 0 and row.passed
    assert {"200", "400"} <= set(details["statuses"])  # both sides of the grammar were exercised
