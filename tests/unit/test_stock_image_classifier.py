"""The stock image_classifier baseline's archive (loadtests/baselines/stock_image_classifier.py) and its torchvision
overlay, without a server: what a TorchServe user would pack, built from a tiny ViT folder."""

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from loadtests.baselines import baseline_env, systems
from loadtests.baselines import stock_image_classifier as stock
from scripts import tiny_image_models
from scripts.ops import registry


def test_labels_file_is_in_id_order_and_a_folder_without_labels_is_refused():
    config = {"id2label": {"10": "ten", "2": "two", "0": "zero"}}
    assert list(stock.index_to_name(config).items()) == [("0", "zero"), ("1", "two"), ("2", "ten")]
    with pytest.raises(ValueError, match="id2label"):
        stock.index_to_name({})


def test_archive_is_the_stock_handler_over_a_trace_of_the_same_logits(tmp_path):
    labels = [f"class {i}" for i in range(6)]
    folder = tiny_image_models.make_vit_classifier(tmp_path / "vit", labels=labels)
    store = stock.build_stock_archive(folder, "vit-stock", tmp_path / "store", log=lambda _: None)
    archive = store / "vit-stock.mar"
    with zipfile.ZipFile(archive) as mar:
        manifest = json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]
        assert manifest["handler"] == "image_classifier" and manifest["serializedFile"] == "model.pt"
        assert json.loads(mar.read("index_to_name.json")) == {str(i): label for i, label in enumerate(labels)}
        config = mar.read("model-config.yaml").decode()
        assert "batchSize: 8" in config and "maxBatchDelay: 50" in config and "minWorkers: 2" in config
        mar.extract("model.pt", tmp_path)
    traced = torch.jit.load(str(tmp_path / "model.pt"))
    from transformers import AutoModelForImageClassification

    eager = AutoModelForImageClassification.from_pretrained(str(folder)).eval()
    crops = torch.rand(3, 3, stock.STOCK_INPUT_SIZE, stock.STOCK_INPUT_SIZE)  # what the handler's transforms give
    with torch.inference_mode():
        expected = eager(pixel_values=torch.nn.functional.interpolate(crops, size=(32, 32), mode="bilinear")).logits
        assert torch.allclose(traced(crops), expected, atol=1e-5)
    built = archive.stat().st_mtime_ns
    stock.build_stock_archive(folder, "vit-stock", store, log=lambda _: None)
    assert archive.stat().st_mtime_ns == built  # same folder: reused, not traced again


def test_the_overlay_puts_the_cpu_torchvision_shim_first_and_pins_the_wheels():
    overlay = baseline_env.ENVS["stock-image-classifier"]
    paths = overlay.environment()["PYTHONPATH"].split(os.pathsep)
    assert paths[:2] == [str(overlay.shim), str(overlay.venv)] and (overlay.shim / "sitecustomize.py").exists()
    assert overlay.venv.name == "stock-image-classifier-site"
    assert "--no-deps" in overlay.install_steps()[0]
    pins = overlay.requirements.read_text()
    assert "torchvision==0.28.0" in pins and "captum==0.9.0" in pins
    assert baseline_env.ENVS["infinity"].environment() == {}


def test_a_fresh_clone_without_build_gets_its_install_log_folder(tmp_path, monkeypatch):
    """On a fresh clone build/ does not exist yet: the install must create it for its log, not fail opening it."""
    monkeypatch.setattr(baseline_env, "REPO", tmp_path / "clone")
    monkeypatch.setattr(baseline_env, "HERE", tmp_path)
    (tmp_path / "probe-requirements.txt").write_text("json-is-stdlib\n")
    make_target = "import pathlib, sys; pathlib.Path(sys.argv[1]).mkdir()"  # what pip --target does
    monkeypatch.setattr(
        baseline_env.BaselineEnv, "install_steps", lambda self: [[sys.executable, "-c", make_target, str(self.venv)]]
    )
    env = baseline_env.BaselineEnv("probe", "a probe", "import json", overlay=True)
    assert not (tmp_path / "clone" / "build").exists()
    assert env.ensure(log=lambda line: None) == Path(sys.executable)
    assert (tmp_path / "clone" / "build" / "probe-site.install.log").exists()
    assert env.ready()


def test_an_image_classifier_is_compared_with_the_stock_handler_in_its_own_request_shape():
    assert "stock-image-classifier" in registry.KINDS["image-classification"].baselines
    assert "stock-image-classifier" in systems.FOR_SOME_MODELS
    assert systems.system_traffic("stock-image-classifier", "vit-base") == "vit-base-stock"
