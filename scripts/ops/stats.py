"""The one percentile definition of the project's own measurements, and the bucket bound for server histograms.

Nearest rank: the p-th percentile of n values is the ceil(p * n)-th smallest. It is always one of the measured
values (no interpolation between two requests that both happened), and p99 of 100 values is the 99th slowest.
Locust's own percentiles (loadtests/report.py) are Locust's: its buckets, read as it reports them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

REPORTED = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile (fraction in 0..1) of the values; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(
    values: Sequence[float], fractions: dict[str, float] = REPORTED, digits: int = 3
) -> dict[str, float | None]:
    """{"p50": ..., "p90": ..., "p99": ...} (rounded), plus "count" and "mean"."""
    figures: dict[str, float | None] = {
        "count": len(values),
        "mean": round(sum(values) / len(values), digits) if values else None,
    }
    for name, fraction in fractions.items():
        value = percentile(values, fraction)
        figures[name] = None if value is None else round(value, digits)
    return figures


def bucket_upper_bound(fraction: float, cumulative: Sequence[tuple[float, float]]) -> float | None:
    """Upper bound of the histogram bucket holding the fraction-th observation: "p99 <= X", from cumulative
    ``[(upper bound, count), ...]``. Interpolating inside a bucket (as Prometheus' histogram_quantile does) would
    invent precision the buckets do not have."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = fraction * cumulative[-1][1]
    for bound, count in cumulative:
        if count >= rank:
            return bound
    return cumulative[-1][0]
