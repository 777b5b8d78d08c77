"""The kinds of text model, one class each, in one table: what the engine asks of a model kind (handlers/text/kinds/
base.py). The kind of a folder is read from the folder itself (:func:`detect_kind`): sentence-transformers records it
as ``model_type`` in config_sentence_transformers.json, a transformers classifier has a *ForSequenceClassification
architecture. :func:`inspect_folder` reads and checks a folder as the kind it is."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from handlers.text.folder import FolderError, TextModelFolder, optional_json, read_served
from handlers.text.kinds.base import TextKind
from handlers.text.kinds.classification import ClassificationKind
from handlers.text.kinds.embedding import EmbeddingKind
from handlers.text.kinds.multi_vector import MultiVectorKind
from handlers.text.kinds.sentence_transformers import MODEL_CONFIG
from handlers.text.kinds.sparse import SparseKind
from handlers.text.modules import module_name

KINDS: dict[str, TextKind] = {
    kind.name: kind for kind in (EmbeddingKind(), ClassificationKind(), SparseKind(), MultiVectorKind())
}
# Module types that say a folder's kind where config_sentence_transformers.json does not (sentence-transformers < 5).
KIND_OF_MODULE = {"SpladePooling": "sparse", "MultiVectorMask": "multi-vector", "Pooling": "embedding"}


def kind_named(name: str) -> TextKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {name!r}") from None


def detect_kind(folder: Path) -> str:
    """The kind a model folder says it is, or a refusal naming what was looked at."""
    saved_type = optional_json(folder, MODEL_CONFIG).get("model_type")
    for kind in KINDS.values():
        if saved_type in getattr(kind, "model_types", ()):
            return kind.name
    if saved_type == "CrossEncoder":
        return "classification"
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        modules = None
    if isinstance(modules, list):
        names = [module_name(entry) for entry in modules]
        for module, name in KIND_OF_MODULE.items():
            if module in names:
                return name
    architectures = optional_json(folder, "config.json").get("architectures") or []
    if any(str(name).endswith("ForSequenceClassification") for name in architectures):
        return "classification"
    raise FolderError(
        MODEL_CONFIG if (folder / "modules.json").exists() else "config.json",
        "does not say what kind of model the folder holds (a sentence-transformers SentenceTransformer, SparseEncoder "
        "or MultiVectorEncoder, or a transformers *ForSequenceClassification model)",
        f"save the model with sentence-transformers or save_pretrained, or name the kind ({', '.join(KINDS)})",
    )


def inspect_folder(
    folder: str | os.PathLike[str], kind: str | None = None, trust_remote_code: bool = False
) -> TextModelFolder:
    """Read and check a model folder; ``kind`` None takes the one the folder says it is (handlers/text/kinds).

    A staged folder's text_model.json supplies what transformers decided at package time (and the kind, and the
    remote-code opt-in, which it records)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FolderError(str(folder), "is not a folder", "pass the folder your training run saved the model to")
    served = read_served(folder)
    name = kind or served.get("kind") or detect_kind(folder)
    info = kind_named(name).read_folder(folder, trust_remote_code or bool(served.get("trust_remote_code")))
    if served:
        body = served.get("body") or {}
        info = replace(
            info,
            body_class=str(body.get("class") or info.body_class),
            input_names=tuple(served.get("tokenizer", {}).get("input_names") or info.input_names),
        )
    return info
