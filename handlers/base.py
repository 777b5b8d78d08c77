"""The shared base of every handler: load-time choices once, then preprocess -> inference -> postprocess per batch.

A subclass supplies the model-specific parts:

- ``options``: its ``handler:`` config schema (``config.COMMON_OPTIONS`` plus its own keys),
- ``load_model(model_dir)``: the fp32 model in eval mode,
- ``reference_batch()`` and ``warmup_batches()``: fixed inputs for the accuracy gate and for warm-up,
- ``forward(model, batch)``: one forward pass returning a tensor (used by the gate, warm-up and inference),
- ``parse_request(body, request)``: validation of one request, raising :class:`RequestError`,
- ``preprocess(payloads)``, ``inference(batch)``, ``postprocess(outputs, payloads)`` for the accepted requests.

The base owns what is the same everywhere: the config, device, threads, precision with its accuracy gate, compilation
and warm-up, per-request error mapping, and per-stage timing metrics.
"""

import json
import logging
import time

import torch

from handlers import logging_setup, runtime
from handlers.config import COMMON_OPTIONS, ConfigError, validate
from handlers.errors import RequestError, ServerError
from handlers.metrics import HandlerMetrics

logger = logging.getLogger(__name__)
logging_setup.install()  # a body TorchServe cannot decode costs one log line, not its ~15-line traceback


class RequestView:
    """What a handler may read about one request of the batch besides its body."""

    def __init__(self, context, idx):
        self._context = context
        self.idx = idx

    def header(self, name):
        getter = getattr(self._context, "get_request_header", None)
        if getter is None:
            return None
        value = getter(self.idx, name)
        if value is None:
            value = getter(self.idx, name.lower())
        return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value

    @property
    def content_type(self):
        return (self.header("Content-Type") or "").split(";")[0].strip().lower()


FORM_CONTENT_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def request_body(request):
    """TorchServe hands each request as a dict; a raw body is under ``body`` (or ``data`` for some clients).

    A JSON ``null`` body arrives as None under its key; a missing body is returned as b"" (empty)."""
    if not isinstance(request, dict):
        return request
    for key in ("body", "data"):
        if key in request:
            return request[key]
    return b""


def to_json(value):
    """Strict, compact JSON for a response body or stream line: the one serializer every answer goes through.

    Strict: NaN and Infinity have no JSON spelling (json.dumps would write the non-standard tokens that strict parsers
    reject), so a non-finite number raises ValueError here instead of reaching a client; so does text that cannot be
    sent as UTF-8 (a lone surrogate). Compact: TorchServe would pretty-print (indent=2) a dict or list a handler
    returns, with its slow pure-Python encoder; a string goes out as its UTF-8 bytes."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")  # UnicodeEncodeError (a ValueError) now, rather than in TorchServe for the whole batch
    return text


def server_failure(error):
    """The 500 (or 507 when memory ran out) that answers a request whose computation raised ``error``."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return ServerError(f"out of memory while computing the answer ({type(error).__name__}); retry later or "
                           f"send a smaller request", code=507, error_type="InsufficientStorage")
    return ServerError(f"inference failed: {type(error).__name__}")


def decode_json(raw):
    """Parse a body TorchServe could not decode (no JSON content type, or invalid JSON) with a precise message."""
    if raw is None or len(raw) == 0:
        raise RequestError("request body is empty")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(f"body is not valid UTF-8 (byte {error.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(f"body is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    except RecursionError:
        raise RequestError("body is not valid JSON: nested too deeply") from None
    except ValueError as error:  # e.g. an integer literal longer than Python's 4300-digit limit
        raise RequestError(f"body is not valid JSON: {error}"[:300]) from None


def json_body(body, request):
    """The request's JSON value, whether TorchServe parsed it (JSON content type) or left raw bytes/text.

    TorchServe parses a body sent as application/json; for other content types, or JSON it failed to parse, the
    body arrives as bytes (or str for text/*), and we parse it here so that errors name the problem."""
    if isinstance(body, (bytes, bytearray)):
        return decode_json(body)
    if isinstance(body, str) and request.content_type != "application/json":
        return decode_json(body.encode("utf-8"))
    return body


class ServingHandler:
    options = COMMON_OPTIONS

    def __init__(self):
        self.initialized = False
        self.model = None

    # ----------------------------------------------------------------------------------------------- load time
    def initialize(self, context):
        started = time.perf_counter()
        properties = context.system_properties
        self.model_dir = properties.get("model_dir")
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        self.config = validate(yaml_config.get("handler"), self.options)
        self.max_batch_requests = int(properties.get("batch_size") or yaml_config.get("batchSize") or 1)
        model_info = (getattr(context, "manifest", None) or {}).get("model", {})
        self.model_name = model_info.get("modelName", type(self).__name__)
        self.model_version = str(model_info.get("modelVersion", "0"))
        self.device = runtime.choose_device(properties.get("gpu_id"))
        self.threads = runtime.set_threads(self.config["threads"], int(yaml_config.get("maxWorkers") or 1))

        fp32_model = self.load_model(self.model_dir).eval().to(self.device)
        # Inputs are made outside inference mode, as served requests' are: a compiled graph guards on that too.
        warmup_batches = list(self.warmup_batches()) if self.config["warmup"] else []
        reference_batch = self.reference_batch()
        with torch.inference_mode():
            self.model, self.precision, self.min_cosine = self.select_precision(fp32_model, reference_batch)
            self.compute_dtype = runtime.FLOAT_DTYPES.get(self.precision, torch.float32)
            self.model = self.prepare_compiled(self.model)
            for batch in warmup_batches:
                self.forward(self.model, batch)
        self.compiles_after_warmup = runtime.compile_count()
        self.load_seconds = time.perf_counter() - started
        logger.info(
            "%s %s ready on %s: precision=%s (requested %s, min cosine to fp32 %.6f), compile=%s, threads=%d, "
            "load %.1fs", self.model_name, self.model_version, self.device, self.precision, self.config["precision"],
            self.min_cosine, self.config["compile"], self.threads, self.load_seconds,
        )
        load_metrics = HandlerMetrics(context, self.model_name)
        load_metrics.record("ServedPrecision", 1, [("Precision", self.precision)])
        load_metrics.record("PrecisionMinCosine", self.min_cosine, [("Precision", self.precision)])
        self.initialized = True

    def select_precision(self, fp32_model, reference):
        """Convert to the configured precision, then keep it only if it passes the accuracy gate against fp32."""
        wanted = runtime.resolve_precision(self.config["precision"], self.device)
        if wanted == "fp32":
            return fp32_model, "fp32", 1.0
        if wanted == "int8" and self.device.type != "cpu":
            raise ConfigError("handler.precision: int8 dynamic quantization runs on CPU only")
        candidate = runtime.convert_model(fp32_model, wanted)
        self.compute_dtype = torch.float32
        expected = self.forward(fp32_model, reference)
        self.compute_dtype = runtime.FLOAT_DTYPES.get(wanted, torch.float32)
        similarity = runtime.min_cosine_similarity(expected, self.forward(candidate, reference))
        bound = self.config["min_cosine"]
        if similarity < bound:
            logger.warning(
                "accuracy gate: %s reached min cosine %.6f to fp32, below the bound %.6f; serving fp32 instead",
                wanted, similarity, bound,
            )
            self.gate_rejected = wanted
            return fp32_model, "fp32", similarity
        logger.info("accuracy gate: %s passed with min cosine %.6f to fp32 (bound %.6f)", wanted, similarity, bound)
        return candidate, wanted, similarity

    def prepare_compiled(self, model):
        mode = self.config["compile"]
        if mode == "jit":
            return runtime.compile_model(model)
        if mode == "aot":
            return self.load_aot(self.model_dir)
        return model

    def load_aot(self, model_dir):
        raise ConfigError(f"handler.compile: {type(self).__name__} has no ahead-of-time package; use none or jit")

    # ----------------------------------------------------------------------------------------------- per batch
    def handle(self, data, context):
        """Answer every request of the batch: its own error for an invalid one, a result for each of the others."""
        if len(data) == 1 and RequestView(context, 0).header("describe") == "True":
            # GET /models/{name}?customized=true arrives as a request with this header (TorchServe's convention).
            return [to_json(self.describe())]
        metrics = HandlerMetrics(context, self.model_name)
        responses = [None] * len(data)
        accepted = []
        for idx, request in enumerate(data):
            try:
                view = RequestView(context, idx)
                if view.content_type in FORM_CONTENT_TYPES:
                    # TorchServe splits form bodies into fields and drops the raw body: say so instead of "empty".
                    raise RequestError(f"the body was sent as {view.content_type} (curl -d's default), which "
                                       f"TorchServe decodes as form fields; send it with "
                                       f"-H 'Content-Type: application/json' (or text/plain where accepted)",
                                       code=415, error_type="UnsupportedMediaType")
                accepted.append((idx, self.parse_request(request_body(request), view)))
            except RequestError as error:
                responses[idx] = self.serialize(idx, self.reject(context, idx, error, metrics))
            except Exception as error:  # a parser bug must cost this request only, never the batch
                logger.error("request %d: validation failed unexpectedly", idx, exc_info=True)
                responses[idx] = self.serialize(idx, self.reject(context, idx, server_failure(error), metrics))
        if accepted:
            results = self.run_stages([payload for _, payload in accepted], metrics)
            for (idx, _), result in zip(accepted, results):
                responses[idx] = self.answer(context, idx, result, metrics)
        metrics.record("BatchRequests", len(data))
        compiles = runtime.compile_count() - self.compiles_after_warmup if self.config["compile"] == "jit" else 0
        if compiles > 0:
            logger.warning("%d recompilation(s) after warm-up: a served shape was not warmed up", compiles)
            metrics.record("Recompilations", compiles)
            self.compiles_after_warmup += compiles
        return responses

    def describe(self):
        """What ``describe --customized`` shows: the choices this worker made at load."""
        return {
            "precision": self.precision,
            "requested_precision": self.config["precision"],
            "precision_min_cosine": round(self.min_cosine, 6),
            "gate_rejected": getattr(self, "gate_rejected", None),
            "compile": self.config["compile"],
            "device": str(self.device),
            "threads": self.threads,
            "load_seconds": round(self.load_seconds, 2),
        }

    def run_stages(self, payloads, metrics):
        """Results for the accepted requests, one each, in order: a JSON-able value or a RequestError.

        A failure of the shared batch step must not fail requests that did not cause it: the batch is retried one
        request at a time, so only the request that breaks the step (or a request that cannot be repeated, see
        :meth:`can_retry_alone`) gets the error."""
        try:
            return self.complete(self.run_batch(payloads, metrics), len(payloads))
        except RequestError as error:  # a stage found the whole group of accepted requests unservable
            return [error] * len(payloads)
        except Exception as error:  # our bug, the model's, or the machine's: answer with JSON, keep the worker
            failure = server_failure(error)
            if len(payloads) == 1:
                logger.error("request failed: %s", failure.message, exc_info=True)
                return [failure]
            logger.warning("batch of %d failed (%s); retrying its requests one at a time", len(payloads),
                           failure.message, exc_info=True)
            return [self.run_stages([payload], metrics)[0] if self.can_retry_alone(payload) else failure
                    for payload in payloads]

    def run_batch(self, payloads, metrics):
        """preprocess -> inference -> postprocess for the accepted requests, with per-stage timing."""
        started = time.perf_counter()
        batch = self.preprocess(payloads)
        preprocessed = time.perf_counter()
        with torch.inference_mode():
            outputs = self.inference(batch)
        inferred = time.perf_counter()
        results = self.postprocess(outputs, payloads)
        finished = time.perf_counter()
        metrics.record("PreprocessSeconds", preprocessed - started)
        metrics.record("InferenceSeconds", inferred - preprocessed)
        metrics.record("PostprocessSeconds", finished - inferred)
        return results

    @staticmethod
    def complete(results, expected):
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

    def can_retry_alone(self, payload):
        """Whether a request may be computed again after its batch failed (not if part of it was already sent)."""
        return True

    def answer(self, context, idx, result, metrics):
        """The response body of one accepted request: its result as strict JSON, or its own error."""
        if not isinstance(result, RequestError):
            try:
                body = self.serialize(idx, result)
                self.set_json(context, idx)
                return body
            except ValueError as error:  # NaN/Infinity or unencodable text: never answer 200 with broken JSON
                logger.error("request %d: its answer is not strict JSON (%s)", idx, error)
                result = ServerError("the model produced a non-finite number (NaN or Infinity); no answer was sent")
        return self.serialize(idx, self.reject(context, idx, result, metrics))

    def serialize(self, idx, value):
        """One request's response body (a subclass may frame it differently, e.g. as a stream's last line)."""
        return to_json(value)

    @staticmethod
    def set_json(context, idx):
        setter = getattr(context, "set_response_content_type", None)
        if setter is not None:
            setter(idx, "application/json")

    def reject(self, context, idx, error, metrics):
        """Give one request its own status and error body (to be serialized); the rest of the batch is unaffected."""
        setter = getattr(context, "set_response_status", None)
        if setter is not None:
            setter(error.code, error.phrase, idx)
        self.set_json(context, idx)
        metrics.record("RequestErrors", 1, [("Code", error.code)])
        return error.to_body()

    # ----------------------------------------------------------------------------------------------- subclass API
    def load_model(self, model_dir):
        raise NotImplementedError

    def reference_batch(self):
        raise NotImplementedError

    def warmup_batches(self):
        return []

    def forward(self, model, batch):
        raise NotImplementedError

    def parse_request(self, body, request):
        raise NotImplementedError

    def preprocess(self, payloads):
        raise NotImplementedError

    def inference(self, batch):
        raise NotImplementedError

    def postprocess(self, outputs, payloads):
        raise NotImplementedError
