"""The TorchServe adapter of the image engine (handlers/image/engine.py): every image model is served by this base.

At load, TorchServe's context becomes an :class:`ImageEngine` (the kind the archive's ``image_model.json`` says) and
the request side reads what it needs of it (limits, the kind's routes). Per batch: each request is parsed by its
route into its images' bytes, the valid ones go through the engine together (LRU by digest, decode of the misses,
one forward pass per pixel shape) and each gets exactly its own answer, in its route's shape; an image that cannot be
decoded fails its own request only. This module never branches on a kind's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlers.core.base import BatchScope, ServingHandler
from handlers.core.engine import EngineSettings
from handlers.core.errors import NATIVE, RequestError, error_body, shaped
from handlers.core.http import RequestView
from handlers.core.metrics import HandlerMetrics
from handlers.core.routes import Route, route_table
from handlers.image.engine import (
    IMAGE_MODEL_OPTIONS,
    ComputedImages,
    ImageBatch,
    ImageEngine,
    kind_options,
    served_kind,
)
from handlers.image.requests import ImageRequestContext
from handlers.text.shared_cache import record_shared_cache


@dataclass(frozen=True)
class RoutedImages:
    """A parsed request and the route it came by: what batch assembly reads (its images) and what answers it."""

    route: Route
    request: Any

    @property
    def images(self) -> Sequence[bytes]:
        return self.request.images

    @property
    def names(self) -> Sequence[str]:
        return self.request.names


class ImageModelHandler(ServingHandler):
    """The shared base; ``kind_name`` pins a kind (None: the archive's image_model.json says it)."""

    kind_name: str | None = None
    options = IMAGE_MODEL_OPTIONS
    engine: ImageEngine

    def create_engine(self, settings: EngineSettings) -> ImageEngine:
        self.kind = served_kind(settings.model_dir, self.kind_name, type(self).__name__)
        self.options = kind_options(self.kind)
        return ImageEngine(settings, self.kind)

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        engine = self.engine
        self.api = ImageRequestContext(
            engine.loaded.info,
            engine.sources,
            self.model_name,
            str(getattr(context, "model_name", None) or self.model_name),
            companion=engine.loaded.companion,
        )
        self.route_table = route_table(self.kind.routes())

    @property
    def routes(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.route_table)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "routes": {path or "": route.api for path, route in self.route_table.items()},
        }

    # ----------------------------------------------------------------------------------------------- per batch
    def parse_request(self, body: Any, request: RequestView) -> RoutedImages:
        route = self.route_table[request.url_path]
        try:
            return RoutedImages(route, route.parse(self.api, body, request))
        except RequestError as error:
            if route.error_shape == NATIVE:
                raise
            raise shaped(error, route.error_shape) from None

    def error_value(self, payload: Any, error: RequestError) -> dict[str, Any]:
        if isinstance(payload, RoutedImages):
            return error_body(error, payload.route.error_shape)
        return super().error_value(payload, error)

    def preprocess(self, payloads: list[Any]) -> ImageBatch:
        return self.engine.prepare(payloads)

    def inference(self, batch: ImageBatch, scope: BatchScope) -> ComputedImages:
        return self.engine.compute(batch)

    def postprocess(self, computed: ComputedImages, payloads: list[Any]) -> list[Any]:
        return self.engine.finish(
            computed, payloads, lambda payload, rows: payload.route.answer(self.api, payload.request, rows)
        )

    def after_batch(self, batch: ImageBatch, metrics: HandlerMetrics) -> None:
        super().after_batch(batch, metrics)
        stats = batch.stats
        if stats is None:
            return
        metrics.record("CacheHits", stats.hits)
        metrics.record("CacheMisses", stats.misses)
        if self.engine.shared_cache is not None:
            record_shared_cache(self.engine.shared_cache, metrics)
        metrics.record("ForwardPasses", len(batch.passes))
