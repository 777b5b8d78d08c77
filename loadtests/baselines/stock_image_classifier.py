"""TorchServe's stock ``image_classifier`` handler on the same model as ours: the archive a TorchServe user builds.

    python -m loadtests.baselines.stock_image_classifier MODEL_FOLDER NAME STORE

What a user does with a transformers image classifier and TorchServe's documented path for the stock handler:
trace the model to TorchScript (``torch.jit.trace`` of a wrapper returning the logits: the handler calls
``model(images)`` and softmaxes what comes back), write ``index_to_name.json`` from the folder's ``id2label``, and
``torch-model-archiver --handler image_classifier --serialized-file model.pt --extra-files index_to_name.json`` with
a model-config.yaml of the batching a user would pick (STOCK_BATCH_SIZE, STOCK_MAX_BATCH_DELAY_MS, STOCK_WORKERS).
The handler then decodes with PIL and applies its fixed ImageNet transforms (Resize 256, CenterCrop 224, ToTensor,
Normalize with ImageNet's mean and std), fp32, and answers its top 5 as ``{label: probability}``.

Two departures, each only where the stock handler cannot run the model at all:
- a model trained at another size than 224 (the tiny test ViT's 32) gets the 224 crop resized to its size inside the
  traced wrapper (a ViT refuses other sizes); vit-base is 224 and traced as is;
- a model with fewer than 5 labels (torch.topk would fail) gets a three-line subclass of the stock handler with
  ``topk`` set to its label count, as TorchServe's docs suggest for changing a stock handler.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

from scripts import package

STOCK_HANDLER = "image_classifier"
STOCK_INPUT_SIZE = 224  # image_classifier's CenterCrop
STOCK_TOPK = 5  # image_classifier's topk
# A TorchServe user's batching for an image classifier: batches of 8, waiting up to 50 ms to fill one (TorchServe's
# default is 100 ms), and ours' worker count; the server gives each worker cores / workers threads (systems.py).
STOCK_BATCH_SIZE = 8
STOCK_MAX_BATCH_DELAY_MS = 50
STOCK_WORKERS = 2
FEW_LABELS_HANDLER = """from ts.torch_handler.image_classifier import ImageClassifier


class FewLabelsImageClassifier(ImageClassifier):
    topk = {topk}  # the stock handler's 5 needs at least 5 labels
"""


class LogitsOnly(torch.nn.Module):
    """The transformers model as the stock handler calls it: pixel values in, logits out (not a ModelOutput)."""

    def __init__(self, model: torch.nn.Module, image_size: int):
        super().__init__()
        self.model = model
        self.image_size = image_size

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.shape[-1] != self.image_size:  # only a model not trained at 224 (the tiny test ViT)
            pixel_values = torch.nn.functional.interpolate(
                pixel_values, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False
            )
        return self.model(pixel_values=pixel_values).logits


def index_to_name(config: dict) -> dict[str, str]:
    """The stock handler's label file from a transformers config's id2label: ``{"0": name, ...}`` in id order."""
    labels = config.get("id2label") or {}
    if not labels:
        raise ValueError("config.json has no id2label: the stock image_classifier needs its labels")
    return {str(i): labels[key] for i, key in enumerate(sorted(labels, key=int))}


def model_config_yaml(workers: int = STOCK_WORKERS) -> str:
    return (
        f"minWorkers: {workers}\nmaxWorkers: {workers}\nbatchSize: {STOCK_BATCH_SIZE}\n"
        f"maxBatchDelay: {STOCK_MAX_BATCH_DELAY_MS}\nresponseTimeout: 120\nstartupTimeout: 300\n"
    )


def source_digest(folder: Path) -> str:
    """What the archive is built from (the folder's config and weights, this module): rebuilt when it changes."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for name in ("config.json", "model.safetensors"):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:16]


def trace_logits(folder: Path, target: Path) -> None:
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(str(folder), dtype=torch.float32).eval()
    size = getattr(model.config, "image_size", STOCK_INPUT_SIZE)
    wrapper = LogitsOnly(model, size if isinstance(size, int) else STOCK_INPUT_SIZE).eval()
    example = torch.rand(2, 3, STOCK_INPUT_SIZE, STOCK_INPUT_SIZE)
    with torch.inference_mode():
        traced = torch.jit.trace(wrapper, example, check_trace=False)
    traced.save(str(target))


def build_stock_archive(folder, name, store, log=print) -> Path:
    """``store``/``name``.mar for the stock image_classifier from the transformers folder ``folder`` (reused while
    the folder is unchanged); returns the store."""
    folder, store = Path(folder), Path(store)
    archive, stamp = store / f"{name}.mar", store / f".{name}.built"
    digest = source_digest(folder)
    if archive.exists() and stamp.exists() and stamp.read_text() == digest:
        return store
    store.mkdir(parents=True, exist_ok=True)
    labels = index_to_name(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    with tempfile.TemporaryDirectory(prefix="stock-image-classifier-") as staging:
        staging = Path(staging)
        files = staging / "files"
        files.mkdir()
        (files / "index_to_name.json").write_text(json.dumps(labels), encoding="utf-8")
        (staging / "model-config.yaml").write_text(model_config_yaml(), encoding="utf-8")
        trace_logits(folder, staging / "model.pt")
        handler: str | Path = STOCK_HANDLER
        if len(labels) < STOCK_TOPK:
            handler = staging / "few_labels_image_classifier.py"
            handler.write_text(FEW_LABELS_HANDLER.format(topk=len(labels)), encoding="utf-8")
        try:
            package.run_archiver(
                name, "1.0", handler, files, staging / "model-config.yaml", store, serialized_file=staging / "model.pt"
            )
        except package.PackagingError as error:
            raise RuntimeError(f"stock image_classifier baseline: {error}") from None
    stamp.write_text(digest)
    log(f"  built the stock image_classifier archive: {archive} (TorchScript fp32, {len(labels)} labels)")
    return store


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m loadtests.baselines.stock_image_classifier", description=__doc__)
    parser.add_argument("folder", help="a transformers image classifier folder (config.json with id2label)")
    parser.add_argument("name", help="the archive's model name")
    parser.add_argument("store", help="the folder the archive is written to")
    args = parser.parse_args(argv)
    build_stock_archive(args.folder, args.name, args.store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
