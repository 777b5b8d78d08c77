"""What the shared embedding cache (L2) buys and costs: hit rates and capacity at the SLO with the worker cache only
(L1) vs L1 + L2, and the time L2 adds to a request when everything misses.

    python -m loadtests.cache_report [--slo-ms 250] [--step-seconds 10] [--max-steps 6] [--miss-requests 300]
    python -m loadtests.cache_report --only miss-cost      # the in-process part only (a minute)

1. Miss cost (in process, no HTTP): two minilm handlers loaded from the archive, worker cache off, one with the
   shared tier on (a real cache server on a free port) and one without; single unique texts (every lookup misses,
   every row is written), the two handlers interleaved request by request so machine noise falls on both alike.
   Prints p50/p99 of each and the p50 difference (the issue's target: <= 1 ms), and the MGET/SET round trips.
2. Capacity (real TorchServe, minilm with its 2 workers; one server per mode, both up in this run, searched in the
   order A B B A per mix): the capacity search of loadtests/capacity.py on the README's minilm mix (traffic "minilm":
   20 % repeats of a popular set) and on a repeat-heavy mix ("minilm-repeats": 80 %), with L1 only
   ($TS_SHARED_CACHE_URL empty) and with L1 + L2 (the cache server emptied before each search); hit rates from the
   Prometheus counters over each search.

Writes loadtests/reports/cache-<time>/cache_report.json and .md (and each search's own report folder); prints the
table. Exit codes: 0 measured, 1 a server failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import requests

from handlers.text.shared_cache import URL_ENV
from loadtests import capacity as capacity_search
from loadtests.prometheus import parse
from scripts import package
from scripts.ops.cache_server import CacheServer
from scripts.ops.server import exit_on_sigterm, free_ports, private_server

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "loadtests" / "reports"
MIXES = ("minilm", "minilm-repeats")
COUNTERS = ("CacheHits", "SharedCacheHits", "CacheMisses", "SharedCacheErrors", "SharedCacheTimeouts")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ----------------------------------------------------------------------------------------------- miss cost
def miss_cost(model_dir: Path, cache: CacheServer, requests_count: int, log=print) -> dict[str, Any]:
    """p50/p99 per single-text request with and without the shared tier when every lookup misses."""
    from scripts.ops.handler_loader import load_handler, record_metrics, set_requests

    plain, plain_context = load_handler(model_dir, "minilm", {"cache_size": 0, "shared_cache": {"url": ""}})
    shared, shared_context = load_handler(model_dir, "minilm", {"cache_size": 0, "shared_cache": {"url": cache.url}})
    recorder = record_metrics(shared_context)
    run = f"{time.time_ns()}"
    times: dict[str, list[float]] = {"L1 only": [], "L1 + L2": []}
    for number in range(requests_count + 10):
        pair = [("L1 only", plain, plain_context), ("L1 + L2", shared, shared_context)]
        for label, handler, context in pair if number % 2 == 0 else pair[::-1]:  # neither always goes first
            text = f"miss cost {run} {label} {number}: the quick brown fox jumps over the lazy dog"
            set_requests(context, [{"Content-Type": "application/json"}])
            started = time.perf_counter()
            [answer] = handler.handle([{"body": {"text": text}}], context)
            elapsed = (time.perf_counter() - started) * 1000
            if '"embedding"' not in answer:
                raise RuntimeError(f"{label}: no embedding in {answer[:200]}")
            if number >= 10:  # the first requests warm the allocator and the connection
                times[label].append(elapsed)
    round_trips = recorder.values("SharedCacheRoundTripMilliseconds")
    result = {
        "requests_each": requests_count,
        "backend": plain.describe().get("backend"),
        "precision": plain.precision,
        "p50_ms": {label: round(statistics.median(values), 3) for label, values in times.items()},
        "p99_ms": {label: round(percentile(values, 0.99), 3) for label, values in times.items()},
        "round_trip_ms_p50": round(statistics.median(round_trips), 3) if round_trips else None,
        "round_trips": len(round_trips),
        "shared_misses": sum(recorder.values("SharedCacheMisses")),
    }
    result["added_p50_ms"] = round(result["p50_ms"]["L1 + L2"] - result["p50_ms"]["L1 only"], 3)
    log(
        f"miss cost: p50 {result['p50_ms']['L1 only']} ms (L1 only) vs {result['p50_ms']['L1 + L2']} ms (L1 + L2): "
        f"+{result['added_p50_ms']} ms; round trip p50 {result['round_trip_ms_p50']} ms"
    )
    return result


# ----------------------------------------------------------------------------------------------- capacity
def counters(metrics_url: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for (name, labels), value in parse(requests.get(f"{metrics_url}/metrics", timeout=30).text).items():
        if name in COUNTERS and ("ModelName", "minilm") in labels:
            totals[name] = totals.get(name, 0.0) + value
    return totals


def hit_rates(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    change = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in COUNTERS}
    rows = change["CacheHits"] + change["SharedCacheHits"] + change["CacheMisses"]
    share = (lambda n: round(n / rows, 4)) if rows else (lambda n: None)
    return {
        "rows": int(rows),
        "l1_hit_rate": share(change["CacheHits"]),
        "l2_hit_rate": share(change["SharedCacheHits"]),
        "hit_rate": share(change["CacheHits"] + change["SharedCacheHits"]),
        "computed": int(change["CacheMisses"]),
        "l2_errors": int(change["SharedCacheErrors"] + change["SharedCacheTimeouts"]),
    }


def capacities(args, model_store: Path, cache: CacheServer, out_dir: Path, log=print) -> list[dict[str, Any]]:
    """Both servers up at once (the idle one costs memory, not CPU), searched in the order A B B A per mix, so a
    machine that gets busier or quieter during the run shifts both modes alike; each mode's figure is the mean of
    its two searches (both are kept in the report)."""
    modes = {"L1 only": "", "L1 + L2": cache.url}
    results = []
    with contextlib.ExitStack() as stack:
        servers = {}
        for mode, url in modes.items():
            log(f"--- {mode}: a TorchServe with minilm (2 workers), {URL_ENV}={url or '(empty)'}")
            name = f"cache-report-{'l2' if url else 'l1'}"
            servers[mode] = stack.enter_context(private_server(name, model_store, ["minilm"], env={URL_ENV: url}))
        for mix in MIXES:
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
            for round_number, mode in enumerate(("L1 only", "L1 + L2", "L1 + L2", "L1 only")[: args.rounds * 2]):
                ts = servers[mode]
                if modes[mode]:
                    cache.client().flushall()
                before = counters(ts.metrics_url)
                result = capacity_search.capacity(
                    ts.inference_url,
                    mix,
                    args.slo_ms,
                    out_dir=out_dir / f"{mix}-{round_number}-{'l1-l2' if modes[mode] else 'l1'}",
                    start_rate=args.start_rate,
                    step_seconds=args.step_seconds,
                    max_steps=args.max_steps,
                    tolerance=0.15,
                    warmup_seconds=5,
                    payload_seed=100 * round_number,
                    log=lambda *_: None,
                )
                run = {"capacity_rps": result["capacity_rate"], **hit_rates(before, counters(ts.metrics_url))}
                log(f"  {mix:15} {mode:8} capacity {run['capacity_rps']}/s at p99 <= {args.slo_ms:g} ms; {run}")
                runs[mode].append(run)
            for mode, mode_runs in runs.items():
                rates = [run["capacity_rps"] or 0.0 for run in mode_runs]
                rows = sum(run["rows"] for run in mode_runs)
                summed = {key: sum(run[key] for run in mode_runs) for key in ("computed", "rows")}
                results.append(
                    {
                        "mode": mode,
                        "mix": mix,
                        "capacity_rps": round(statistics.mean(rates), 2),
                        "capacity_runs": rates,
                        "rows": rows,
                        "computed": summed["computed"],
                        "hit_rate": round(1 - summed["computed"] / rows, 4) if rows else None,
                        "l2_hit_rate": round(
                            sum((run["l2_hit_rate"] or 0) * run["rows"] for run in mode_runs) / rows, 4
                        )
                        if rows
                        else None,
                        "l2_errors": sum(run["l2_errors"] for run in mode_runs),
                    }
                )
    return results


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Shared embedding cache: {report['started']} on {report['cpu']}", ""]
    cost = report.get("miss_cost")
    if cost:
        lines += [
            f"Miss cost ({cost['requests_each']} single unique texts each, {cost['backend']}/{cost['precision']}): "
            f"p50 {cost['p50_ms']['L1 only']} ms L1 only, {cost['p50_ms']['L1 + L2']} ms L1 + L2 "
            f"(+{cost['added_p50_ms']} ms); round trip p50 {cost['round_trip_ms_p50']} ms.",
            "",
        ]
    if report.get("capacity"):
        lines += [
            f"| mix | mode | capacity at p99 <= {report['slo_ms']:g} ms (each search) | hit rate | of which L2 "
            "| rows computed |",
            "|---|---|---|---|---|---|",
        ]
        for row in report["capacity"]:
            searches = ", ".join(f"{rate:g}" for rate in row["capacity_runs"])
            lines.append(
                f"| {row['mix']} | {row['mode']} | {row['capacity_rps']}/s ({searches}) "
                f"| {row['hit_rate']} | {row['l2_hit_rate']} "
                f"| {row['computed']} of {row['rows']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.cache_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--slo-ms", type=float, default=250.0)
    parser.add_argument("--start-rate", type=float, default=8.0)
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--miss-requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, choices=(1, 2), default=2, help="2: A B B A per mix; 1: A B")
    parser.add_argument("--only", choices=("miss-cost", "capacity"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.out or REPORTS / f"cache-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    store = REPO / "model_store"
    package.build("minilm", store, log=lambda *_: None)
    report: dict[str, Any] = {
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_name(),
        "command": "python -m loadtests.cache_report " + " ".join(argv if argv is not None else sys.argv[1:]),
        "slo_ms": args.slo_ms,
    }
    with tempfile.TemporaryDirectory(prefix="cache-report-") as scratch:
        cache = CacheServer(free_ports(1)[0], Path(scratch) / "cache")
        cache.start()
        try:
            if args.only in (None, "miss-cost"):
                model_dir = Path(scratch) / "minilm"
                with zipfile.ZipFile(store / "minilm.mar") as archive:
                    archive.extractall(model_dir)
                report["miss_cost"] = miss_cost(model_dir, cache, args.miss_requests)
            if args.only in (None, "capacity"):
                report["capacity"] = capacities(args, store, cache, out_dir)
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        finally:
            cache.stop()
    (out_dir / "cache_report.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = render_markdown(report)
    (out_dir / "cache_report.md").write_text(markdown)
    print(markdown + f"\nwritten to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
