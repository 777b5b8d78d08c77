"""Batch-config tuner: capacity at the SLO for each batchSize x maxBatchDelay (x workers) on a private TorchServe.

    python -m loadtests.tune --model minilm --slo-ms 100 [--batch-sizes 1,8,16,32] [--delays 0,1,2,5,10] [--workers 1,2]

The default grid is 32 capacity searches (batchSize 1 is measured once per worker count: it never waits, so its delay
does not matter) and takes about 2-4 h on a 2-core [AVX2 EPYC] VM (each search 4-7 min with the default 20 s steps);
narrow it with --batch-sizes/--delays/--workers, or shorten the steps (--step-seconds 12: ~3 min a search).
maxBatchDelay 0 means no wait: a worker takes what is already queued, up to batchSize, and runs it at once.

For every grid point the model is re-registered on a private TorchServe (free loopback ports, its own run folder;
nothing else is touched) through scripts/ops/management.py: unregister, register with batch_size, max_batch_delay
(always sent, 0 included: a value the API does not get is taken from the archive) and initial_workers, scale to
min = max = workers (the archive's min/maxWorkers would otherwise override initial_workers), and the values are read
back before measuring. A model-config.yaml cannot say 0: TorchServe 0.12 reads maxBatchDelay 0 there as unset and
waits its default 100 ms, so the report's snippet says 1 for a 0 (loadtests/tune_report.py).

Threads are set deliberately: each worker count gets an archive variant whose model-config.yaml says
``handler.threads = cores // workers`` (and min/maxWorkers = workers), so N workers never run N x cores torch threads
(oversubscribed CPUs collapse throughput; the load generator and TorchServe's frontend need CPU too).

Writes loadtests/reports/tune-<model>-<time>/: tune.json, tune.md (table, recommendation, model-config.yaml snippet),
heatmap.png (capacity per batchSize x maxBatchDelay, one panel per worker count) and each point's capacity report.
Recommends the point with the highest capacity at the SLO, and the one with the lowest p99 at --start-rate.
This module runs the sweep and decides; the archive variants are loadtests/variants.py, the report
loadtests/tune_report.py. Exit codes: 0 swept, 1 the server or a run failed, 2 bad arguments.
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

from loadtests import capacity as capacity_search
from loadtests import preflight, tune_report
from loadtests import run as loadtest
from loadtests.variants import threads_for, variant_archive
from scripts.ops import machine
from scripts.ops.management import ManagementClient, ManagementError
from scripts.ops.server import exit_on_sigterm, private_server

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "loadtests" / "reports"
DEFAULT_BATCH_SIZES = "1,8,16,32"
DEFAULT_DELAYS = "0,1,2,5,10"  # ms; 0 = no wait


def register_point(
    client: ManagementClient, model, archive_name, batch_size, max_batch_delay, workers, threads=None, timeout=900
):
    """(Re-)register `model` from an archive variant with this batching and worker count; check what the server
    reports back (and the handler's threads); returns the description. RuntimeError when it does not match."""
    try:
        if client.registered(model):
            for version in client.versions(model):
                client.unregister(model, version["modelVersion"], drain=False, timeout=120)
        client.register(
            archive_name,
            synchronous=True,
            timeout=timeout,
            model_name=model,
            batch_size=batch_size,
            max_batch_delay=max_batch_delay,
            initial_workers=workers,
        )
        # The archive's min/maxWorkers win over initial_workers: scale explicitly, then read everything back.
        client.scale(model, None, workers, workers, timeout)
        described = client.wait_ready(model, timeout=timeout)
        actual = (described.get("batchSize"), described.get("maxBatchDelay"), len(described.get("workers", [])))
        chosen = client.handler_choices(model) if threads is not None else {}
    except ManagementError as error:
        raise RuntimeError(
            f"registering {archive_name} (batch {batch_size}, delay {max_batch_delay} ms, {workers} workers): {error}"
        ) from None
    if actual != (batch_size, max_batch_delay, workers):
        raise RuntimeError(
            f"{model} registered as batch {actual[0]}, delay {actual[1]} ms, {actual[2]} workers; "
            f"wanted {batch_size}, {max_batch_delay} ms, {workers}"
        )
    # Our handlers report their torch threads in the customized describe; a mismatch means oversubscription.
    if chosen.get("threads") not in (None, threads):
        raise RuntimeError(f"{model} workers run {chosen['threads']} torch threads, wanted {threads}")
    return described


def recommend(points):
    """Highest capacity at the SLO (ties: lower p99 at capacity), and lowest p99 (then p50) at the start rate."""
    measured = [p for p in points if p.get("capacity_rate") is not None]
    best_throughput = max(
        measured, key=lambda p: (p["capacity_rate"], -(p.get("p99_at_capacity_ms") or 0)), default=None
    )
    low_load = [p for p in points if p.get("low_load_p99_ms") is not None]
    best_latency = min(low_load, key=lambda p: (p["low_load_p99_ms"], p.get("low_load_p50_ms") or 0), default=None)
    return {"throughput": best_throughput, "latency": best_latency}


def parse_list(text, kind=int):
    try:
        values = [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return values


def default_workers():
    return "1,2" if machine.cores() >= 2 else "1"


def point_figures(found):
    """A grid point's figures from its capacity search."""
    at_capacity, lowest = found["at_capacity"], found["at_start_rate"]
    figures = dict(
        capacity_rate=found["capacity_rate"],
        stopped_because=found["stopped_because"],
        p99_at_capacity_ms=at_capacity["p99_ms"] if at_capacity else None,
        p50_at_capacity_ms=at_capacity["p50_ms"] if at_capacity else None,
        low_load_rate=lowest["rate"] if lowest else None,
        low_load_p50_ms=lowest["p50_ms"] if lowest else None,
        low_load_p99_ms=lowest["p99_ms"] if lowest else None,
        report_dir=found["report_dir"],
    )
    if at_capacity and at_capacity.get("report_dir"):
        summary_file = Path(at_capacity["report_dir"]) / "summary.json"
        if summary_file.exists():
            server_side = json.loads(summary_file.read_text()).get("server") or {}
            figures["mean_batch_at_capacity"] = server_side.get("mean_batch_requests")
    return figures


def batching_points(batch_sizes, delays):
    """(batchSize, maxBatchDelay) pairs to measure. TorchServe waits maxBatchDelay only for a batch's 2nd..Nth
    request, so batchSize 1 behaves the same at every delay: it is measured once, at the smallest delay."""
    points = []
    for batch_size in batch_sizes:
        for delay in [min(delays)] if batch_size == 1 else delays:
            points.append((batch_size, delay))
    return points


def build_variants(model, source, worker_counts, thread_counts, batch_sizes, delays):
    """The archive variants (one per workers x threads) in build/tune/, and the grid of points to measure."""
    store = REPO / "build" / "tune" / f"{model}-store"
    plans = []
    for workers in worker_counts:
        for threads in thread_counts or [threads_for(workers)]:
            name = f"{model}-w{workers}-t{threads}.mar"
            variant_archive(source, store / name, {"minWorkers": workers, "maxWorkers": workers}, {"threads": threads})
            plans += [(workers, threads, name, b, d) for b, d in batching_points(batch_sizes, delays)]
    return store, plans


def sweep(model, slo_ms, batch_sizes, delays, worker_counts, thread_counts, out_dir, search, model_store, log=print):
    """Run the whole grid on one private TorchServe; returns the result dict."""
    source = Path(model_store) / f"{model}.mar"
    if not source.exists():
        raise RuntimeError(f"{source} not found: build it first (make mar)")
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    store, plans = build_variants(model, source, worker_counts, thread_counts, batch_sizes, delays)
    log(f"tuning {model}: {len(plans)} configurations, p99 <= {slo_ms:g} ms -> {out_dir}")
    points = []
    with private_server(f"tune-{model}", store, [], keep_logs_in=Path(out_dir) / "server-logs") as server:
        client = server.management()
        for number, (workers, threads, archive, batch_size, delay) in enumerate(plans, 1):
            point = {"workers": workers, "threads": threads, "batch_size": batch_size, "max_batch_delay": delay}
            log(
                f"[{number}/{len(plans)}] batchSize {batch_size}, maxBatchDelay {delay} ms, {workers} worker(s) x "
                f"{threads} thread(s)"
            )
            try:
                register_point(client, model, archive, batch_size, delay, workers, threads)
                preflight.wait_for_model(server.inference_url, model, timeout=120)
                folder = Path(out_dir) / f"w{workers}-t{threads}-b{batch_size}-d{delay}"
                found = capacity_search.capacity(
                    server.inference_url, model, slo_ms, folder, server.metrics_url, log=log, **search
                )
            except RuntimeError as error:
                log(f"  failed: {error}")
                points.append({**point, "error": str(error)[:300], "capacity_rate": None})
                continue
            points.append({**point, **point_figures(found)})
            log(f"  -> capacity {points[-1]['capacity_rate']}/s")
    return {
        "model": model,
        "slo_ms": slo_ms,
        "cores": machine.cores(),
        "machine": machine.describe(),
        "started_at": started_at,
        "points": points,
        "start_rate": search["start_rate"],
        "step_seconds": search["step_seconds"],
        "min_requests": search.get("min_requests", 0),
        "recommendation": recommend(points),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        required=True,
        help=f"{', '.join(sorted(loadtest.MODELS))}, or the name of an embedding model packaged from its folder",
    )
    parser.add_argument(
        "--batch-sizes",
        type=parse_list,
        default=parse_list(DEFAULT_BATCH_SIZES),
        help=f"batchSize values ({DEFAULT_BATCH_SIZES})",
    )
    parser.add_argument(
        "--delays",
        type=parse_list,
        default=parse_list(DEFAULT_DELAYS),
        help=f"maxBatchDelay values in ms ({DEFAULT_DELAYS}; 0 = no wait)",
    )
    parser.add_argument(
        "--workers",
        type=parse_list,
        default=parse_list(default_workers()),
        help="worker counts (default 1,2 on >= 2 cores)",
    )
    parser.add_argument(
        "--threads", type=parse_list, help="torch threads per worker to sweep (default cores // workers)"
    )
    parser.add_argument("--model-store", default=str(REPO / "model_store"), help="where <model>.mar is")
    capacity_search.add_search_arguments(parser)
    parser.add_argument("--out", help="report folder (default loadtests/reports/tune-<model>-<time>)")
    args = parser.parse_args(argv)
    if any(b < 1 for b in args.batch_sizes) or any(w < 1 for w in args.workers):
        parser.error("batch sizes and worker counts must be >= 1")

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out or REPORTS / f"tune-{args.model}-{stamp}")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = sweep(
            args.model,
            args.slo_ms,
            args.batch_sizes,
            args.delays,
            args.workers,
            args.threads,
            out_dir,
            capacity_search.search_kwargs(args),
            args.model_store,
        )
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    (out_dir / "tune.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = tune_report.render_markdown(result)
    (out_dir / "tune.md").write_text(markdown)
    tune_report.plot_heatmap(
        result["points"], out_dir / "heatmap.png", f"{args.model}: requests/s at p99 <= {args.slo_ms:g} ms"
    )
    print(markdown[markdown.index("## Recommendation") :])
    print(f"report: {out_dir}/tune.md")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
