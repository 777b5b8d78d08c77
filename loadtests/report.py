"""Turn Locust's statistics into the run's summary numbers, a Markdown summary and a plot.

Percentiles are Locust's own: ``stats.total.get_response_time_percentile(q)``, written by the locustfile when Locust
quits (:func:`stats_snapshot`, ``final_stats.json``), or the "Aggregated" row of its ``_stats.csv`` (the same numbers,
but Locust rewrites that file only once a second and not after the users stop, so the CSV can miss the last second
of a run; the summary uses the snapshot when there is one). Locust keeps response times in buckets: exact below
100 ms, rounded to 10 ms up to 1 s and to 100 ms above, so every percentile is in whole milliseconds. The mean is
reported too, but capacity is judged on p99 and throughput, never on the mean.
"""

import csv
import math
from pathlib import Path

PERCENTILE_COLUMNS = {
    "p50_ms": "50%",
    "p66_ms": "66%",
    "p75_ms": "75%",
    "p90_ms": "90%",
    "p95_ms": "95%",
    "p99_ms": "99%",
    "p999_ms": "99.9%",
    "p9999_ms": "99.99%",
    "max_ms": "100%",
}
PERCENTILES = {
    "p50_ms": 0.5,
    "p66_ms": 0.66,
    "p75_ms": 0.75,
    "p90_ms": 0.9,
    "p95_ms": 0.95,
    "p99_ms": 0.99,
    "p999_ms": 0.999,
    "p9999_ms": 0.9999,
    "max_ms": 1.0,
}


def stats_snapshot(stats):
    """A Locust ``RequestStats`` (after the run) -> the same numbers as :func:`read_stats`, plus the failures."""
    total = stats.total
    requests = total.num_requests
    summary = {
        "requests": requests,
        "failures": total.num_failures,
        "failure_rate": round(total.num_failures / requests, 6) if requests else None,
        "rps": round(total.total_rps, 3),
        "mean_ms": round(total.avg_response_time, 2) if requests else None,
    }
    for key, q in PERCENTILES.items():
        summary[key] = int(total.get_response_time_percentile(q)) if requests else None
    summary["endpoints"] = {entry.name: entry.num_requests for entry in stats.entries.values()}
    summary["failure_reasons"] = sorted(
        (
            {"name": error.name, "error": str(error.error), "occurrences": error.occurrences}
            for error in stats.errors.values()
        ),
        key=lambda row: -row["occurrences"],
    )
    return summary


def _number(text):
    """A Locust CSV cell as a float; 'N/A' (no samples) and blanks as None."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def read_stats(stats_csv):
    """The Aggregated row of ``<prefix>_stats.csv`` -> the run's headline numbers (times in ms)."""
    with open(stats_csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    total = next((row for row in rows if row.get("Name") == "Aggregated"), None)
    if total is None:
        raise ValueError(f"{stats_csv}: no 'Aggregated' row (did Locust run?)")
    requests = int(_number(total["Request Count"]) or 0)
    failures = int(_number(total["Failure Count"]) or 0)
    summary = {
        "requests": requests,
        "failures": failures,
        "failure_rate": round(failures / requests, 6) if requests else None,
        "rps": round(_number(total["Requests/s"]) or 0.0, 3),
        "mean_ms": round(_number(total["Average Response Time"]) or 0.0, 2) if requests else None,
    }
    for key, column in PERCENTILE_COLUMNS.items():
        value = _number(total.get(column)) if requests else None
        summary[key] = int(value) if value is not None else None
    summary["endpoints"] = {
        row["Name"]: int(_number(row["Request Count"]) or 0) for row in rows if row.get("Name") != "Aggregated"
    }
    return summary


def read_failures(failures_csv):
    """``<prefix>_failures.csv`` -> [{"name", "error", "occurrences"}], most frequent first."""
    path = Path(failures_csv)
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        rows = [
            {"name": row["Name"], "error": row["Error"], "occurrences": int(row["Occurrences"])}
            for row in csv.DictReader(handle)
        ]
    return sorted(rows, key=lambda row: -row["occurrences"])


def read_history(history_csv):
    """The Aggregated rows of ``<prefix>_stats_history.csv``: per second, users, rps and the last ~10 s percentiles."""
    path = Path(history_csv)
    if not path.exists():
        return []
    series = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("Name") != "Aggregated":
                continue
            series.append(
                {
                    "t": int(row["Timestamp"]),
                    "users": int(_number(row["User Count"]) or 0),
                    "rps": _number(row["Requests/s"]) or 0.0,
                    "fails_per_s": _number(row["Failures/s"]) or 0.0,
                    # 0 means "no samples in the window yet" here (an HTTP round trip is never 0 ms at this resolution).
                    "p50_ms": _number(row.get("50%")) or None,
                    "p95_ms": _number(row.get("95%")) or None,
                    "p99_ms": _number(row.get("99%")) or None,
                    "total_requests": int(_number(row.get("Total Request Count")) or 0),
                    "total_failures": int(_number(row.get("Total Failure Count")) or 0),
                }
            )
    if series:
        start = series[0]["t"]
        previous = None
        for point in series:
            # Completed requests per second from the cumulative count (Locust's own "current" rps lags by seconds).
            if previous is None or point["t"] <= previous["t"]:
                point["rps_1s"] = point["fails_1s"] = 0.0
            else:
                seconds = point["t"] - previous["t"]
                point["rps_1s"] = (point["total_requests"] - previous["total_requests"]) / seconds
                point["fails_1s"] = (point["total_failures"] - previous["total_failures"]) / seconds
            previous = dict(point)
        for point in series:
            point["t"] -= start
    return series


def plot_history(series, png_path, title):
    """Latency percentiles (last ~10 s window) and throughput over time, one PNG; returns False if nothing to plot."""
    if not series:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = [point["t"] for point in series]
    figure, (latency, throughput) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for key, label in (("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99")):
        latency.plot(seconds, [point[key] if point[key] is not None else float("nan") for point in series], label=label)
    latency.set_ylabel("response time (ms)\n(last ~10 s window)")
    latency.legend(loc="upper left")
    latency.grid(alpha=0.3)
    latency.set_title(title)
    throughput.plot(seconds, [point["rps_1s"] for point in series], label="completed requests/s", color="tab:green")
    throughput.plot(seconds, [point["fails_1s"] for point in series], label="failures/s", color="tab:red")
    throughput.set_ylabel("per second")
    throughput.set_xlabel("seconds since start")
    throughput.grid(alpha=0.3)
    users = throughput.twinx()
    users.step(seconds, [point["users"] for point in series], where="post", color="tab:gray", alpha=0.6, label="users")
    users.set_ylabel("users", color="tab:gray")
    lines = throughput.get_legend_handles_labels()
    extra = users.get_legend_handles_labels()
    throughput.legend(lines[0] + extra[0], lines[1] + extra[1], loc="upper left")
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return True


def _cell(value, suffix=""):
    return "–" if value is None else f"{value}{suffix}"


def markdown_table(columns, rows):
    """Lines of a Markdown table. columns: [(title, "l" or "r")]; rows: lists of cells (None shows as –)."""
    lines = [
        "| " + " | ".join(title for title, _ in columns) + " |",
        "|" + "|".join("---:" if align == "r" else "---" for _, align in columns) + "|",
    ]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return lines


def render_markdown(summary):
    """summary.md: headline numbers, generator health, server-side figures, failures."""
    lines = [
        f"# Load test: {summary['model']} / {summary['profile']}",
        "",
        f"- started {summary['started_at']}, {summary['duration_s']} s against {summary['host']}",
        f"- users: {summary.get('users')}, Locust workers: {summary.get('workers') or 'none (one process)'}",
        f"- command: `{summary['command']}`",
        "",
        *markdown_table(
            [(title, "r") for title in ("requests", "failures", "req/s", "p50", "p95", "p99", "p99.9", "max", "mean")],
            [
                [
                    summary["requests"],
                    summary["failures"],
                    summary["rps"],
                    *(
                        _cell(summary[key], " ms")
                        for key in ("p50_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms", "mean_ms")
                    ),
                ]
            ],
        ),
        "",
        "Percentiles are Locust's (whole ms: exact below 100 ms, 10 ms steps to 1 s, 100 ms steps to 10 s). "
        "Judge capacity on p99 and throughput, not on the mean.",
    ]
    open_loop = summary.get("open_loop")
    if open_loop:
        lines += [
            "",
            "## Open loop",
            "",
            f"- target rate {open_loop['target_rate']}/s, achieved start rate {open_loop['achieved_rate']}/s "
            f"({_cell(open_loop.get('achieved_share'))} of target), completed {summary['rps']}/s",
            f"- started late (> {summary.get('late_ms', 10)} ms behind schedule): {open_loop['late_starts']}, "
            f"not started (in-flight cap): {open_loop['not_started']}, "
            f"worst start lag {open_loop['max_start_lag_ms']} ms",
        ]
    generator = summary.get("generator") or {}
    if generator:
        lines += [
            "",
            "## Load generator",
            "",
            f"- Locust used {generator.get('cpu_seconds')} CPU-s = {_cell(generator.get('cpu_share'))} of the "
            f"machine's {generator.get('cores')} cores "
            f"(the whole machine was {_cell(generator.get('machine_busy_share'))} busy)",
        ]
    server = summary.get("server") or {}
    if server.get("available"):
        lines += ["", "## Server side (TorchServe metrics, difference of two scrapes)", ""]
        lines += markdown_table(
            [("figure", "l"), ("value", "r")], [[key, value] for key, value in server.items() if key != "available"]
        )
    elif server:
        lines += ["", f"Server-side figures unavailable: {server.get('reason')}"]
    failures = summary.get("failure_reasons") or []
    if failures:
        lines += ["", "## Failures", ""]
        lines += markdown_table(
            [("occurrences", "r"), ("error", "l")], [[row["occurrences"], row["error"][:160]] for row in failures[:10]]
        )
    lines.append("")
    return "\n".join(lines)
