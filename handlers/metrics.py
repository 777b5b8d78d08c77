"""Custom metrics recorded by the handlers, in one place.

TorchServe's built-in metrics are sums and last values, so per-stage latency percentiles must come from our own
histograms. Every name here must also be declared under ``model_metrics`` in ``config/metrics.yaml`` (the frontend
drops undeclared metrics). Times are recorded in seconds so the Prometheus default buckets (5 ms ... 10 s) fit them.
"""

import logging

logger = logging.getLogger(__name__)

# name -> (unit, TorchServe metric type name)
MODEL_METRICS = {
    "PreprocessSeconds": ("s", "histogram"),
    "InferenceSeconds": ("s", "histogram"),
    "PostprocessSeconds": ("s", "histogram"),
    "BatchRequests": ("count", "histogram"),
    "BatchRows": ("count", "histogram"),
    "RequestErrors": ("count", "counter"),
    "Recompilations": ("count", "counter"),
    "PaddingRatio": ("ratio", "histogram"),
    "CacheHits": ("count", "counter"),
    "CacheMisses": ("count", "counter"),
    "ServedPrecision": ("info", "gauge"),
    "PrecisionMinCosine": ("ratio", "gauge"),
    # generator: time from the start of a batch to its first generated token, and tokens generated
    "TimeToFirstTokenSeconds": ("s", "histogram"),
    "GeneratedTokens": ("count", "counter"),
}


class HandlerMetrics:
    """Records our custom metrics through TorchServe's metric cache; a context without one (unit tests) is fine."""

    def __init__(self, context, model_name):
        self.cache = getattr(context, "metrics", None)
        self.model_name = model_name
        self.recorded = []  # what this batch recorded; unit tests read it

    def record(self, name, value, dimensions=()):
        unit, kind = MODEL_METRICS[name]
        self.recorded.append((name, value, dict(dimensions)))
        if self.cache is None:
            return
        from ts.metrics.dimension import Dimension
        from ts.metrics.metric_type_enum import MetricTypes

        dims = [Dimension("ModelName", self.model_name)] + [Dimension(k, str(v)) for k, v in dimensions]
        dims.append(Dimension("Level", "Model"))
        try:
            self.cache.add_metric(name, value, unit, None, dims, MetricTypes[kind.upper()])
        except Exception:  # a metrics problem must never fail a request
            logger.warning("could not record metric %s", name, exc_info=True)
