"""The image-text kind's model path in process, on tiny random CLIP, SigLIP and sentence-transformers CLIP folders
(scripts/tiny_image_models.py): its text and image vectors equal the reference libraries' (transformers' model
forward, sentence-transformers' encode), and its zero-shot answers equal transformers' zero-shot-image-classification
pipeline's, sigmoid for SigLIP and softmax for CLIP."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from handlers.image.image_text_model import (
    load_image_text_model,
    load_text_encoder,
    read_image_text_folder,
)
from handlers.image.kinds.image_text_reference import load_reference
from handlers.text.folder import FolderError
from scripts import tiny_image_models

TEXTS = ["a photo of a cat", "a photo of a dog", "Bonjour le monde, très chaud!", "x"]
LABELS = ["cat", "dog", "car", "house"]
BOUND = 0.9999


def _images():
    """Four images of different sizes and content: noise, a gradient, flat colour, a wide one."""
    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8))
    ramp = np.linspace(0, 255, 64 * 64 * 3).reshape(64, 64, 3).astype(np.uint8)
    return [noise, Image.fromarray(ramp), Image.new("RGB", (33, 33), (200, 30, 90)), noise.resize((120, 40))]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("image-text")
    clip = tiny_image_models.make_clip(root / "clip")
    return {
        "clip": clip,
        "siglip": tiny_image_models.make_siglip(root / "siglip"),
        "st-clip": tiny_image_models.make_sentence_transformers_clip(root / "st-clip", clip),
    }


def _served(folder):
    info = read_image_text_folder(folder)
    model = load_image_text_model(folder, info)
    return info, model, load_text_encoder(folder, info, model.text)


def _cosines(a, b):
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


@pytest.mark.parametrize("name", ["clip", "siglip", "st-clip"])
def test_text_and_image_vectors_equal_the_reference_library(folders, name):
    info, model, encoder = _served(folders[name])
    reference = load_reference(folders[name])
    expected_texts = reference.text_embeddings(TEXTS)
    got_texts = torch.stack([text.vector for text in encoder.encode(TEXTS)])
    assert got_texts.shape == expected_texts.shape
    assert _cosines(got_texts, expected_texts).min() >= BOUND
    # Vectors of different texts differ: a blind tower would pass the parity above with any input.
    assert _cosines(got_texts[0:1], got_texts[2:3]).item() < 0.99
    images = _images()
    pixels = reference.image_processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        got_images = model.image(pixels)
    expected_images = reference.image_embeddings(images)
    assert _cosines(got_images, expected_images).min() >= BOUND
    assert torch.allclose(got_images.norm(dim=-1), expected_images.norm(dim=-1), rtol=1e-4)
    assert _cosines(got_images[0:1], got_images[1:2]).item() < 0.99


def test_sentence_transformers_clip_vectors_are_encodes_unnormalized_ones_and_the_transformers_ones_unit(folders):
    info = read_image_text_folder(folders["st-clip"])
    assert info.sentence_transformers and not info.normalize and info.architecture == "CLIPModel"
    _, _, encoder = _served(folders["st-clip"])
    assert abs(float(encoder.encode(TEXTS[:1])[0].vector.norm()) - 1.0) > 1e-3
    _, _, encoder = _served(folders["clip"])
    assert abs(float(encoder.encode(TEXTS[:1])[0].vector.norm()) - 1.0) < 1e-5


@pytest.mark.parametrize("name", ["clip", "siglip", "st-clip"])
@pytest.mark.parametrize("template", ["This is a photo of {}.", "{}"])
def test_zero_shot_scores_equal_the_pipeline(folders, name, template):
    info, model, encoder = _served(folders[name])
    reference = load_reference(folders[name])
    image = _images()[1]
    expected = reference.zero_shot(image, LABELS, template)
    pixels = reference.image_processor(images=[image], return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        image_vectors = model.image(pixels)
    labels = torch.stack([text.vector for text in encoder.encode([template.format(label) for label in LABELS])])
    scores = model.scores(image_vectors, labels)[0]
    got = sorted(zip(scores.tolist(), LABELS, strict=True), key=lambda pair: -pair[0])
    assert [label for _, label in got] == [answer["label"] for answer in expected]
    assert np.allclose([score for score, _ in got], [answer["score"] for answer in expected], atol=1e-5)
    if name == "siglip":  # a sigmoid per label: the scores need not sum to 1
        assert abs(sum(answer["score"] for answer in expected) - 1.0) > 1e-3
    else:
        assert abs(sum(score for score, _ in got) - 1.0) < 1e-5


def test_siglip_texts_are_padded_to_64_tokens_without_a_mask_as_the_pipeline_pads_them(folders):
    _, _, encoder = _served(folders["siglip"])
    inputs = encoder.tokenizer(TEXTS, return_tensors="pt", **encoder.options)
    assert inputs["input_ids"].shape[1] == 64 and "attention_mask" not in inputs


def test_a_long_text_is_cut_at_the_tower_limit_and_says_so(folders):
    _, _, encoder = _served(folders["clip"])
    long_text = "word " * 200
    cut, short = encoder.encode([long_text, "short"])
    assert cut.truncated and cut.tokens == encoder.max_tokens == 77
    assert not short.truncated and short.tokens < 77


def test_siglip2_and_foreign_modules_are_refused_by_name(folders, tmp_path):
    siglip2 = tmp_path / "siglip2"
    siglip2.mkdir()
    (siglip2 / "config.json").write_text(json.dumps({"model_type": "siglip2", "architectures": ["Siglip2Model"]}))
    with pytest.raises(FolderError, match="Siglip2Model"):
        read_image_text_folder(siglip2)
    pooled = tmp_path / "pooled"
    pooled.mkdir()
    modules = json.loads((folders["st-clip"] / "modules.json").read_text())
    modules.append({"idx": 9, "name": "9", "path": "9_Pooling", "type": "sentence_transformers.models.Pooling"})
    (pooled / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(FolderError, match="Pooling"):
        read_image_text_folder(pooled)
