"""What an image model's folder says, as the worker reads it: the kind, the transformers class its weights load as,
the labels, and the image processor's steps as transformers resolved them at package time (``image_model.json``,
written by scripts/prepare_image_model.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handlers.image.preprocess import Preprocessing
from handlers.text.folder import FolderError, optional_json

SERVED_FILE = "image_model.json"
SERVED_FORMAT = 1
PROCESSOR_FILE = "preprocessor_config.json"

__all__ = ["PROCESSOR_FILE", "SERVED_FILE", "FolderError", "ImageModelFolder", "read_served", "write_served"]


@dataclass(frozen=True)
class ImageModelFolder:
    """Everything the worker needs to know about an image model (a kind adds what is its own under ``extra``)."""

    kind: str  # a name in handlers/image/kinds KINDS
    model_type: str  # config.json model_type
    body_class: str  # the transformers class the weights load as (ViTForImageClassification, CLIPModel, ...)
    output_size: int  # floats per computed row (labels, or the embedding width)
    preprocessing: Preprocessing | None = None  # None until the packaging step recorded it
    labels: tuple[str, ...] = ()
    problem_type: str = ""
    activation: str = ""  # softmax | sigmoid | identity: what a classifier's scores are (handlers/text/labels.py)
    extra: dict[str, Any] = field(default_factory=dict)


def read_served(folder: Path) -> dict[str, Any]:
    """image_model.json of a staged folder, or {} for a folder not packaged yet."""
    served = optional_json(folder, SERVED_FILE)
    if served and served.get("format") != SERVED_FORMAT:
        raise FolderError(
            SERVED_FILE, f"is format {served.get('format')!r}, not {SERVED_FORMAT}", "package the model again"
        )
    return served


def write_served(folder: Path, info: ImageModelFolder, staged: dict[str, Any] | None = None) -> Path:
    """Record what the packaging step decided (the kind, the class, the processor's resolved steps) and what the
    kind staged for its worker (``staged``, ImageKind.stage: the image-text kind's text tokenizer and padding), which
    the worker finds in ``ImageModelFolder.extra``."""
    if info.preprocessing is None:
        raise ValueError("an image model is recorded with its preprocessing")
    record = {
        "format": SERVED_FORMAT,
        "kind": info.kind,
        "body": {"class": info.body_class},
        "preprocessing": info.preprocessing.record(),
        **({"staged": staged} if staged else {}),
    }
    path = folder / SERVED_FILE
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
