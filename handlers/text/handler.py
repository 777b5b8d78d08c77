"""The TorchServe adapter of the text engine (handlers/text/engine.py): every embedding model, classifier, reranker,
sparse and multi-vector encoder is served by this base.

At load, TorchServe's context becomes a :class:`TextEngine` (the kind the archive's ``text_model.json`` says, which
an entry module may pin: handlers/embeddings.py) and the request side reads what it needs of it (limits, tokenizer,
the kind's routes). Per batch TorchServe hands over: each request is parsed by its route into rows, the valid ones
go through the engine together (LRU and shared tier, one tokenizer call, one forward pass per length group) and
each gets exactly its own answer, in its route's shape. This module never branches on a kind's name.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from handlers.core.base import BatchScope, ServingHandler
from handlers.core.engine import EngineSettings
from handlers.core.errors import NATIVE, RequestError, error_body, shaped
from handlers.core.http import RequestView
from handlers.core.metrics import HandlerMetrics
from handlers.text.batch import ComputedRows, TextBatch
from handlers.text.engine import TEXT_MODEL_OPTIONS, LoadedTextModel, TextEngine, kind_options, served_kind
from handlers.text.quantization import load_calibration
from handlers.text.requests.common import RequestContext
from handlers.text.routes import Routed, route_table
from handlers.text.shared_cache import record_shared_cache
from handlers.text.windows import WindowSettings


class TextModelHandler(ServingHandler):
    """The shared base; ``kind_name`` pins a kind (None: the archive's text_model.json says it)."""

    kind_name: str | None = None
    options = TEXT_MODEL_OPTIONS
    engine: TextEngine
    loaded: LoadedTextModel

    # ----------------------------------------------------------------------------------------------- load time
    def create_engine(self, settings: EngineSettings) -> TextEngine:
        self.kind = served_kind(settings.model_dir, self.kind_name, type(self).__name__)
        self.options = kind_options(self.kind)
        return TextEngine(settings, self.kind)

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        engine = self.engine
        self.cache, self.shared_cache = engine.cache, engine.shared_cache
        # The name the model is registered (and routed) under, which OpenAI clients send as 'model'.
        served_name = str(getattr(context, "model_name", None) or self.model_name)
        info = self.loaded.info
        self.api = RequestContext(
            info,
            self.loaded.tokenizer,
            self.loaded.limits,
            self.model_name,
            served_name,
            dimensions=self.kind.allowed_dimensions(info, self.config["dimensions"]),
            calibration=load_calibration(self.model_dir, info.output_size),
            max_request_tokens=self.config["max_request_tokens"],
            windows=self.long_inputs(),
        )
        self.route_table = route_table(self.kind.routes())

    def long_inputs(self) -> WindowSettings | None:
        """The model's long-input settings where its kind pools windows (None: requests may not ask for windows)."""
        if not self.kind.pools_windows:
            return None
        return WindowSettings(self.config["long_inputs"], self.config["window_overlap"], self.config["max_windows"])

    @property
    def routes(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.route_table)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),  # the engine's load-time choices, model, buckets and caches
            "routes": {path or "": route.api for path, route in self.route_table.items()},
            **self.kind.describe_requests(self.api),
            "limits": {
                key: self.config[key]
                for key in ("max_inputs", "max_text_chars", "max_request_chars", "max_request_tokens")
            },
            "long_inputs": None if self.api.windows is None else asdict(self.api.windows),
        }

    # ----------------------------------------------------------------------------------------------- per batch
    def parse_request(self, body: Any, request: RequestView) -> Routed:
        """The request validated by its route's parser (the base has checked the path is one of the routes); a
        refusal takes the route's error shape."""
        route = self.route_table[request.url_path]
        try:
            return Routed(route, route.parse(self.api, body, request))
        except RequestError as error:
            if route.error_shape == NATIVE:
                raise
            raise shaped(error, route.error_shape) from None

    def fit_hint(self, payload: Any) -> str | None:
        return payload.fit_hint if isinstance(payload, Routed) else super().fit_hint(payload)

    def error_value(self, payload: Any, error: RequestError) -> dict[str, Any]:
        if isinstance(payload, Routed):
            return error_body(error, payload.route.error_shape)
        return super().error_value(payload, error)

    def preprocess(self, payloads: list[Any]) -> TextBatch:
        return self.engine.prepare(payloads, self.max_answer_bytes)

    def inference(self, batch: TextBatch, scope: BatchScope) -> ComputedRows:
        return self.engine.compute(batch)

    def postprocess(self, computed: ComputedRows, payloads: list[Any]) -> list[Any]:
        return self.engine.finish(
            computed, payloads, lambda payload, rows: payload.route.answer(self.api, payload.request, rows)
        )

    def after_batch(self, batch: TextBatch, metrics: HandlerMetrics) -> None:
        super().after_batch(batch, metrics)
        stats = batch.stats
        if stats is None:
            return
        metrics.record("CacheHits", stats.hits)
        metrics.record("CacheMisses", stats.misses)
        if self.shared_cache is not None:
            record_shared_cache(self.shared_cache, metrics)
        metrics.record("PaddedTokens", stats.padded_tokens)
        metrics.record("RealTokens", stats.real_tokens)
        metrics.record("ForwardPasses", len(batch.passes))
        if batch.forward_cores:
            metrics.record("ForwardCores", batch.forward_cores)
        self.engine.release_memory(batch)
