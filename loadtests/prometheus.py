"""Server-side figures from TorchServe's Prometheus endpoint, scraped before and after a run.

TorchServe's built-in metrics are counters (sums) and last-value gauges; the handlers add histograms of stage times
(``PreprocessSeconds``, ``InferenceSeconds``, ``PostprocessSeconds``) and counters (``Batches``, ``BatchRequests``,
``BatchRows``, ``PaddedTokens``, ``RealTokens``, ``ForwardPasses``, ``CacheHits``, ``CacheMisses``,
``RequestErrors``), declared in handlers/core/metrics.py (config/metrics.yaml is generated from it). A run's
figures are the *difference* of two scrapes, so earlier traffic on the same server does not leak into them.
"""

import math
import re

import requests

from scripts.ops.stats import bucket_upper_bound

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

HANDLER_STAGES = ("PreprocessSeconds", "InferenceSeconds", "PostprocessSeconds")


def parse(text):
    """Prometheus text format -> ``{(name, ((label, value), ...)): float}`` (labels sorted; comments skipped)."""
    samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = tuple(sorted(_LABEL.findall(match.group("labels") or "")))
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        samples[(match.group("name"), labels)] = value
    return samples


def scrape(metrics_url, timeout=10):
    """Parsed samples from ``<metrics_url>/metrics``, or None when the endpoint does not answer."""
    url = metrics_url.rstrip("/")
    url = url if url.endswith("/metrics") else f"{url}/metrics"
    try:
        response = requests.get(url, timeout=timeout)
        response.raise_for_status()
    except requests.RequestException:
        return None
    return parse(response.text)


def _matches(labels, model):
    labels = dict(labels)
    return labels.get("ModelName", labels.get("model_name")) == model


def total(samples, name, model):
    """Sum of one metric over every label set of the model (all versions, workers, hosts)."""
    return sum(v for (n, labels), v in samples.items() if n == name and _matches(labels, model))


def buckets(samples, name, model):
    """Cumulative histogram buckets ``[(upper bound, count), ...]`` summed over the model's label sets."""
    by_bound = {}
    for (metric, labels), value in samples.items():
        if metric == f"{name}_bucket" and _matches(labels, model):
            bound = float(dict(labels)["le"].replace("+Inf", "inf"))
            by_bound[bound] = by_bound.get(bound, 0.0) + value
    return sorted(by_bound.items())


def delta(before, after):
    """after - before for every sample of ``after`` (a series missing before counts from 0)."""
    before = before or {}
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def _ratio(numerator, denominator, scale=1.0, digits=3):
    return round(numerator / denominator * scale, digits) if denominator else None


def server_figures(before, after, model):
    """What the server says about one model during a run (the difference between two scrapes)."""
    if after is None:
        return {"available": False, "reason": "metrics endpoint did not answer"}
    change = delta(before, after)
    requests_served = total(change, "ts_inference_requests_total", model)
    figures = {
        "available": True,
        "requests": int(requests_served),
        # TorchServe's frontend sums: mean per request only (no percentiles exist server-side for these).
        "mean_queue_ms": _ratio(total(change, "ts_queue_latency_microseconds", model), requests_served, 1e-3),
        "mean_frontend_latency_ms": _ratio(
            total(change, "ts_inference_latency_microseconds", model), requests_served, 1e-3
        ),
    }
    for stage in HANDLER_STAGES:
        count = total(change, f"{stage}_count", model)
        stage_buckets = buckets(change, stage, model)
        key = stage.replace("Seconds", "").lower()
        p99 = bucket_upper_bound(0.99, stage_buckets)
        figures[f"{key}_batches"] = int(count)
        figures[f"{key}_mean_ms"] = _ratio(total(change, f"{stage}_sum", model), count, 1e3)
        # "p99 <= this": the histogram's bucket bound (buckets 5, 10, 25, 50, 75, 100, 250 ms, ...).
        figures[f"{key}_p99_ms_at_most"] = None if p99 is None else (p99 * 1e3 if math.isfinite(p99) else "inf")
    # Sizes are counters (handlers/core/metrics.py says why): their ratios are the means.
    batches = total(change, "Batches", model)
    figures["mean_batch_requests"] = _ratio(total(change, "BatchRequests", model), batches)
    figures["mean_batch_rows"] = _ratio(total(change, "BatchRows", model), batches)
    figures["mean_padding_ratio"] = _ratio(total(change, "PaddedTokens", model), total(change, "RealTokens", model))
    # Forward passes are bounded by handler.max_forward_tokens padded tokens (handlers/text/buckets.py).
    figures["mean_padded_tokens_per_pass"] = _ratio(
        total(change, "PaddedTokens", model), total(change, "ForwardPasses", model)
    )
    hits, misses = total(change, "CacheHits", model), total(change, "CacheMisses", model)
    figures["cache_hits"] = int(hits)
    figures["cache_misses"] = int(misses)
    figures["cache_hit_rate"] = _ratio(hits, hits + misses, digits=4)
    figures["request_errors"] = int(total(change, "RequestErrors", model))
    return figures
