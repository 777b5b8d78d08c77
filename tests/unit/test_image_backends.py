"""Image models' compiled backends and shared cache tier, on a tiny random ViT classifier (scripts/tiny_image_models.py)
staged by the image-model template's prepare step with OpenVINO candidates (scripts/build_backends.py, the text
models' one build): packed only within the kind's gate, ranked by ms/image, served by ``backend: auto``; and the text
models' shared tier (a real cache server, tests/conftest.py) keyed by the image bytes' digest and the model's
identity, answering when the server is down.

OpenVINO only, with a 0.2 s ranking: a few seconds per build (AOTInductor would add ~30 s of compilation per
precision; it is the same builder as text's, with the batch as its one dynamic dim at a fixed served shape)."""

import io
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from handlers.core import runtime
from handlers.core.errors import RequestError
from handlers.text.shared_cache import URL_ENV
from scripts import build_backends, tiny_image_models


def precisions():
    return ["fp32", "bf16"] if runtime.cpu_has_native_bf16() else ["fp32"]


def png(width, height, seed):
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB").save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """The tiny ViT through the template's prepare step (its command line, as scripts/package runs it)."""
    from scripts import prepare_image_model

    folder = tiny_image_models.make_vit_classifier(tmp_path_factory.mktemp("tiny-vit") / "source")
    out = tmp_path_factory.mktemp("tiny-vit-backends") / "model"
    argv = ["--source", str(folder), "--out", str(out), "--backends", "openvino", "--rank-seconds", "0.2"]
    assert prepare_image_model.main(argv) == 0
    return out


def manifest_of(model_dir):
    return json.loads((model_dir / "backends" / "manifest.json").read_text())


def test_the_prepare_step_packs_gated_openvino_candidates_ranked_by_ms_per_image(staged):
    manifest = manifest_of(staged)

    candidates = manifest["candidates"]
    assert {(c["backend"], c["precision"]) for c in candidates} | {
        (r["backend"], r["precision"]) for r in manifest["refused"]
    } == {("openvino", precision) for precision in precisions()}
    assert candidates, manifest["refused"]
    assert [c["rank"] for c in candidates] == list(range(1, len(candidates) + 1))
    assert [c["ms_per_image"] for c in candidates] == sorted(c["ms_per_image"] for c in candidates)
    assert all(c["gate_min_cosine"] >= 0.99 for c in candidates)  # the classifier kind's bound
    assert manifest["gate"]["measure"] == "1 - largest score difference"
    # The gate ran on the reference images as served (one 32x32 group) and at one and 16 images.
    assert [shape[0] for shape in manifest["gate"]["shapes"]][1:] == [1, 16]
    assert {tuple(shape[1:]) for shape in manifest["gate"]["shapes"]} == {(3, 32, 32)}
    assert set(manifest["ranking_benchmark"]["eager_ms_per_image"]) == set(precisions())
    assert (staged / "backends" / "openvino" / "model.xml").is_file()


def test_auto_serves_the_first_ranked_candidate_within_the_gate(staged):
    from handlers.image.engine import ImageEngine
    from handlers.image.kinds.classification import ImageClassificationKind

    served = ImageEngine.load(staged, threads=1)
    eager = ImageEngine.load(staged, {"backend": "eager", "precision": "fp32"}, threads=1)

    first = manifest_of(staged)["candidates"][0]
    assert (served.backend, served.precision) == (first["backend"], first["precision"])
    assert served.backend_reason.startswith("rank 1 of") and "ms/image at build" in served.backend_reason
    images = [png(45, 97, 1), png(640, 427, 2), png(1, 1, 3)]
    got = torch.stack([row.value for row in served.encode(images)])
    expected = torch.stack([row.value for row in eager.encode(images)])
    assert ImageClassificationKind().similarity(served.loaded.info, expected, got) >= 0.99


def test_a_candidate_below_the_gate_is_not_packed_and_the_build_says_why(staged, tmp_path, monkeypatch, capsys):
    # A broken build: an IR whose labels come out shifted by one. It converts, loads and runs like a good one; only the
    # gate can tell.
    model_dir = tmp_path / "model"
    shutil.copytree(staged, model_dir)
    real_builder = build_backends.BUILDERS["openvino"]

    class ShiftedLabels(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return torch.roll(self.model(pixel_values), 1, -1)

    def build_shifted(model_dir, fp32_model, *args, **options):
        return real_builder(model_dir, ShiftedLabels(fp32_model), *args, **options)

    monkeypatch.setitem(build_backends.BUILDERS, "openvino", build_shifted)
    manifest = build_backends.build(model_dir, ["openvino"], ["fp32"], rank_seconds=0.2, device="cpu", force=True)

    assert manifest["candidates"] == []
    [refused] = manifest["refused"]
    assert refused["reason"].startswith("gate: min cosine to eager fp32") and refused["gate_min_cosine"] < 0.99
    assert "openvino/fp32: refused: gate: min cosine to eager fp32" in capsys.readouterr().out
    assert not (model_dir / "backends" / "openvino").exists()


# ----------------------------------------------------------------------------------------------- the shared tier
@pytest.fixture
def image_cache(start_cache_server, monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)  # the handler config's url, not a session server's
    return start_cache_server(name="image-cache")


def worker(staged, url, version="1", **settings):
    """One worker's engine (eager fp32, so two workers' rows are comparable exactly) on the shared tier at ``url``."""
    from handlers.image.engine import ImageEngine

    config = {"backend": "eager", "precision": "fp32", "shared_cache": {"url": url, **settings}}
    return ImageEngine.load(staged, config, threads=1, name="t-vit", version=version)


def one_pass(engine, images):
    from handlers.image.engine import ImageRow

    requests = [ImageRow((data,), ("image",)) for data in images]
    batch = engine.prepare(requests)
    with torch.inference_mode():
        computed = engine.compute(batch)
    return batch.stats, engine.finish(computed, requests, lambda _request, rows: rows[0])


def test_a_second_worker_reads_the_first_ones_images_and_another_version_does_not(staged, image_cache):
    images = [png(64, 48, 7), png(33, 17, 8)]
    first, second = worker(staged, image_cache.url), worker(staged, image_cache.url)

    stats, computed = one_pass(first, images)
    assert (stats.hits, stats.shared_hits, stats.misses) == (0, 0, 2)
    stats, shared = one_pass(second, images)
    assert (stats.hits, stats.shared_hits, stats.misses) == (0, 2, 0)  # nothing decoded or computed
    for mine, theirs in zip(computed, shared, strict=True):
        assert torch.equal(mine.value, theirs.value)
    assert second.describe()["shared_cache"]["url"] == image_cache.url

    # Another version of the model (or other content: the identity is in the same key) never reads these entries.
    stats, _ = one_pass(worker(staged, image_cache.url, version="2"), images)
    assert (stats.shared_hits, stats.misses) == (0, 2)


def test_with_the_cache_server_down_images_are_still_answered(staged, image_cache):
    url = image_cache.url
    image_cache.stop()
    engine = worker(staged, url, timeout_ms=50, breaker_failures=1)

    stats, rows = one_pass(engine, [png(50, 40, 9), b"not an image"])
    assert stats.misses == 1 and not isinstance(rows[0], RequestError)
    assert isinstance(rows[1], RequestError) and 400 <= rows[1].code < 500  # the bad image fails alone
    assert engine.shared_cache is not None and engine.shared_cache.drain().errors >= 1
