"""The kinds of image model, one class each, in one table: what the engine asks of a model kind (handlers/image/
kinds/base.py). The kind of a folder is read from the folder itself (:func:`detect_kind`): a transformers image
classifier has a *ForImageClassification architecture in its config.json, an image-text embedder is a CLIP or SigLIP
model (or a sentence-transformers folder around one: handlers/image/image_text_model.py). :func:`inspect_folder`
reads and checks a folder as the kind it is; :func:`is_image_folder` is what ``make package`` asks to pick the
image-model template."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from handlers.image.folder import ImageModelFolder, read_served
from handlers.image.kinds.base import ImageKind
from handlers.image.kinds.classification import ImageClassificationKind
from handlers.image.kinds.image_text import ImageTextKind
from handlers.image.preprocess import Preprocessing
from handlers.text.folder import FolderError, optional_json

KINDS: dict[str, ImageKind] = {kind.name: kind for kind in (ImageClassificationKind(), ImageTextKind())}


def kind_named(name: str) -> ImageKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"image kind must be one of {sorted(KINDS)}, got {name!r}") from None


def detect_kind(folder: Path) -> str | None:
    """The image kind a model folder says it is, or None for a folder that is no image model (a text model's)."""
    architectures = [str(name) for name in optional_json(folder, "config.json").get("architectures") or []]
    if any(name.endswith("ForImageClassification") for name in architectures):
        return "image-classification"
    if ImageTextKind.detects(folder):  # CLIPModel / SiglipModel folders, sentence-transformers CLIP folders
        return ImageTextKind.name
    return None


def is_image_folder(folder: str | os.PathLike[str]) -> bool:
    return detect_kind(Path(folder)) is not None


def inspect_folder(folder: str | os.PathLike[str], kind: str | None = None) -> ImageModelFolder:
    """Read and check a model folder; ``kind`` None takes the one the folder says it is. A staged folder's
    image_model.json supplies what transformers decided at package time (the class, the processor's steps)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FolderError(str(folder), "is not a folder", "pass the folder your training run saved the model to")
    served = read_served(folder)
    name = kind or served.get("kind") or detect_kind(folder)
    if name is None:
        raise FolderError(
            "config.json",
            "does not say it holds an image model (a transformers *ForImageClassification architecture, or a CLIP or "
            "SigLIP model)",
            "save the model with save_pretrained, beside its image processor (preprocessor_config.json)",
        )
    info = kind_named(name).read_folder(folder)
    if served:
        info = replace(
            info,
            body_class=str((served.get("body") or {}).get("class") or info.body_class),
            preprocessing=Preprocessing.from_record(served["preprocessing"]),
            extra={**info.extra, **(served.get("staged") or {})},
        )
    return info
