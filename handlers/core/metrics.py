"""Custom metrics recorded by the handlers: declared here once, recorded through :class:`HandlerMetrics`.

TorchServe's frontend drops a metric its metrics file does not declare, so ``config/metrics.yaml`` is generated from
:data:`MODEL_METRICS` (``python -m scripts.package --metrics``; a unit test fails when the file is out of step).

Why sizes are counters, not histograms: TorchServe 0.12 builds every Prometheus histogram with the client library's
default buckets (5 ms ... 10 s; its metrics file has no bucket setting and the frontend's PrometheusHistogram sets
none), which fit durations in seconds only: a batch of 64 rows would land in +Inf. So only times are histograms; sizes
are counters whose ratios are the means a dashboard wants (BatchRows / Batches = mean rows per batch,
PaddedTokens / RealTokens = padding ratio), computed over any window with ``rate()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricSpec:
    kind: str  # TorchServe metric type: "counter", "gauge" or "histogram"
    unit: str
    help: str
    labels: tuple[str, ...] = ()  # dimensions between ModelName and Level


# Every dimension list is ModelName, the metric's own labels, Level (the order TorchServe exports them in).
MODEL_METRICS: dict[str, MetricSpec] = {
    # per-stage times of a batch: the percentiles TorchServe's built-in sums cannot give
    "PreprocessSeconds": MetricSpec("histogram", "s", "time in preprocess per batch"),
    "InferenceSeconds": MetricSpec("histogram", "s", "time in inference per batch"),
    "PostprocessSeconds": MetricSpec("histogram", "s", "time in postprocess per batch"),
    # batch sizes (every handler)
    "Batches": MetricSpec("counter", "count", "batches TorchServe handed to the handler"),
    "BatchRequests": MetricSpec("counter", "count", "requests in those batches; / Batches = mean batch size"),
    "BatchRows": MetricSpec(
        "counter", "count", "rows (inputs, texts, prompts) of accepted requests; / Batches = mean rows per batch"
    ),
    "RequestErrors": MetricSpec("counter", "count", "requests answered with an error, by HTTP code", ("Code",)),
    "ServedBackend": MetricSpec(
        "gauge", "info", "1 for the backend and precision the worker serves", ("Backend", "Precision")
    ),
    "ServedPrecision": MetricSpec("gauge", "info", "1 for the precision the worker serves", ("Precision",)),
    "PrecisionMinCosine": MetricSpec("gauge", "ratio", "accuracy gate: min cosine similarity to fp32", ("Precision",)),
    "Recompilations": MetricSpec("counter", "count", "torch.compile recompilations after warm-up (jit)"),
    # embeddings
    "ForwardCores": MetricSpec(
        "counter",
        "count",
        "cores each batch's forward passes ran on (own share + idle cores borrowed), summed; / Batches = mean",
    ),
    "CacheHits": MetricSpec("counter", "count", "rows answered from the worker's embedding cache"),
    "CacheMisses": MetricSpec("counter", "count", "rows computed by the model"),
    # the shared cache tier (handlers/text/shared_cache.py), asked for the worker cache's misses
    "SharedCacheHits": MetricSpec("counter", "count", "rows answered from the shared cache server"),
    "SharedCacheMisses": MetricSpec("counter", "count", "rows asked of the shared cache and not found there"),
    "SharedCacheBadValues": MetricSpec(
        "counter", "count", "values found but refused (length, format, key check, norm): misses, then overwritten"
    ),
    "SharedCacheErrors": MetricSpec("counter", "count", "shared cache round trips that failed (not timeouts)"),
    "SharedCacheTimeouts": MetricSpec("counter", "count", "shared cache round trips past timeout_ms"),
    "SharedCacheSkipped": MetricSpec("counter", "count", "round trips not made because the breaker was open"),
    "SharedCacheBreakerOpen": MetricSpec("gauge", "state", "the shared cache breaker: 0 closed, 0.5 half-open, 1 open"),
    # In milliseconds, not seconds: the default buckets (0.005 ... 10) then cover 5 us ... 10 ms, where loopback
    # and in-cluster round trips lie.
    "SharedCacheRoundTripMilliseconds": MetricSpec(
        "histogram", "ms", "one shared cache round trip (MGET or pipelined SET)", ("Operation",)
    ),
    "PaddedTokens": MetricSpec("counter", "count", "tokens the forward passes computed, padding included"),
    "RealTokens": MetricSpec(
        "counter", "count", "tokens of the computed texts; PaddedTokens / RealTokens = padding ratio (1.0 = none)"
    ),
    "ForwardPasses": MetricSpec(
        "counter",
        "count",
        "forward passes run; PaddedTokens / ForwardPasses = padded tokens per pass (<= handler.max_forward_tokens)",
    ),
    # generator
    "TimeToFirstTokenSeconds": MetricSpec(
        "histogram", "s", "from a request's arrival at the worker to its first generated token"
    ),
    "GeneratedTokens": MetricSpec("counter", "count", "tokens generated"),
    "DecodeSteps": MetricSpec("counter", "count", "decoding steps; GeneratedTokens / DecodeSteps ~ rows per step"),
    "PrefillTokens": MetricSpec("counter", "count", "prompt tokens run through the model (prefix reuse lowers it)"),
    "RunningRequests": MetricSpec("gauge", "count", "requests decoding in the worker's running batch (per step)"),
    "WaitingRequests": MetricSpec("gauge", "count", "requests the worker holds until the running batch has room"),
    "CancelledRequests": MetricSpec("counter", "count", "requests dropped mid-generation because the client left"),
    "PrefixCacheHits": MetricSpec("counter", "count", "prompts that reused a cached prefix's keys and values"),
    "PrefixCacheMisses": MetricSpec("counter", "count", "prompts looked up in the prefix cache and not found"),
    "PrefixCacheTokens": MetricSpec("counter", "count", "prompt tokens taken from the prefix cache, not recomputed"),
    # the generator's similarity cache (handlers/generation/semantic_cache); its shared tier's round trips, errors,
    # timeouts, breaker and bad values are the SharedCache* metrics above, under the generator's name
    "SemanticCacheHits": MetricSpec("counter", "count", "requests answered from the similarity cache (no decode)"),
    "SemanticCacheMisses": MetricSpec("counter", "count", "requests looked up, not found, and generated"),
    "SemanticCacheSkipped": MetricSpec(
        "counter",
        "count",
        "requests not looked up, by reason (opted_out, unseeded_sampling, too_long, ...)",
        ("Reason",),
    ),
    "SemanticCacheRefused": MetricSpec(
        "counter",
        "count",
        "candidates the verification refused, by check (lexical, verifier, verifier_failed)",
        ("Check",),
    ),
    "SemanticCacheStored": MetricSpec("counter", "count", "new answers stored"),
    "SemanticCacheReceived": MetricSpec("counter", "count", "answers taken from the shared tier (other workers')"),
    "SemanticCacheEntries": MetricSpec("gauge", "count", "answers the worker's similarity index holds"),
    "SemanticCacheLookupMilliseconds": MetricSpec(
        "histogram", "ms", "one batch's lookups: shared-tier read, embedding the prompts, searching, verifying"
    ),
}


def dimension_names(name: str) -> list[str]:
    """The dimensions a metric is recorded with, in order (what config/metrics.yaml must declare for it)."""
    return ["ModelName", *MODEL_METRICS[name].labels, "Level"]


class HandlerMetrics:
    """Records our custom metrics through TorchServe's metric cache; a context without one (unit tests) is fine."""

    def __init__(self, context: Any, model_name: str) -> None:
        self.cache = getattr(context, "metrics", None)
        self.model_name = model_name
        self.recorded: list[tuple[str, float, dict[str, str]]] = []  # what was recorded; unit tests read it

    def record(self, name: str, value: float, dimensions: Iterable[tuple[str, Any]] = ()) -> None:
        spec = MODEL_METRICS[name]
        labels = {key: str(value_) for key, value_ in dimensions}
        if tuple(labels) != spec.labels:
            raise ValueError(f"metric {name} is declared with labels {spec.labels}, recorded with {tuple(labels)}")
        self.recorded.append((name, value, labels))
        if self.cache is None:
            return
        from ts.metrics.dimension import Dimension
        from ts.metrics.metric_type_enum import MetricTypes

        dims = [Dimension("ModelName", self.model_name)] + [Dimension(k, v) for k, v in labels.items()]
        dims.append(Dimension("Level", "Model"))
        try:
            self.cache.add_metric(name, value, spec.unit, None, dims, MetricTypes[spec.kind.upper()])
        except Exception:  # a metrics problem must never fail a request
            logger.warning("could not record metric %s", name, exc_info=True)

    def values(self, name: str) -> list[float]:
        """Every value recorded for ``name`` by this recorder."""
        return [value for recorded, value, _ in self.recorded if recorded == name]
