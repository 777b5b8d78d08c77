"""The image engine in process, on a tiny random ViT classifier staged by the image-model prepare step: answers as
transformers' image-classification pipeline, a bad image failing its own request only, the LRU by the bytes' digest,
the packaging refusals, and the template make package picks."""

import io

import numpy as np
import pytest
from PIL import Image

from handlers.core.errors import RequestError
from scripts import tiny_image_models


def encoded(image, fmt, **options):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def photo(width, height, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_image_models.make_vit_classifier(tmp_path_factory.mktemp("tiny-vit") / "source")


@pytest.fixture(scope="module")
def staged(folder, tmp_path_factory):
    from scripts.prepare_image_model import stage

    out = tmp_path_factory.mktemp("tiny-vit-staged") / "model"
    record = stage(str(folder), out, None, None)
    assert record["parity"]["fp32_agreement"] >= 0.9999
    assert record["parity"]["pixel_values_max_difference"] == 0.0  # the served pixels are the processor's
    return out


@pytest.fixture(scope="module")
def engine(staged):
    from handlers.image.engine import ImageEngine

    return ImageEngine.load(staged, {"precision": "fp32"}, threads=1)


@pytest.fixture(scope="module")
def pipeline(folder):
    from transformers import pipeline

    return pipeline("image-classification", model=str(folder))


def test_answers_are_the_pipelines_for_png_and_jpeg_of_any_size(engine, pipeline):
    from handlers.image.kinds.classification import ImageClassificationKind

    images = [photo(45, 97, 1), photo(640, 427, 2), photo(1, 1, 3), photo(32, 32, 4)]
    bodies = [encoded(images[0], "PNG"), encoded(images[1], "JPEG", quality=90), encoded(images[2], "PNG")]
    bodies.append(encoded(images[3], "WEBP", lossless=True))
    rows = engine.encode(bodies)
    for body, row in zip(bodies, rows, strict=True):
        expected = pipeline(Image.open(io.BytesIO(body)), top_k=3)
        got = ImageClassificationKind.scores(engine.loaded.info, row.value, 3)
        assert [g["label"] for g in got] == [e["label"] for e in expected]
        assert np.allclose([g["score"] for g in got], [e["score"] for e in expected], atol=1e-6)


def test_a_bad_image_fails_its_own_request_and_the_others_are_answered(engine):
    good = encoded(photo(50, 40, 5), "PNG")
    truncated = good[: len(good) // 2]
    rows = engine.encode([good, b"not an image at all", truncated, good])
    assert not isinstance(rows[0], RequestError) and not isinstance(rows[3], RequestError)
    for bad in (rows[1], rows[2]):
        assert isinstance(bad, RequestError) and 400 <= bad.code < 500 and "image" in bad.message


def test_computed_images_are_cached_by_their_bytes_digest(staged):
    from handlers.image.engine import ImageEngine

    engine = ImageEngine.load(staged, {"precision": "fp32", "cache_size": 8}, threads=1, version="cache")
    body = encoded(photo(30, 20, 6), "PNG")
    first = engine.encode([body])[0]
    batch = engine.prepare(engine_requests([body, body]))
    assert batch.stats.hits == 1 and batch.stats.misses == 0 and not batch.passes
    assert len(engine.cache) == 1
    again = engine.encode([body])[0]
    assert again.value.tolist() == first.value.tolist()


def engine_requests(images):
    from handlers.image.engine import ImageRow

    return [ImageRow((data,), ("image",)) for data in images]


def test_a_convnext_folder_stages_with_its_crop_pct_resize(tmp_path):
    from scripts.prepare_image_model import stage

    folder = tiny_image_models.make_convnext_classifier(tmp_path / "convnext")
    record = stage(str(folder), tmp_path / "staged", None, None)
    assert record["kind"] == "image-classification" and record["body"] == "ConvNextForImageClassification"
    assert record["preprocessing"]["crop_pct"] == pytest.approx(224 / 256)
    assert record["parity"]["fp32_agreement"] >= 0.9999
    assert record["parity"]["pixel_values_max_difference"] == 0.0


def test_make_package_picks_the_image_template_for_an_image_folder(folder, tmp_path):
    from scripts import package, tiny_text_models

    assert package.template_for(folder) == "image-model"
    text_folder = tiny_text_models.make_distilbert_classifier(tmp_path / "text")
    assert package.template_for(text_folder) == "text-model"


@pytest.mark.parametrize(
    ("breaker", "file", "words"),
    [
        (lambda f: (f / "preprocessor_config.json").unlink(), "preprocessor_config.json", "image processor"),
        (lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"), "pytorch_model.bin", "pickle"),
    ],
)
def test_a_bad_folder_is_refused_naming_the_file_and_the_fix(folder, tmp_path, breaker, file, words, capsys):
    import shutil

    from scripts import prepare_image_model

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    breaker(broken)
    out = tmp_path / "out"
    assert prepare_image_model.main(["--source", str(broken), "--out", str(out)]) == 1
    message = capsys.readouterr().err
    assert file in message and words in message and "Fix:" in message
    assert not out.exists()
