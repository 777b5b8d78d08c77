"""Handler for embedding models: minilm and any sentence-transformers model packaged from its folder.

Sentence embeddings as the model's folder defines them (pooling, normalisation, token limit, named prompts): the
same vector as sentence-transformers' ``encode()``. Everything a batch goes through (caches, one tokenizer call,
length buckets, compiled backends and their accuracy gate) is the shared text-model path,
:class:`handlers.text.handler.TextModelHandler`; this module adds what an embedding request may say
(:mod:`handlers.embedding.requests`) and how its rows are answered.
"""

from __future__ import annotations

from typing import Any

from handlers.core.http import RequestView
from handlers.embedding.batch import ComputedBatch, answer_requests
from handlers.embedding.requests import EmbeddingRequest, TextPreparation, format_response, parse_embedding_request
from handlers.text.handler import LoadedTextModel, TextModelHandler


class EmbeddingHandler(TextModelHandler):
    kind = "embedding"

    def load_model(self, model_dir: str) -> LoadedTextModel:
        loaded = super().load_model(model_dir)
        info = loaded.info
        self.preparation = TextPreparation(dict(info.prompts), info.default_prompt_name, info.lowercase)
        return loaded

    def parse_request(self, body: Any, request: RequestView) -> EmbeddingRequest:
        return parse_embedding_request(
            body, request.content_type, self.loaded.dimension, self.loaded.limits, self.preparation
        )

    def postprocess(self, computed: ComputedBatch, payloads: list[EmbeddingRequest]) -> list[Any]:
        return answer_requests(
            computed,
            payloads,
            self.cache,
            lambda payload, rows: format_response(payload, rows, self.model_name),
            self.shared_cache,
        )
