"""Handler for embedding models: minilm and any sentence-transformers model packaged from its folder.

Sentence embeddings as the model's folder defines them (pooling, normalisation, token limit, named prompts): the
same vector as sentence-transformers' ``encode()``. Everything a batch goes through (caches, one tokenizer call,
length buckets, compiled backends and their accuracy gate) is the shared text-model path,
:class:`handlers.text.handler.TextModelHandler`; this module adds what an embedding request may say
(:mod:`handlers.text.requests.embedding`) and how its rows are answered.
"""

from __future__ import annotations

from typing import Any

from handlers.core.errors import OpenAIShaped, RequestError
from handlers.core.http import RequestView
from handlers.text.batch import ComputedBatch, answer_requests
from handlers.text.handler import LoadedTextModel, TextModelHandler
from handlers.text.requests.embedding import (
    OPENAI_ROUTE,
    EmbeddingRequest,
    TextPreparation,
    format_response,
    parse_embedding_request,
)


class EmbeddingHandler(TextModelHandler):
    """Serves /predictions/<model> (every body shape) and /predictions/<model>/<version>/v1/embeddings, OpenAI's
    embeddings API as its official client sends it (docs/clients.md): the OpenAI shape only, ``model`` naming the
    served model, and errors in OpenAI's shape."""

    kind = "embedding"
    routes = ("", OPENAI_ROUTE)

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        # The name the model is registered (and routed) under, which OpenAI clients send as 'model'.
        self.served_name = str(getattr(context, "model_name", None) or self.model_name)

    def load_model(self, model_dir: str) -> LoadedTextModel:
        loaded = super().load_model(model_dir)
        info = loaded.info
        self.preparation = TextPreparation(dict(info.prompts), info.default_prompt_name, info.lowercase)
        return loaded

    def parse_request(self, body: Any, request: RequestView) -> EmbeddingRequest:
        if request.url_path != OPENAI_ROUTE:
            return parse_embedding_request(
                body, request.content_type, self.loaded.dimension, self.loaded.limits, self.preparation
            )
        try:
            return parse_embedding_request(
                body,
                request.content_type,
                self.loaded.dimension,
                self.loaded.limits,
                self.preparation,
                served_model=self.served_name,
            )
        except RequestError as error:  # refused before it has a payload: shaped here, error_value cannot tell
            raise OpenAIShaped(error) from None

    def error_value(self, payload: EmbeddingRequest | None, error: RequestError) -> dict[str, Any]:
        if payload is not None and payload.served_model is not None:
            return error.to_openai_body()
        return super().error_value(payload, error)

    def postprocess(self, computed: ComputedBatch, payloads: list[EmbeddingRequest]) -> list[Any]:
        return answer_requests(
            computed,
            payloads,
            self.cache,
            lambda payload, rows: format_response(payload, rows, self.model_name),
            self.shared_cache,
        )
