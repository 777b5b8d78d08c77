"""Model identity with a real TorchServe and the shared cache tier: a model retrained and re-packaged under the same
name and version never answers with the old model's vectors, and every answer names the content that made it.

The finding this guards (issue 32): package a folder as NAME, embed a text, retrain, package the new folder as NAME
again and register it: the text embedded before came back with the OLD vector from the shared Valkey tier (its key
named the model, version, backend, precision and token limit, never the weights), new texts with the new model's.
Here a tiny BERT embedder (scripts/tiny_text_models.py) is packaged by scripts/package.py, served with the session's
cache server, then a second folder of the same architecture and width with other random weights is packaged under the
same name and version and registered in its place. Both texts must equal the new model's sentence-transformers vectors.

Also: the identity is in describe and in the X-Model-Identity header of every answer (200, 4xx, a streamed
generator answer, the classifier's), equal to what the archive records.
"""

import json
import zipfile

import pytest
import requests
import torch

from handlers.core import identity
from scripts import package, tiny_text_models

NAME = "t-identity"
TEXT_A, TEXT_B = "the text embedded before the retraining", "a text embedded only after it"


def make_folder(folder, seed):
    """The tiny BERT embedder, its weights drawn with ``seed`` (same architecture, width and tokenizer)."""
    default = tiny_text_models.SEED
    tiny_text_models.SEED = seed
    try:
        return tiny_text_models.make_bert_cls_normalize_embedder(folder)
    finally:
        tiny_text_models.SEED = default


def build(folder, store):
    """`make package NAME=t-identity MODEL_DIR=folder` (the embedding template, no compiled backends)."""
    variables = {"model_dir": str(folder), "backends": "none"}
    return package.build("embedding", store, variables=variables, model_name=NAME, log=lambda *_: None)


def recorded_identity(store):
    with zipfile.ZipFile(store / f"{NAME}.mar") as archive:
        return json.loads(archive.read(identity.IDENTITY_FILE))["identity"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity-models")
    first, second = make_folder(root / "first", 0), make_folder(root / "retrained", 1)
    return first, second


@pytest.fixture(scope="module")
def store(tmp_path_factory, folders):
    store = tmp_path_factory.mktemp("identity-store")
    build(folders[0], store)
    for name in ("classifier", "generator"):  # packed from build/ (their prepare steps are up to date)
        package.build(name, store, log=lambda *_: None)
    return store


@pytest.fixture(scope="module")
def server(start_ts_server, store):
    # The session's cache server is the shared tier (conftest sets its URL for every worker).
    return start_ts_server(name="identity", models=[NAME, "classifier", "generator"], store=store)


def embed(server, texts):
    response = requests.post(f"{server.inference_url}/predictions/{NAME}", json={"input": texts}, timeout=60)
    assert response.status_code == 200, response.text
    return torch.tensor([row["embedding"] for row in response.json()["data"]]), response.headers


def described_identity(server, name):
    return server.management(timeout=60).handler_choices(name)["identity"]


def test_a_retrained_model_under_the_same_name_and_version_never_answers_with_the_old_vectors(server, store, folders):
    first, retrained = folders
    old_reference = tiny_text_models.reference_embeddings(first, [TEXT_A])
    new_reference = tiny_text_models.reference_embeddings(retrained, [TEXT_A, TEXT_B])
    assert float(torch.nn.functional.cosine_similarity(old_reference[0], new_reference[0], dim=0)) < 0.99

    old_identity = recorded_identity(store)
    served, headers = embed(server, [TEXT_A])  # computed, and stored in the shared tier
    assert float(torch.nn.functional.cosine_similarity(served[0], old_reference[0], dim=0)) >= 0.999
    assert headers[identity.HEADER] == old_identity == described_identity(server, NAME)

    client = server.management(timeout=120)
    client.unregister(NAME, "1.0")
    entry = build(retrained, store)
    assert entry["rebuilt"] and entry["version"] == "1.0"
    new_identity = recorded_identity(store)
    assert new_identity != old_identity and entry["identity"] == new_identity
    client.register(f"{NAME}.mar", timeout=600)
    client.wait_ready(NAME, timeout=600)

    served, headers = embed(server, [TEXT_A, TEXT_B])
    similarity = torch.nn.functional.cosine_similarity(served, new_reference)
    assert similarity.min() >= 0.999, similarity  # TEXT_A too: not the old model's vector from the shared tier
    assert headers[identity.HEADER] == new_identity == described_identity(server, NAME)


def test_every_answer_carries_the_identity_header(server, store):
    base = f"{server.inference_url}/predictions"
    refused = requests.post(f"{base}/{NAME}", json={"input": 5}, timeout=60)
    assert refused.status_code == 400 and refused.headers[identity.HEADER].startswith(identity.PREFIX)

    classified = requests.post(f"{base}/classifier", json={"inputs": [0.1] * 128}, timeout=60)
    assert classified.status_code == 200, classified.text
    with zipfile.ZipFile(store / "classifier.mar") as archive:
        assert classified.headers[identity.HEADER] == json.loads(archive.read(identity.IDENTITY_FILE))["identity"]

    body = {"prompt": "Once upon a time", "max_new_tokens": 6, "stream": True, "seed": 1}
    with requests.post(f"{base}/generator", json=body, stream=True, timeout=120) as streamed:
        assert streamed.status_code == 200
        lines = [line for line in streamed.iter_lines() if line]
    assert len(lines) > 1  # it did stream
    with zipfile.ZipFile(store / "generator.mar") as archive:
        assert streamed.headers[identity.HEADER] == json.loads(archive.read(identity.IDENTITY_FILE))["identity"]
