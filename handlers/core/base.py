"""The TorchServe side every handler shares: TorchServe's context -> an engine (handlers/core/engine.py) that loads the
model; each batch parse -> preprocess -> inference -> postprocess -> one answer per request.

A subclass supplies the request side:

- ``options``: its ``handler:`` config schema (``config.COMMON_OPTIONS`` plus its own keys),
- ``create_engine(settings)``: the engine that loads its model (by default one whose family parts are this handler's
  own ``load_model``, ``reference_batch``, ``warmup_batches`` and ``forward``, see :class:`HandlerEngine`),
- ``parse_request(body, request)``: validation of one request into its payload, raising :class:`RequestError`,
- ``preprocess(payloads)`` -> a batch object (with ``rows``), ``inference(batch, scope)`` -> outputs,
  ``postprocess(outputs, payloads)`` -> one result per payload: each stage gets what it needs from the one before by
  return value; nothing about a batch is left on the handler.

The base owns what is the same everywhere on the TorchServe side: reading the context, the load metrics, per-request
error mapping, one result per request, retrying a failed batch one request at a time, and the metrics every handler
records. What serves (device, threads, the backend walk and its accuracy gate, warm-up) is the engine's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from handlers.core import identity, logging_setup, runtime
from handlers.core.answer_size import answer_too_large, frame_limit
from handlers.core.config import COMMON_OPTIONS, Option
from handlers.core.engine import GATE_REFUSAL, BackendChoice, Candidate, Engine, EngineSettings, Loaded
from handlers.core.errors import RequestError, ServerError, server_failure
from handlers.core.http import FORM_CONTENT_TYPES, RequestView, request_body, to_json
from handlers.core.metrics import HandlerMetrics

logger = logging.getLogger(__name__)
logging_setup.install()  # a body TorchServe cannot decode costs one log line, not its ~15-line traceback

JSON_CONTENT_TYPE = "application/json"
__all__ = ["GATE_REFUSAL", "BackendChoice", "BatchScope", "Candidate", "HandlerEngine", "Loaded", "ServingHandler"]


class Batch(Protocol):
    """What preprocess returns: the handler's own batch type, which says how many rows it computes."""

    @property
    def rows(self) -> int: ...


@dataclass
class BatchScope:
    """What the stages of one ``handle`` call share besides their data, passed to them as an argument."""

    context: Any  # TorchServe's context: intermediate responses go out through it
    metrics: HandlerMetrics
    # Batch indices that already received part of their answer (a streamed piece): computing such a request again
    # would repeat what its client has, so it is never retried alone.
    partly_answered: set[int] = field(default_factory=set)


class ServingHandler:
    options: dict[str, Option] = COMMON_OPTIONS
    # URL paths after /predictions/<model>/<version>/ this handler answers ('' = the model's own URL); a request to
    # any other path gets a 404 naming these. A handler with several surfaces derives them from its route table
    # (handlers/core/routes.py) and looks the path up there once, in parse_request.
    routes: tuple[str, ...] = ("",)

    def __init__(self) -> None:
        self.initialized = False
        self.loaded: Loaded | None = None

    @property
    def model(self) -> Any:
        """The served model (after precision choice and compilation)."""
        return self.loaded.model if self.loaded is not None else None

    # ----------------------------------------------------------------------------------------------- load time
    def initialize(self, context: Any) -> None:
        """TorchServe's context -> the engine's settings; the engine loads; its choices are recorded as metrics."""
        properties = context.system_properties
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        self.max_batch_requests = int(properties.get("batch_size") or yaml_config.get("batchSize") or 1)
        model_info = (getattr(context, "manifest", None) or {}).get("model", {})
        self.max_answer_bytes = frame_limit()  # handlers/core/answer_size.py: larger bodies kill the worker
        settings = EngineSettings(
            model_dir=properties.get("model_dir"),
            handler_config=yaml_config.get("handler"),
            name=model_info.get("modelName", type(self).__name__),
            version=str(model_info.get("modelVersion", "0")),
            gpu_id=properties.get("gpu_id"),
            workers=int(yaml_config.get("maxWorkers") or 1),
        )
        engine = self.engine = self.create_engine(settings)
        # What the request side reads of the engine's settings (a handler's own family parts read them at load).
        self.model_dir, self.model_name, self.model_version = engine.model_dir, engine.model_name, engine.model_version
        self.config, self.device, self.threads, self.identity = (
            engine.config,
            engine.device,
            engine.threads,
            engine.identity,
        )
        engine.start()
        # Its load-time choices, as the request side, describe and the tools read them off a handler.
        self.loaded = engine.loaded
        self.backend, self.precision, self.min_cosine = engine.backend, engine.precision, engine.min_cosine
        self.backend_reason, self.backend_fallbacks = engine.backend_reason, engine.backend_fallbacks
        self.gate_rejected, self.load_seconds, self.load_phases = (
            engine.gate_rejected,
            engine.load_seconds,
            engine.load_phases,
        )
        self.compiles_after_warmup = engine.compiles_after_warmup
        load_metrics = HandlerMetrics(context, self.model_name)
        load_metrics.record("ServedBackend", 1, [("Backend", self.backend), ("Precision", self.precision)])
        load_metrics.record("ServedPrecision", 1, [("Precision", self.precision)])
        load_metrics.record("PrecisionMinCosine", self.min_cosine, [("Precision", self.precision)])
        self.initialized = True

    def create_engine(self, settings: EngineSettings) -> Engine:
        """The engine that loads this handler's model (not loaded yet)."""
        return HandlerEngine(settings, self)

    # ----------------------------------------------------------------------------------------------- per batch
    def handle(self, data: list[Any], context: Any) -> list[str]:
        """Answer every request of the batch: its own error for an invalid one, a result for each of the others."""
        self.set_identity_headers(context, len(data))
        if self.asks_describe(data, context):
            return [to_json(self.describe())]
        scope = BatchScope(context, HandlerMetrics(context, self.model_name))
        responses: list[str | None] = [None] * len(data)
        accepted = self.accept(data, range(len(data)), scope, responses)
        if accepted:
            results = self.run_stages(accepted, scope)
            for (idx, payload), result in zip(accepted, results, strict=True):
                responses[idx] = self.answer(scope, idx, payload, result)
        self.end_grpc_streams(context, len(data))
        scope.metrics.record("Batches", 1)
        scope.metrics.record("BatchRequests", len(data))
        compiles = runtime.compile_count() - self.compiles_after_warmup if self.backend == "jit" else 0
        if compiles > 0:
            logger.warning("%d recompilation(s) after warm-up: a served shape was not warmed up", compiles)
            scope.metrics.record("Recompilations", compiles)
            self.compiles_after_warmup += compiles
        return [response if response is not None else "" for response in responses]

    @staticmethod
    def asks_describe(data: list[Any], context: Any) -> bool:
        """GET /models/{name}?customized=true arrives alone, as a request with this header (TorchServe's convention)."""
        return len(data) == 1 and RequestView(context, 0).header("describe") == "True"

    def accept(
        self, data: list[Any], indices: Iterable[int], scope: BatchScope, responses: list[str | None]
    ) -> list[tuple[int, Any]]:
        """Parse the requests at ``indices`` of the batch: (index, payload) for each accepted one; a refused one gets
        its error response in ``responses``."""
        accepted = []
        for idx in indices:
            request = data[idx]
            try:
                view = RequestView(scope.context, idx, request)
                if view.content_type in FORM_CONTENT_TYPES:
                    # TorchServe splits form bodies into fields and drops the raw body: say so instead of "empty".
                    raise RequestError(
                        f"the body was sent as {view.content_type} (curl -d's default), which "
                        f"TorchServe decodes as form fields; send it with "
                        f"-H 'Content-Type: application/json' (or text/plain where accepted)",
                        code=415,
                        error_type="UnsupportedMediaType",
                    )
                if view.url_path not in self.routes:
                    raise self.unknown_route(view.url_path)
                accepted.append((idx, self.parse_request(request_body(request), view)))
            except RequestError as error:
                responses[idx] = self.reject(scope, idx, None, error)
            except Exception as error:  # a parser bug must cost this request only, never the batch
                logger.error("request %d: validation failed unexpectedly", idx, exc_info=True)
                responses[idx] = self.reject(scope, idx, None, server_failure(error))
        return accepted

    def set_identity_headers(self, context: Any, count: int) -> None:
        """Every answer (200, 4xx, 5xx, each piece of a stream) names the model content that made it, so a client
        can tell two models served under one name and version apart (handlers/core/identity.py)."""
        setter = getattr(context, "set_response_header", None)
        if setter is None:
            return
        for idx in range(count):
            setter(idx, identity.HEADER, self.identity)

    @staticmethod
    def end_grpc_streams(context: Any, count: int) -> None:
        """Mark each gRPC request's answer as its last message. TorchServe's StreamPredictions waits for a message
        saying the stream ended and kills the worker when a one-piece answer (any 4xx, or a model that does not
        stream) never says so; an HTTP request must not get the header (its answer would switch to chunked). A
        request over gRPC is the one without a Host header."""
        setter = getattr(context, "set_response_header", None)
        if setter is None:
            return
        for idx in range(count):
            if RequestView(context, idx).over_grpc:
                setter(idx, "ts_stream_next", "false")

    def unknown_route(self, path: str) -> RequestError:
        shown = path if len(path) <= 80 else path[:80] + "..."
        served = ", ".join(
            f"/predictions/{self.model_name}" if not route else f"/predictions/{self.model_name}/<version>/{route}"
            for route in self.routes
        )
        return RequestError(f"this model does not serve '{shown}'; it serves {served}", code=404, error_type="NotFound")

    def describe(self) -> dict[str, Any]:
        """What ``describe --customized`` shows: the choices this worker made at load."""
        return self.engine.describe()

    def run_stages(self, accepted: Sequence[tuple[int, Any]], scope: BatchScope) -> list[Any]:
        """Results for the accepted (batch index, payload) pairs, one each, in order: a value or a RequestError.

        A failure of the shared batch step must not fail requests that did not cause it: the batch is retried one
        request at a time, so only the request that breaks the step (or one that already received part of its
        answer, which cannot be repeated) gets the error."""
        payloads = [payload for _, payload in accepted]
        try:
            return self.complete(self.run_batch(payloads, scope), len(payloads))
        except RequestError as error:  # a stage found the whole group of accepted requests unservable
            return [error] * len(payloads)
        except Exception as error:  # our bug, the model's, or the machine's: answer with JSON, keep the worker
            failure = server_failure(error)
            if len(payloads) == 1:
                logger.error("request failed: %s", failure.message, exc_info=True)
                return [failure]
            logger.warning(
                "batch of %d failed (%s); retrying its requests one at a time",
                len(payloads),
                failure.message,
                exc_info=True,
            )
            return [
                self.run_stages([pair], scope)[0] if pair[0] not in scope.partly_answered else failure
                for pair in accepted
            ]

    def run_batch(self, payloads: list[Any], scope: BatchScope) -> list[Any]:
        """preprocess -> inference -> postprocess for the accepted requests, with per-stage timing."""
        started = time.perf_counter()
        batch = self.preprocess(payloads)
        preprocessed = time.perf_counter()
        with torch.inference_mode():
            outputs = self.inference(batch, scope)
        inferred = time.perf_counter()
        results = self.postprocess(outputs, payloads)
        finished = time.perf_counter()
        scope.metrics.record("PreprocessSeconds", preprocessed - started)
        scope.metrics.record("InferenceSeconds", inferred - preprocessed)
        scope.metrics.record("PostprocessSeconds", finished - inferred)
        self.after_batch(batch, scope.metrics)
        return results

    def after_batch(self, batch: Any, metrics: HandlerMetrics) -> None:
        """Record what a computed batch was (a subclass adds its own figures and clean-up)."""
        metrics.record("BatchRows", batch.rows)

    @staticmethod
    def complete(results: Sequence[Any] | None, expected: int) -> list[Any]:
        """Exactly one result per accepted request: a missing one (a handler bug) is a 500 for that request alone."""
        results = list(results) if results is not None else []
        if len(results) > expected:  # which result belongs to which request is unknowable: fail them all
            logger.error("postprocess returned %d results for %d requests", len(results), expected)
            return [ServerError(f"the handler returned {len(results)} results for {expected} requests")] * expected
        if len(results) < expected:
            logger.error("postprocess returned %d results for %d requests", len(results), expected)
        missing = ServerError("the handler returned no result for this request")
        results += [None] * (expected - len(results))
        return [missing if result is None else result for result in results]

    def answer(self, scope: BatchScope, idx: int, payload: Any, result: Any) -> str:
        """The response body of one accepted request: its result as strict JSON, or its own error."""
        if not isinstance(result, RequestError):
            try:
                body = self.serialize(payload, result)
            except ValueError as error:  # NaN/Infinity or unencodable text: never answer 200 with broken JSON
                logger.error("request %d: its answer is not strict JSON (%s)", idx, error)
                result = ServerError("the model produced a non-finite number (NaN or Infinity); no answer was sent")
            else:
                # The last line of defence: a body over max_response_size would make the frontend drop this worker
                # and fail its whole batch (handlers/core/answer_size.py). Routes that can estimate refuse earlier.
                size = len(body) if body.isascii() else len(body.encode("utf-8"))
                if size <= self.max_answer_bytes:
                    self.set_content_type(scope.context, idx, payload)
                    return body
                logger.warning("request %d: its %d-byte answer is over the frame limit; refused with 413", idx, size)
                result = answer_too_large(size, self.max_answer_bytes, self.fit_hint(payload), estimated=False)
        return self.reject(scope, idx, payload, result)

    def fit_hint(self, payload: Any) -> str | None:
        """How a request whose answer is too large to send can be made to fit, where a route offers more than fewer
        inputs (a compact encoding); None: answer_size.DEFAULT_FIT."""
        return None

    def reject(self, scope: BatchScope, idx: int, payload: Any, error: RequestError) -> str:
        """Give one request its own status and error body; the rest of the batch is unaffected.

        ``payload`` is None for a request refused before it was accepted."""
        setter = getattr(scope.context, "set_response_status", None)
        if setter is not None:
            setter(error.code, error.phrase, idx)
        self.set_content_type(scope.context, idx, payload)
        scope.metrics.record("RequestErrors", 1, [("Code", error.code)])
        return self.serialize(payload, self.error_value(payload, error))

    def set_content_type(self, context: Any, idx: int, payload: Any) -> None:
        setter = getattr(context, "set_response_content_type", None)
        if setter is not None:
            setter(idx, self.content_type(payload))

    # ------------------------------------------------------------------------------ how answers are framed
    def serialize(self, payload: Any, value: Any) -> str:
        """One request's response body (a subclass may frame it differently, e.g. as a stream's last line)."""
        return to_json(value)

    def error_value(self, payload: Any, error: RequestError) -> dict[str, Any]:
        """The JSON value that reports ``error`` to the request (payload None: refused before acceptance)."""
        return error.to_body()

    def content_type(self, payload: Any) -> str:
        return JSON_CONTENT_TYPE

    # ----------------------------------------------------------------------------------------------- subclass API
    # A handler served by HandlerEngine supplies its model family's parts here (handlers/core/engine.py says what
    # each is for); one with an engine of its own (handlers/text/handler.py) overrides create_engine instead.
    def load_model(self, model_dir: str) -> Loaded:
        raise NotImplementedError

    def reference_batch(self, loaded: Any) -> Any:
        raise NotImplementedError

    def warmup_batches(self, loaded: Any) -> Sequence[Any]:
        return []

    def forward(self, model: Any, batch: Any) -> torch.Tensor:
        raise NotImplementedError

    def parse_request(self, body: Any, request: RequestView) -> Any:
        raise NotImplementedError

    def preprocess(self, payloads: list[Any]) -> Batch:
        raise NotImplementedError

    def inference(self, batch: Any, scope: BatchScope) -> Any:
        raise NotImplementedError

    def postprocess(self, outputs: Any, payloads: list[Any]) -> list[Any]:
        raise NotImplementedError


class HandlerEngine(Engine):
    """The engine of a handler whose model family parts are its own methods (the classifier, the generator): the
    walk, gate and warm-up are the engine's, the model, its inputs and its forward pass the handler's."""

    def __init__(self, settings: EngineSettings, handler: ServingHandler) -> None:
        self.handler = handler
        super().__init__(settings, handler.options)

    def family_name(self) -> str:
        return type(self.handler).__name__

    def load_model(self, model_dir: str) -> Loaded:
        return self.handler.load_model(model_dir)

    def reference_batch(self, loaded: Any) -> Any:
        return self.handler.reference_batch(loaded)

    def warmup_batches(self, loaded: Any) -> Sequence[Any]:
        return self.handler.warmup_batches(loaded)

    def forward(self, model: Any, batch: Any) -> torch.Tensor:
        return self.handler.forward(model, batch)
