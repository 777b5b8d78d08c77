"""The shared base of every handler: load-time choices once, then parse -> preprocess -> inference -> postprocess.

A subclass supplies the model-specific parts:

- ``options``: its ``handler:`` config schema (``config.COMMON_OPTIONS`` plus its own keys),
- ``load_model(model_dir)``: what it loads, as a :class:`Loaded` object (the fp32 model in eval mode, plus e.g. its
  tokenizer and limits),
- ``reference_batch(loaded)`` and ``warmup_batches(loaded)``: fixed inputs for the accuracy gate and for warm-up,
- ``forward(model, batch)``: one forward pass returning a tensor (used by the gate, warm-up and inference),
- ``parse_request(body, request)``: validation of one request into its payload, raising :class:`RequestError`,
- ``preprocess(payloads)`` -> a batch object (with ``rows``), ``inference(batch, scope)`` -> outputs,
  ``postprocess(outputs, payloads)`` -> one result per payload: each stage gets what it needs from the one before by
  return value; nothing about a batch is left on the handler.

The base owns what is the same everywhere: the config, device, threads, the backend walk (which backend and precision
serve, each candidate checked against fp32 by the accuracy gate, refusals logged with their reason), warm-up,
per-request error mapping, one result per request, retrying a failed batch one request at a time, and the metrics
every handler records. A handler with more backends than eager/jit overrides ``backend_candidates`` and
``load_backend``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from handlers.core import identity, logging_setup, runtime
from handlers.core.answer_size import answer_too_large, frame_limit
from handlers.core.config import COMMON_OPTIONS, ConfigError, Option, validate
from handlers.core.errors import RequestError, ServerError, server_failure
from handlers.core.http import FORM_CONTENT_TYPES, RequestView, request_body, to_json
from handlers.core.load_phases import LoadPhases
from handlers.core.metrics import HandlerMetrics

logger = logging.getLogger(__name__)
logging_setup.install()  # a body TorchServe cannot decode costs one log line, not its ~15-line traceback

JSON_CONTENT_TYPE = "application/json"
GATE_REFUSAL = "accuracy gate:"  # how a refusal by the accuracy gate starts (gate_rejected is read from it)


@dataclass
class Loaded:
    """What ``load_model`` returns; a handler's own subclass adds what else it loaded (tokenizer, limits, ...).

    After load, ``model`` is the served model (converted, compiled), not the fp32 one."""

    model: Any  # a torch.nn.Module, or the callable torch.compile / AOTInductor / OpenVINO made of it


@dataclass(frozen=True)
class Candidate:
    """A (backend, precision) the backend walk may serve, and why it is on the list."""

    backend: str
    precision: str
    why: str  # e.g. "configured", "rank 1 in backends/manifest.json": shown as backend_reason when it serves


@dataclass(frozen=True)
class BackendChoice:
    """The backend walk's outcome: what serves, how close it is to fp32, and what was refused before it."""

    model: Any
    backend: str
    precision: str
    min_cosine: float  # smallest cosine similarity of its outputs to fp32 eager's on the reference batch
    reason: str  # why this candidate serves
    fallbacks: list[dict[str, str]]  # {backend, precision, reason} tried and refused at load, in order


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
    # any other path gets a 404 naming these (a subclass adds e.g. 'v1/embeddings' and branches on view.url_path).
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
        # Each step's seconds, logged on the ready line and described (load_phases), so a slow start says where.
        self.load_phases = phases = LoadPhases()
        properties = context.system_properties
        self.model_dir = properties.get("model_dir")
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        self.config = validate(yaml_config.get("handler"), self.options)
        self.max_batch_requests = int(properties.get("batch_size") or yaml_config.get("batchSize") or 1)
        model_info = (getattr(context, "manifest", None) or {}).get("model", {})
        self.model_name = model_info.get("modelName", type(self).__name__)
        self.max_answer_bytes = frame_limit()  # handlers/core/answer_size.py: larger bodies kill the worker
        self.model_version = str(model_info.get("modelVersion", "0"))
        self.device = runtime.choose_device(properties.get("gpu_id"))
        self.threads = runtime.set_threads(self.config["threads"], int(yaml_config.get("maxWorkers") or 1))
        # What this worker computes with, as a digest of the archive's content (recorded at package time): in every
        # cache key, in describe and in each answer's header, so two models under one name never share an answer.
        self.identity = str(identity.of_folder(self.model_dir, yaml_config.get("handler"))["identity"])

        with phases.phase("model"):
            loaded = self.load_model(self.model_dir)
            fp32_model = loaded.model.eval().to(self.device)
        # Inputs are made outside inference mode, as served requests' are: a compiled graph guards on that too.
        with phases.phase("reference_inputs"):
            reference_batch = self.reference_batch(loaded)
        with torch.inference_mode():
            choice = self.select_backend(fp32_model, loaded, reference_batch)
        self.backend, self.precision = choice.backend, choice.precision
        self.backend_reason, self.backend_fallbacks = choice.reason, choice.fallbacks
        self.min_cosine = choice.min_cosine
        gated = [f["precision"] for f in choice.fallbacks if f["reason"].startswith(GATE_REFUSAL)]
        self.gate_rejected = gated[0] if gated and gated[0] != choice.precision else None
        # Warm-up shapes depend on the backend that serves (a jit graph needs every shape family, eager one pass).
        with phases.phase("warmup"):
            warmup_batches = list(self.warmup_batches(loaded)) if self.config["warmup"] else []
            with torch.inference_mode():
                for batch in warmup_batches:
                    self.forward(choice.model, batch)
        self.loaded = dataclasses.replace(loaded, model=choice.model)  # the fp32 copy is not kept alive
        # Only jit compiles in the worker; reading dynamo's counter imports torch._dynamo (~1 s of a start) otherwise.
        self.compiles_after_warmup = runtime.compile_count() if self.backend == "jit" else 0
        self.load_seconds = phases.finish()
        logger.info(
            "%s %s ready on %s: backend=%s precision=%s (requested %s/%s; %s; min cosine to fp32 %.6f), threads=%d, "
            "load %.1fs (%s)",
            self.model_name,
            self.model_version,
            self.device,
            self.backend,
            self.precision,
            self.config["backend"],
            self.config["precision"],
            self.backend_reason,
            self.min_cosine,
            self.threads,
            self.load_seconds,
            phases.summary(),
        )
        load_metrics = HandlerMetrics(context, self.model_name)
        load_metrics.record("ServedBackend", 1, [("Backend", self.backend), ("Precision", self.precision)])
        load_metrics.record("ServedPrecision", 1, [("Precision", self.precision)])
        load_metrics.record("PrecisionMinCosine", self.min_cosine, [("Precision", self.precision)])
        self.initialized = True

    def select_backend(self, fp32_model: torch.nn.Module, loaded: Any, reference: Any) -> BackendChoice:
        """Walk the candidates in order; the first that loads and passes the accuracy gate against fp32 serves.

        Each refused candidate is logged once with its reason and listed in ``backend_fallbacks``. The walk of the
        base handler ends with eager fp32, which always passes; a walk with nothing left is a config error."""
        wanted = runtime.resolve_precision(self.config["precision"], self.device)
        if wanted == "int8" and self.device.type != "cpu":
            raise ConfigError("handler.precision: int8 dynamic quantization runs on CPU only")
        phases = self.load_phases
        with phases.phase("gate_reference"):
            expected = self.reference_output(fp32_model, reference)
        bound = self.config["min_cosine"]
        fallbacks: list[dict[str, str]] = []
        for candidate in self.backend_candidates(loaded, wanted):
            backend, precision = candidate.backend, candidate.precision
            try:
                with phases.phase("backend_load"):
                    model = self.load_backend(backend, precision, fp32_model, loaded)
                exact = backend == "eager" and precision == "fp32"  # the reference itself: nothing to compare
                with phases.phase("gate"):
                    similarity = (
                        1.0
                        if exact
                        else self.gate_similarity(loaded, expected, self.reference_output(model, reference))
                    )
            except runtime.BackendUnavailable as error:
                reason = str(error)
            except ConfigError:
                raise
            except Exception as error:  # a candidate that breaks while loading must not stop the ones after it
                logger.warning("backend %s %s failed to load", backend, precision, exc_info=True)
                reason = f"failed to load: {type(error).__name__}: {error}"
            else:
                if similarity >= bound:
                    logger.info(
                        "backend %s %s serves (%s): min cosine %.6f to fp32 eager on the reference batch (bound %g)",
                        backend,
                        precision,
                        candidate.why,
                        similarity,
                        bound,
                    )
                    return BackendChoice(model, backend, precision, similarity, candidate.why, fallbacks)
                reason = f"{GATE_REFUSAL} min cosine {similarity:.6f} to fp32 eager is below the bound {bound:g}"
            logger.warning("backend %s %s not served: %s", backend, precision, reason)
            fallbacks.append({"backend": backend, "precision": precision, "reason": reason})
        refused = "; ".join(f"{f['backend']} {f['precision']}: {f['reason']}" for f in fallbacks)
        raise ConfigError(f"handler.backend: no candidate can serve on this worker ({refused})")

    def gate_similarity(self, loaded: Any, expected: torch.Tensor, got: torch.Tensor) -> float:
        """How close a candidate's reference output is to fp32 eager's, compared with handler.min_cosine: the smallest
        row cosine similarity (a text model uses its kind's measure, handlers/text/kinds/)."""
        return runtime.min_cosine_similarity(expected, got)

    def backend_candidates(self, loaded: Any, precision: str) -> list[Candidate]:
        """The configured backend at the wanted precision, then at fp32 (where the accuracy gate falls back to)."""
        backend = self.config["backend"]
        candidates = [Candidate(backend, precision, "configured")]
        if precision != "fp32":
            candidates.append(Candidate(backend, "fp32", f"fp32, because {precision} was refused"))
        return candidates

    def load_backend(self, backend: str, precision: str, fp32_model: torch.nn.Module, loaded: Any) -> Any:
        """The callable that serves ``backend`` at ``precision``; raises runtime.BackendUnavailable with the reason."""
        model = runtime.convert_model(fp32_model, precision)
        if backend == "jit":
            return runtime.compile_model(model)
        if backend == "eager":
            return model
        raise ConfigError(f"handler.backend: {type(self).__name__} cannot serve {backend!r}")

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
        return {
            "identity": self.identity,
            "backend": self.backend,
            "requested_backend": self.config["backend"],
            "backend_reason": self.backend_reason,
            "precision": self.precision,
            "requested_precision": self.config["precision"],
            "backend_min_cosine": round(self.min_cosine, 6),
            "backend_fallbacks": self.backend_fallbacks,
            "gate_rejected": self.gate_rejected,
            "device": str(self.device),
            "cpu_kind": runtime.cpu_kind(),  # what precision auto and the refusals were decided for (TS_CPU_AS)
            "threads": self.threads,
            "load_seconds": round(self.load_seconds, 2),
            "load_phases": self.load_phases.rounded(),
        }

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
    def load_model(self, model_dir: str) -> Loaded:
        raise NotImplementedError

    def reference_batch(self, loaded: Any) -> Any:
        raise NotImplementedError

    def warmup_batches(self, loaded: Any) -> Sequence[Any]:
        return []

    def reference_output(self, model: Any, reference: Any) -> torch.Tensor:
        """``model``'s output on the reference inputs, which the accuracy gate compares (one forward pass here)."""
        return self.forward(model, reference)

    def forward(self, model: Any, batch: Any) -> torch.Tensor:
        """One forward pass of ``model`` (the fp32 or converted module, or a compiled callable) on ``batch``."""
        raise NotImplementedError

    def parse_request(self, body: Any, request: RequestView) -> Any:
        raise NotImplementedError

    def preprocess(self, payloads: list[Any]) -> Batch:
        raise NotImplementedError

    def inference(self, batch: Any, scope: BatchScope) -> Any:
        raise NotImplementedError

    def postprocess(self, outputs: Any, payloads: list[Any]) -> list[Any]:
        raise NotImplementedError
