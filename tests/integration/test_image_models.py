"""A user's own image classifier, from folder to served answer, against a real TorchServe.

A tiny random ViT classifier folder is built offline (scripts/tiny_image_models.py), packaged with the template
`make package` picks for an image folder (`python -m scripts.package --template-for FOLDER` says image-model) into a
model store shared with the image-text test, and served by one TorchServe started from the project's
config.properties (tests/conftest.py `image_models`). Answers are compared
with transformers' image-classification pipeline on the same images: PNG and JPEG raw bodies, JSON with base64 and a
data: URI, several images in one request, top_k; a bad image in a batch fails alone with a 4xx naming the problem.
"""

import base64
import concurrent.futures
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image

from scripts import tiny_image_models

REPO = Path(__file__).resolve().parents[2]
MODEL = "t-vit"
BATCHED = "t-vit-batched"  # the same archive registered with a batch delay, so concurrent requests share a batch


def encoded(image, fmt, **options):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def photo(width, height, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(1, width - 1), y * 255 / max(1, height - 1), (x + y) % 256], axis=-1)
    noisy = base + rng.normal(0, 30, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


@pytest.fixture(scope="module")
def folder(image_models):
    return image_models.folders[MODEL]


@pytest.fixture(scope="module")
def store(image_models):
    return image_models.store


@pytest.fixture(scope="module")
def server(image_models):
    return image_models.server


@pytest.fixture(scope="module")
def pipeline(folder):
    from transformers import pipeline

    return pipeline("image-classification", model=str(folder))


def predict(server, model=MODEL, **kwargs):
    return requests.post(f"{server.inference_url}/predictions/{model}", timeout=60, **kwargs)


def assert_like_pipeline(answer, expected):
    assert [a["label"] for a in answer] == [e["label"] for e in expected]
    assert np.allclose([a["score"] for a in answer], [e["score"] for e in expected], atol=1e-5)


def test_the_archive_records_parity_with_transformers_in_fp32(store):
    with zipfile.ZipFile(store / f"{MODEL}.mar") as archive:
        source = json.loads(archive.read("model_source.json"))
        served = json.loads(archive.read("image_model.json"))
    assert source["kind"] == "image-classification"
    assert source["parity"]["fp32_agreement"] >= 0.9999
    assert source["parity"]["pixel_values_max_difference"] == 0.0
    assert served["preprocessing"]["processor_class"] == "ViTImageProcessor"


@pytest.mark.parametrize(("fmt", "content_type"), [("PNG", "image/png"), ("JPEG", "image/jpeg")])
def test_a_raw_image_body_is_answered_as_the_pipeline_answers(server, pipeline, fmt, content_type):
    body = encoded(photo(97, 45, 1), fmt)
    response = predict(server, data=body, headers={"Content-Type": content_type})
    assert response.status_code == 200, response.text
    assert_like_pipeline(response.json(), pipeline(Image.open(io.BytesIO(body))))
    assert response.headers["X-Model-Identity"].startswith("sha256:")


def test_json_base64_images_and_top_k(server, pipeline):
    bodies = [encoded(photo(40, 64, 2), "PNG"), encoded(photo(300, 200, 3), "JPEG", quality=85)]
    data_uri = "data:image/png;base64," + base64.b64encode(bodies[0]).decode()
    single = predict(server, json={"image": data_uri, "top_k": 2})
    assert single.status_code == 200, single.text
    assert_like_pipeline(single.json(), pipeline(Image.open(io.BytesIO(bodies[0])), top_k=2))
    several = predict(server, json={"images": [base64.b64encode(b).decode() for b in bodies], "top_k": 1})
    assert several.status_code == 200, several.text
    expected = [pipeline(Image.open(io.BytesIO(b)), top_k=1) for b in bodies]
    assert len(several.json()) == 2
    for answer, want in zip(several.json(), expected, strict=True):
        assert_like_pipeline(answer, want)


def test_a_bad_image_in_a_batch_fails_alone_with_a_4xx_naming_the_problem(server):
    client = server.management()
    if not client.registered(BATCHED):
        client.register(
            f"{MODEL}.mar", model_name=BATCHED, batch_size=4, max_batch_delay=300, initial_workers=1, timeout=600
        )
    good = encoded(photo(50, 30, 4), "PNG")
    bodies = [good, b"\x89PNG\r\n\x1a\n truncated", encoded(photo(20, 90, 5), "JPEG"), b"<svg></svg>"]
    types = ["image/png", "image/png", "image/jpeg", "image/svg+xml"]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(
            pool.map(
                lambda pair: predict(server, BATCHED, data=pair[0], headers={"Content-Type": pair[1]}),
                zip(bodies, types, strict=True),
            )
        )
    assert [r.status_code for r in responses][0::2] == [200, 200]
    for bad in (responses[1], responses[3]):
        assert 400 <= bad.status_code < 500, bad.text
        error = bad.json()
        assert set(error) == {"code", "type", "message"} and error["code"] == bad.status_code
    assert "PNG" in responses[1].json()["message"] and "SVG" in responses[3].json()["message"]


def test_image_bytes_over_grpc_get_the_http_answer_and_a_bad_image_its_error(server, pipeline):
    """A gRPC client sends the image file's bytes as the Predictions input (no Content-Type on gRPC: the format is
    read from the bytes): the answer is the HTTP raw body's, byte for byte; a truncated file gets the same JSON 4xx
    body as over HTTP (TorchServe 0.12 sends a model's own 4xx with gRPC status OK, docs/clients.md)."""
    from scripts.ops.grpc_client import TorchServeGrpc, answer_error

    good = encoded(photo(61, 83, 6), "JPEG", quality=90)
    bad = b"\x89PNG\r\n\x1a\n truncated"
    with TorchServeGrpc.for_server(server, timeout=120) as client:
        over_grpc = client.predict(MODEL, good)
        refused = client.predict(MODEL, bad)
    over_http = predict(server, data=good, headers={"Content-Type": "image/jpeg"})
    assert over_http.status_code == 200, over_http.text
    assert over_grpc == over_http.content and answer_error(over_grpc) is None
    assert_like_pipeline(json.loads(over_grpc), pipeline(Image.open(io.BytesIO(good))))
    error = answer_error(refused)
    assert error is not None and 400 <= error["code"] < 500 and "PNG" in error["message"], refused
    http_refusal = predict(server, data=bad, headers={"Content-Type": "image/png"})
    assert json.loads(refused) == http_refusal.json()


def test_describe_says_what_serves_and_how_images_are_prepared(server):
    response = requests.get(f"{server.management_url}/models/{MODEL}", params={"customized": "true"}, timeout=30)
    metadata = response.json()[0]["customizedMetadata"]
    described = json.loads(metadata) if isinstance(metadata, str) else metadata
    assert described["model"]["kind"] == "image-classification"
    assert described["model"]["labels"] == list(tiny_image_models.LABELS)
    assert described["model"]["preprocessing"]["size"] == {"height": 32, "width": 32}
    # the raw customized describe leaves the model serving (every spelling: tests/integration/test_management_safety.py)
    image = base64.b64encode(encoded(photo(24, 16, 7), "PNG")).decode()
    assert predict(server, json={"image": image}).status_code == 200


class FineImage:
    """The good request the reliability suite's corpus run sends after each bad one: a small PNG as JSON base64."""

    def __init__(self, model):
        self.name = model
        self.image = base64.b64encode(encoded(photo(24, 16, 7), "PNG")).decode()

    def body(self, index):
        return json.dumps({"image": self.image, "top_k": 3})

    def matches(self, index, answer):
        return [entry["label"] for entry in answer] != [] and len(answer) == 3


def test_the_bad_image_corpus_gets_its_4xx_each_and_no_worker_restarts(server):
    """tests/data/bad_requests/t-vit.yaml (damaged files, bombs, refused formats, wrong Content-Types, bad JSON), a
    good request after each: the reliability suite's corpus run (scripts/reliability/correctness.py)."""
    from scripts.reliability import correctness

    cases, failures, pids_before, pids_after = correctness.run_bad_input(server, FineImage(MODEL))
    assert cases and not failures, "\n".join(failures)
    assert pids_after == pids_before


def test_a_short_image_fuzz_campaign_gets_no_5xx_no_restarts_and_only_well_shaped_answers(server, store):
    """The fuzzer's image grammar (scripts/reliability/image_grammar.py) against t-vit, by the same campaign the
    text models get (tests/integration/test_fuzz_server.py): 150 seeded cases from 8 clients at once, so damaged and
    good images share batches. The kind, grammar and oracle come from the archive (scripts/ops/registry.py)."""
    from scripts.reliability import fuzz

    requests_sent = 150
    row = fuzz.campaign(server, MODEL, store, requests=requests_sent, seed=34, clients=8)
    print(row.figure)
    details = row.details
    assert row.passed, f"{row.figure}\n{json.dumps(details['examples'], indent=1)[:6000]}"
    assert details["worker_restarts"] == 0
    statuses = {int(status): n for status, n in details["statuses"].items()}
    assert sum(statuses.values()) == requests_sent and not any(s >= 500 for s in statuses)
    # Valid, invalid and either-way images were all sent, and every valid one was answered.
    assert all(details["expected"].get(e, 0) > 0 for e in ("ok", "error", "either")), details["expected"]
    assert statuses.get(200, 0) >= details["expected"]["ok"]
    assert any(400 <= s < 500 for s in statuses)


def test_the_management_campaign_leaves_the_image_model_serving(server, store):
    """The management-API campaign's short form (tests/integration/test_management_campaign.py) on the image kind:
    every call sent raw while t-vit is under load, a copy of its archive registered, scaled to 0 and back and
    unregistered under load; afterwards t-vit answers with its own answer and kept its workers."""
    from scripts.reliability import management

    image = base64.b64encode(encoded(photo(24, 16, 7), "PNG")).decode()
    rows = management.campaign(
        server, [MODEL], store, copy_of=MODEL, rounds=1, clients=2, bodies={MODEL: {"image": image, "top_k": 3}}
    )
    failed = [f"{row.check}: {row.figure} {row.details}" for row in rows if not row.passed]
    assert not failed, "\n".join(failed)
