"""Load a handler in-process, as a TorchServe worker would, with overrides: no server, no HTTP.

Unit tests, benchmarks, the fuzzer's references and the cost check all call handlers this way:

    handler, context = load_handler(model_dir, "minilm", {"precision": "fp32", "cache_size": 0})
    set_requests(context, [{"Content-Type": "application/json"}])
    [answer] = handler.handle([{"body": {"text": "hello"}}], context)
    statuses(context, 1)  # -> [200]

``model_dir`` is a folder laid out like an unpacked archive (model-config.yaml and the model's files); the handler
class is the one the model's spec names (``handler:`` in models/<model_name>/model.yaml), imported from this
repository's handlers package. A real ``ts.context.Context`` carries the manifest, the config and request headers.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


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


def entry_class(handler_path: str | Path) -> type:
    """The one class an entry module (e.g. handlers/classifier.py) defines; TorchServe's rule: exactly one, imported
    classes do not count."""
    module = importlib.import_module(Path(handler_path).with_suffix("").as_posix().replace("/", "."))
    classes = [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    if len(classes) != 1:
        raise ValueError(
            f"{handler_path}: TorchServe needs exactly one class in a handler module, found {len(classes)}"
        )
    return classes[0]


def handler_class(model_name: str, model_dir: str | Path | None = None) -> type:
    """The handler class of a model: the entry module its spec names (``handler:`` in models/<name>/model.yaml), else,
    for an unpacked archive of a model packaged under its own name, the one its MAR-INF/MANIFEST.json names."""
    import json

    import yaml

    spec_path = REPO / "models" / model_name / "model.yaml"
    if spec_path.is_file():
        return entry_class(yaml.safe_load(spec_path.read_text())["handler"])
    manifest = Path(model_dir or "") / "MAR-INF" / "MANIFEST.json"
    if model_dir is not None and manifest.is_file():
        handler = str(json.loads(manifest.read_text()).get("model", {}).get("handler") or "")
        return entry_class(f"handlers/{Path(handler).name}")
    known = sorted(p.parent.name for p in (REPO / "models").glob("*/model.yaml"))
    raise ValueError(f"no model spec {spec_path.relative_to(REPO)} (known models: {known}) and no archive manifest")


def load_handler(
    model_dir: str | Path,
    model_name: str,
    handler_overrides: Mapping[str, Any] | None = None,
    batch_size: int | None = None,
) -> tuple[Any, Any]:
    """(initialized handler, its context) for ``model_dir``; ``handler_overrides`` replace keys of the folder's
    ``handler:`` config section, ``batch_size`` TorchServe's batchSize.

    The shared embedding cache is off unless ``handler_overrides`` name one: an in-process handler (a test, a
    benchmark) must not answer from, or write into, the cache of a `make serve` server on the archive's url."""
    context = make_context(model_dir, model_name, batch_size=batch_size)
    config = context.model_yaml_config
    cls = handler_class(model_name, model_dir)
    overrides = dict(handler_overrides or {})
    if "shared_cache" in getattr(cls, "options", {}):
        overrides.setdefault("shared_cache", {"url": ""})
    context.model_yaml_config = {**config, "handler": {**(config.get("handler") or {}), **overrides}}
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

    def __call__(self, context: Any, chunks: dict[int, str]) -> None:
        self.messages.append(dict(chunks))


def record_metrics(context: Any) -> MetricRecorder:
    """Make ``context`` keep the metrics its handler records from now on; returns what keeps them."""
    recorder = MetricRecorder()
    context.metrics = recorder
    return recorder
