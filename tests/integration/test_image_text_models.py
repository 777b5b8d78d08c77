"""A user's own CLIP, SigLIP or sentence-transformers CLIP folder, from folder to served answer, on a real TorchServe.

Tiny random folders of the three layouts are built offline (scripts/tiny_image_models.py), packaged with the one
command's template (`make package` picks image-model for each) into the model store shared with the classifier test
and served by one TorchServe started from the project's config.properties (tests/conftest.py `image_models`). Their
answers are compared with the reference libraries on the same inputs: text and image embeddings (transformers' model
forward, or sentence-transformers' encode for its folder), zero-shot classification (transformers'
zero-shot-image-classification pipeline: softmax for CLIP, a sigmoid per label for SigLIP); on CLIP also the OpenAI
client's embeddings of texts and Cohere's embed v2 with images.
"""

import base64
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from handlers.image.kinds.image_text_reference import load_reference

REPO = Path(__file__).resolve().parents[2]
MODEL = "t-clip"
# Every image-text layout the kind serves, each its own archive on the shared server.
LAYOUTS = ["t-clip", "t-siglip", "t-st-clip"]
LABELS = ["cat", "dog", "car"]
BOUND = 0.9999


def png(image):
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def photo(width, height, seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def cosines(got, expected):
    return torch.nn.functional.cosine_similarity(torch.tensor(got, dtype=torch.float32), expected.float(), dim=-1)


@pytest.fixture(scope="module")
def references(image_models):
    loaded = {}

    def reference(name=MODEL):
        if name not in loaded:
            loaded[name] = load_reference(image_models.folders[name])
        return loaded[name]

    return reference


@pytest.fixture(scope="module")
def reference(references):
    return references(MODEL)


@pytest.fixture(scope="module")
def store(image_models):
    return image_models.store


@pytest.fixture(scope="module")
def server(image_models):
    return image_models.server


def predict(server, path="", model=MODEL, **kwargs):
    url = f"{server.inference_url}/predictions/{model}" + (f"/1.0/{path}" if path else "")
    return requests.post(url, timeout=60, **kwargs)


@pytest.mark.parametrize("model", LAYOUTS)
def test_the_archive_records_image_text_and_zero_shot_parity(store, model):
    with zipfile.ZipFile(store / f"{model}.mar") as archive:
        source = json.loads(archive.read("model_source.json"))
    assert source["kind"] == "image-text"
    parity = source["parity"]
    assert min(parity["fp32_agreement"], parity["text_vectors"], parity["zero_shot_scores"]) >= BOUND


@pytest.mark.parametrize("model", LAYOUTS)
def test_texts_and_images_are_embedded_as_the_reference_embeds_them(server, references, model):
    reference = references(model)
    image = photo(57, 31, 1)
    raw = predict(server, model=model, data=png(image), headers={"Content-Type": "image/png"})
    assert raw.status_code == 200, raw.text
    expected_image = reference.image_embeddings([image])[0]
    assert cosines(raw.json()["embedding"], expected_image).item() >= BOUND
    texts = ["a photo of a cat", "a dog on the beach"]
    both = predict(server, model=model, json={"texts": texts, "images": [base64.b64encode(png(image)).decode()]})
    assert both.status_code == 200, both.text
    answer = both.json()
    assert cosines(answer["text_embeddings"], reference.text_embeddings(texts)).min().item() >= BOUND
    assert answer["truncated"] == [False, False]
    assert answer["image_embeddings"][0] == raw.json()["embedding"]


@pytest.mark.parametrize("model", LAYOUTS)
def test_zero_shot_is_answered_as_the_pipeline_answers(server, references, model):
    reference = references(model)
    image = photo(80, 64, 2)
    uri = "data:image/png;base64," + base64.b64encode(png(image)).decode()
    response = predict(server, model=model, json={"image": uri, "candidate_labels": LABELS})
    assert response.status_code == 200, response.text
    expected = reference.zero_shot(image, LABELS)
    assert [a["label"] for a in response.json()] == [e["label"] for e in expected]
    assert np.allclose([a["score"] for a in response.json()], [e["score"] for e in expected], atol=1e-5)


def test_the_openai_client_and_cohere_embed_v2_with_images(server, reference):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.inference_url}/predictions/{MODEL}/1.0/v1", api_key="unused")
    texts = ["a photo of a cat", "a red car"]
    embedded = client.embeddings.create(model=MODEL, input=texts)
    got = [item.embedding for item in embedded.data]
    assert cosines(got, reference.text_embeddings(texts)).min().item() >= BOUND
    image = photo(40, 40, 3)
    uri = "data:image/png;base64," + base64.b64encode(png(image)).decode()
    cohere = predict(server, "v2/embed", json={"model": MODEL, "images": [uri], "embedding_types": ["float"]})
    assert cohere.status_code == 200, cohere.text
    assert cosines(cohere.json()["embeddings"]["float"], reference.image_embeddings([image])).min().item() >= BOUND


def test_a_bad_image_and_a_bad_body_get_a_4xx_naming_the_problem(server):
    bad = predict(server, json={"images": ["bm90IGFuIGltYWdl"], "candidate_labels": LABELS})
    assert 400 <= bad.status_code < 500 and "images" in bad.json()["message"], bad.text
    cohere = predict(server, "v2/embed", json={"texts": ["a"], "images": ["b"]})
    assert cohere.status_code == 400 and "one of" in cohere.json()["message"], cohere.text
