"""Load a handler in-process, as a TorchServe worker would, with overrides: no server, no HTTP.

Unit tests, benchmarks, the fuzzer's references and the cost check all call handlers this way:

    handler, context = load_handler(model_dir, "minilm", {"precision": "fp32", "cache_size": 0})
    set_requests(context, [{"Content-Type": "application/json"}])
    [answer] = handler.handle([{"body": {"text": "hello"}}], context)
    statuses(context, 1)  # -> [200]

``model_dir`` is a folder laid out like an unpacked archive (model-config.yaml and the model's files); the handler
class is the one the model's spec names (``handler:`` in models/<model_name>/model.yaml), imported from this
repository's handlers package (scripts/ops/registry.py ``handler_class``, the one place that says which class serves
a model). A real ``ts.context.Context`` carries the manifest, the config and request headers.

A model served with TorchServe's ``continuousBatching: true`` (the generator) answers one step per ``handle`` call;
``load_handler`` loads it without (one call answers the whole batch, as the callers here expect) unless
``continuous_batching=True``. :class:`ContinuousFrontend` then plays TorchServe's frontend for it: it hands the
handler its running and queued requests at every step and reads the answers off the wire format, so tests see what
clients would.
"""

from __future__ import annotations

import itertools
import struct
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.ops.registry import handler_class


def make_context(
    model_dir: str | Path,
    model_name: str = "test-model",
    headers: Iterable[Mapping[str, str]] | None = None,
    batch_size: int | None = None,
    version: str = "1.0",
) -> Any:
    """Context as TorchServe builds it: model dir, manifest, the folder's model-config.yaml, request headers."""
    import yaml
    from ts.context import Context

    model_dir = Path(model_dir)
    config_file = model_dir / "model-config.yaml"
    yaml_config = (yaml.safe_load(config_file.read_text()) or {}) if config_file.exists() else {}
    context = Context(
        model_name,
        str(model_dir),
        {"model": {"modelName": model_name, "modelVersion": version}},
        batch_size or yaml_config.get("batchSize", 1),
        None,
        "0.12.0",
        model_yaml_config=yaml_config,
    )
    set_requests(context, headers or [{}])
    return context


def set_requests(context: Any, headers: Iterable[Mapping[str, str]], over_grpc: bool = False) -> Any:
    """One RequestProcessor per request of the next batch, carrying that request's headers.

    Each gets a Host header, as every request over HTTP has; ``over_grpc`` leaves it out, as TorchServe's gRPC
    frontend does (handlers tell the two apart by it: handlers/core/http.py RequestView.over_grpc)."""
    from ts.context import RequestProcessor

    host = {} if over_grpc else {"Host": "127.0.0.1:8080"}
    context.request_processor = [RequestProcessor({**host, **dict(h)}) for h in headers]
    return context


def statuses(context: Any, count: int) -> list[int]:
    """The HTTP status of each of the last batch's ``count`` requests (200 where the handler set none)."""
    return [context.get_response_status(idx)[0] or 200 for idx in range(count)]


def load_handler(
    model_dir: str | Path,
    model_name: str,
    handler_overrides: Mapping[str, Any] | None = None,
    batch_size: int | None = None,
    continuous_batching: bool = False,
) -> tuple[Any, Any]:
    """(initialized handler, its context) for ``model_dir``; ``handler_overrides`` replace keys of the folder's
    ``handler:`` config section, ``batch_size`` TorchServe's batchSize, ``continuous_batching`` TorchServe's
    continuousBatching (False: whatever the folder's config says, so one call answers a whole batch).

    The shared embedding cache is off unless ``handler_overrides`` name one: an in-process handler (a test, a
    benchmark) must not answer from, or write into, the cache of a `make serve` server on the archive's url."""
    context = make_context(model_dir, model_name, batch_size=batch_size)
    config = context.model_yaml_config
    cls = handler_class(model_name, model_dir)
    overrides = dict(handler_overrides or {})
    if "shared_cache" in getattr(cls, "options", {}):
        overrides.setdefault("shared_cache", {"url": ""})
    context.model_yaml_config = {
        **config,
        "continuousBatching": continuous_batching,
        "handler": {**(config.get("handler") or {}), **overrides},
    }
    handler = cls()
    handler.initialize(context)
    return handler, context


class MetricRecorder:
    """Stands in for TorchServe's metric cache on a context: keeps every value a handler records, by name."""

    def __init__(self) -> None:
        self.recorded: dict[str, list[float]] = {}

    def add_metric(
        self, name: str, value: float, unit: str, idx: Any = None, dimensions: Any = None, metric_type: Any = None
    ) -> None:
        self.recorded.setdefault(name, []).append(value)

    def values(self, name: str) -> list[float]:
        return self.recorded.get(name, [])

    def last(self, name: str) -> float | None:
        values = self.values(name)
        return values[-1] if values else None


class ChunkRecorder:
    """Stands in for a generator's socket to the frontend (its ``stream_sink``): keeps every intermediate response as
    {batch index: text}, one dict per message."""

    def __init__(self) -> None:
        self.messages: list[dict[int, str]] = []

    def __call__(self, context: Any, chunks: dict[int, str], message: str = "") -> None:
        self.messages.append(dict(chunks))


def record_metrics(context: Any) -> MetricRecorder:
    """Make ``context`` keep the metrics its handler records from now on; returns what keeps them."""
    recorder = MetricRecorder()
    context.metrics = recorder
    return recorder


def read_int(buffer: bytes, offset: int) -> tuple[int, int]:
    return struct.unpack_from("!i", buffer, offset)[0], offset + 4


def read_bytes(buffer: bytes, offset: int) -> tuple[bytes, int]:
    length, offset = read_int(buffer, offset)
    return bytes(buffer[offset : offset + length]), offset + length


def parse_predict_response(message: bytes) -> tuple[int, dict[str, dict[str, Any]]]:
    """TorchServe's worker-to-frontend predict response (ts/protocol/otf_message_handler.py) -> (code, {request id:
    {status, content_type, headers, body}})."""
    code, offset = read_int(message, 0)
    _, offset = read_bytes(message, offset)
    predictions: dict[str, dict[str, Any]] = {}
    while True:
        length, _ = read_int(message, offset)
        if length == -1:
            return code, predictions
        request_id, offset = read_bytes(message, offset)
        content_type, offset = read_bytes(message, offset)
        status, offset = read_int(message, offset)
        _, offset = read_bytes(message, offset)
        header_count, offset = read_int(message, offset)
        headers = {}
        for _ in range(header_count):
            key, offset = read_bytes(message, offset)
            value, offset = read_bytes(message, offset)
            headers[key.decode()] = value.decode()
        body, offset = read_bytes(message, offset)
        predictions[request_id.decode()] = {
            "status": status,
            "content_type": content_type.decode(),
            "headers": headers,
            "body": body.decode(),
        }


@dataclass
class FrontendJob:
    """One request as the frontend stand-in holds it, and what its client has received so far."""

    request_id: str
    request: dict[str, Any]  # as TorchServe hands it to the worker: {"body": ...} (+ other inputs)
    headers: dict[str, str]
    cached: bool = False  # the worker holds its state: it is handed over without its body
    connected: bool = True  # False: its client went away
    status: int | None = None  # set by its first answer (a whole one, or a stream's first chunk)
    content_type: str = ""
    chunks: list[str] = field(default_factory=list)  # a stream's pieces (the last one included)
    body: str | None = None  # a whole answer
    done: bool = False
    steps: int = 0  # handle() calls it was part of
    step_pieces: int = 0  # chunks it got in the middle of a call (several decoding steps in one call)

    @property
    def text(self) -> str:
        """What the client received: the whole answer, or the stream's chunks joined."""
        return self.body if self.body is not None else "".join(self.chunks)


class ContinuousFrontend:
    """TorchServe 0.12's ContinuousBatching frontend (wlm/ContinuousBatching.java), in-process, for a handler loaded
    with ``continuous_batching=True``.

    Each :meth:`step` hands the handler the jobs it serves (a job whose answer went out as a stream chunk is handed
    over cached: without its body), topped up from the queue to ``batch_size``, encodes the answers as the worker
    does (``ts.protocol.otf_message_handler.create_predict_response``, which applies the handler's
    ``stopping_criteria``) and delivers them: a job whose prediction carries ``ts_stream_next: true`` stays and is
    sent again; one without the header, or with ``false``, is finished; one left out of the answer is sent again
    with its body. A disconnected job is dropped after its next chunk, as TorchServe drops it."""

    def __init__(self, handler: Any, context: Any, batch_size: int | None = None) -> None:
        self.handler = handler
        self.context = context
        self.batch_size = batch_size or int(handler.max_batch_requests)
        self.queue: deque[FrontendJob] = deque()
        self.jobs: dict[str, FrontendJob] = {}
        self.ids = itertools.count()
        self.calls = 0
        handler.stream_sink = self.take_step_pieces  # pieces of a running call, as the patched frontend takes them

    def submit(
        self, body: Any, headers: Mapping[str, str] | None = None, over_grpc: bool = False, **inputs: Any
    ) -> FrontendJob:
        """Queue a request: an HTTP JSON request's headers plus ``headers`` (``over_grpc``: without a Host header,
        as TorchServe's gRPC frontend sends it); ``inputs`` are other named inputs beside the body."""
        host = {} if over_grpc else {"Host": "127.0.0.1:8080"}
        job = FrontendJob(
            request_id=f"job-{next(self.ids)}",
            request={"body": body, **inputs},
            headers={**host, "Content-Type": "application/json", **(headers or {})},
        )
        self.queue.append(job)
        return job

    def step(self) -> list[FrontendJob]:
        """One handle() call; returns the jobs it finished."""
        from ts.context import RequestProcessor
        from ts.protocol.otf_message_handler import create_predict_response

        while self.queue and len(self.jobs) < self.batch_size:
            job = self.queue.popleft()
            self.jobs[job.request_id] = job
        batch = list(self.jobs.values())
        if not batch:
            return []
        self.context.request_processor = [RequestProcessor(dict(job.headers)) for job in batch]
        self.context.request_ids = {idx: job.request_id for idx, job in enumerate(batch)}
        data = [{} if job.cached else dict(job.request) for job in batch]
        answers = self.handler.handle(data, self.context)
        self.calls += 1
        message = create_predict_response(answers, self.context.request_ids, "Prediction success", 200, self.context)
        _, predictions = parse_predict_response(message)
        finished = []
        for job in batch:
            job.steps += 1
            prediction = predictions.get(job.request_id)
            if prediction is None:  # left out: handed over again, with its body
                job.cached = False
                continue
            stream_next = prediction["headers"].get("ts_stream_next")
            if job.status is None:
                job.status, job.content_type = prediction["status"], prediction["content_type"]
            if stream_next in (None, "false") and not job.chunks:  # one answer (over gRPC it says it is the last)
                job.body = prediction["body"]
            else:
                job.chunks.append(prediction["body"])
            if stream_next in (None, "false") or not job.connected:
                job.done = stream_next in (None, "false")
                del self.jobs[job.request_id]
                finished.append(job)
            else:
                job.cached = True
        return finished

    def take_step_pieces(self, context: Any, chunks: dict[int, str], message: str = "") -> None:
        """A step's pieces sent in the middle of a call (handler.decode_call_ms): each open job gets its chunk and
        the call goes on (scripts/frontend_fixes' sendResponse)."""
        from handlers.generation.streaming import STEP_PIECES

        if message != STEP_PIECES:
            raise AssertionError(f"a per-step handler sent an intermediate response marked {message!r}")
        for idx, text in chunks.items():
            job = self.jobs.get(context.request_ids[idx])
            if job is not None and job.connected:
                job.chunks.append(text)
                job.step_pieces += 1

    def disconnect(self, job: FrontendJob) -> None:
        """Its client goes away: TorchServe drops the job after its next chunk (a plain job runs to its end)."""
        job.connected = False

    def run(self, max_calls: int = 10_000) -> int:
        """Step until every queued and running job is finished; returns the handle() calls made."""
        calls = 0
        while (self.queue or self.jobs) and calls < max_calls:
            self.step()
            calls += 1
        if self.queue or self.jobs:
            raise RuntimeError(f"jobs still unanswered after {max_calls} steps")
        return calls
