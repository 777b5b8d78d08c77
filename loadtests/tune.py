"""Batch-config tuner: capacity at the SLO for each batchSize x maxBatchDelay (x workers) on a private TorchServe.

    python -m loadtests.tune --model minilm --slo-ms 100 [--batch-sizes 1,8,16,32] [--delays 2,5,10] [--workers 1,2]

For every grid point the model is re-registered through the management API of a private TorchServe (free loopback
ports, its own run folder; nothing else is touched): DELETE, then POST /models?url=...&batch_size=&max_batch_delay=
&initial_workers=&synchronous=true, then PUT /models/<m>?min_worker=&max_worker= (the archive's min/maxWorkers would
otherwise override initial_workers), and the values are read back with GET /models/<m> before measuring.

Threads are set deliberately: each worker count gets an archive variant whose model-config.yaml says
``handler.threads = cores // workers`` (and min/maxWorkers = workers), so N workers never run N x cores torch threads
(oversubscribed CPUs collapse throughput; the load generator and TorchServe's frontend need CPU too).

Writes loadtests/reports/tune-<model>-<time>/: tune.json, tune.md (table, recommendation, model-config.yaml snippet),
heatmap.png (capacity per batchSize x maxBatchDelay, one panel per worker count) and each point's capacity report.
Recommends the point with the highest capacity at the SLO, and the one with the lowest p99 at --start-rate.
Exit codes: 0 swept, 1 the server or a run failed, 2 bad arguments.
"""

import argparse
import datetime
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from loadtests import capacity as capacity_search  # noqa: E402
from loadtests import run as loadtest  # noqa: E402
from loadtests import servers  # noqa: E402

REPORTS = REPO / "loadtests" / "reports"


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_for(workers, available=None):
    """torch threads per worker so that all workers together use each core once."""
    return max(1, (available or cores()) // max(1, workers))


def variant_archive(source, destination, config_overrides, handler_overrides):
    """Copy a .mar, changing keys of its model-config.yaml (top level and ``handler:``); returns the new config."""
    with zipfile.ZipFile(source) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
        config_name = manifest["model"].get("configFile")
        if not config_name:
            raise RuntimeError(f"{source} has no model-config.yaml (MANIFEST configFile); cannot set threads")
        config = yaml.safe_load(archive.read(config_name)) or {}
        config.update(config_overrides)
        config["handler"] = {**(config.get("handler") or {}), **handler_overrides}
        Path(destination).parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(destination, "w", compression=zipfile.ZIP_STORED) as variant:
            for item in archive.infolist():
                data = archive.read(item.filename)
                if item.filename == config_name:
                    data = yaml.safe_dump(config, sort_keys=False).encode()
                variant.writestr(item, data)
    return config


class ModelRegistration:
    """Register / re-register one model on a TorchServe through its management API."""

    def __init__(self, management_url, model):
        self.url = management_url.rstrip("/")
        self.model = model

    def registered(self):
        response = requests.get(f"{self.url}/models/{self.model}", timeout=30)
        return response.status_code == 200

    def unregister(self):
        if not self.registered():
            return
        for version in requests.get(f"{self.url}/models/{self.model}/all", timeout=30).json():
            response = requests.delete(f"{self.url}/models/{self.model}/{version['modelVersion']}", timeout=120)
            if response.status_code not in (200, 404):
                raise RuntimeError(f"DELETE {self.model}/{version['modelVersion']}: {response.status_code} "
                                   f"{response.text[:300]}")

    def register(self, archive_name, batch_size, max_batch_delay, workers, threads=None, timeout=900):
        self.unregister()
        response = requests.post(f"{self.url}/models", params={
            "url": archive_name, "model_name": self.model, "batch_size": batch_size,
            "max_batch_delay": max_batch_delay, "initial_workers": workers, "synchronous": "true",
        }, timeout=timeout)
        if response.status_code != 200:
            raise RuntimeError(f"registering {archive_name} (batch {batch_size}, delay {max_batch_delay} ms, "
                               f"{workers} workers): {response.status_code} {response.text[:500]}")
        # The archive's min/maxWorkers win over initial_workers: scale explicitly, then read everything back.
        response = requests.put(f"{self.url}/models/{self.model}", params={
            "min_worker": workers, "max_worker": workers, "synchronous": "true"}, timeout=timeout)
        if response.status_code not in (200, 202):
            raise RuntimeError(f"scaling {self.model} to {workers} workers: {response.status_code} "
                               f"{response.text[:300]}")
        described = self.wait_for(batch_size, max_batch_delay, workers, timeout)
        if threads is not None:
            self.check_threads(threads)
        return described

    def check_threads(self, threads):
        """Our handlers report their torch threads in the customized describe; a mismatch means oversubscription."""
        response = requests.get(f"{self.url}/models/{self.model}", params={"customized": "true"}, timeout=60)
        try:
            custom = response.json()[0].get("customizedMetadata") or {}
            custom = json.loads(custom) if isinstance(custom, str) else custom
        except (ValueError, IndexError, KeyError, AttributeError):
            return  # a handler without the customized describe: nothing to check
        if custom.get("threads") not in (None, threads):
            raise RuntimeError(f"{self.model} workers run {custom['threads']} torch threads, wanted {threads}")

    def wait_for(self, batch_size, max_batch_delay, workers, timeout):
        deadline = time.time() + timeout
        described = {}
        while time.time() < deadline:
            described = requests.get(f"{self.url}/models/{self.model}", timeout=30).json()[0]
            ready = [w for w in described.get("workers", []) if w.get("status") == "READY"]
            if len(ready) >= workers:
                break
            time.sleep(1)
        else:
            raise RuntimeError(f"{self.model}: {workers} READY workers not reached in {timeout}s: {described}")
        actual = (described.get("batchSize"), described.get("maxBatchDelay"), len(described.get("workers", [])))
        if actual != (batch_size, max_batch_delay, workers):
            raise RuntimeError(f"{self.model} registered as batch {actual[0]}, delay {actual[1]} ms, {actual[2]} "
                               f"workers; wanted {batch_size}, {max_batch_delay} ms, {workers}")
        return described


def recommend(points):
    """Highest capacity at the SLO (ties: lower p99 at capacity), and lowest p99 (then p50) at the start rate."""
    measured = [p for p in points if p.get("capacity_rate") is not None]
    best_throughput = max(measured, key=lambda p: (p["capacity_rate"], -(p.get("p99_at_capacity_ms") or 0)),
                          default=None)
    low_load = [p for p in points if p.get("low_load_p99_ms") is not None]
    best_latency = min(low_load, key=lambda p: (p["low_load_p99_ms"], p.get("low_load_p50_ms") or 0), default=None)
    return {"throughput": best_throughput, "latency": best_latency}


def plot_heatmap(points, png_path, title):
    """Capacity (requests/s at the SLO) per batchSize x maxBatchDelay, one panel per (workers, threads)."""
    if not points:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(p["workers"], p["threads"]) for p in points})
    batch_sizes = sorted({p["batch_size"] for p in points})
    delays = sorted({p["max_batch_delay"] for p in points})
    figure, axes = plt.subplots(1, len(groups), figsize=(4.8 * len(groups) + 1, 4.2), squeeze=False)
    top = max([p["capacity_rate"] or 0 for p in points] + [1])
    for axis, (workers, threads) in zip(axes[0], groups):
        grid = [[float("nan")] * len(batch_sizes) for _ in delays]
        for p in points:
            if (p["workers"], p["threads"]) == (workers, threads):
                grid[delays.index(p["max_batch_delay"])][batch_sizes.index(p["batch_size"])] = p["capacity_rate"] or 0
        image = axis.imshow(grid, cmap="viridis", vmin=0, vmax=top, origin="lower", aspect="auto")
        for row, delay in enumerate(delays):
            for column, _ in enumerate(batch_sizes):
                value = grid[row][column]
                if value == value:  # not NaN
                    axis.text(column, row, f"{value:.0f}", ha="center", va="center",
                              color="white" if value < top * 0.6 else "black")
        axis.set_xticks(range(len(batch_sizes)), [str(b) for b in batch_sizes])
        axis.set_yticks(range(len(delays)), [str(d) for d in delays])
        axis.set_xlabel("batchSize")
        axis.set_ylabel("maxBatchDelay (ms)")
        axis.set_title(f"{workers} worker(s) x {threads} thread(s)")
    figure.colorbar(image, ax=axes[0].tolist(), label="requests/s at the SLO")
    figure.suptitle(title)
    figure.savefig(png_path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return True


def render_markdown(result):
    lines = [
        f"# Batch-config sweep: {result['model']}, p99 <= {result['slo_ms']:g} ms",
        "",
        f"{result['cores']} cores; threads per worker = cores // workers unless --threads was given; "
        f"{result['step_seconds']:g} s per capacity step (at least {result.get('min_requests', 0)} requests); "
        f"started {result['started_at']}.",
        "",
        "| workers | threads | batchSize | maxBatchDelay ms | capacity /s | p99 at capacity | p50 / p99 at "
        f"{result['start_rate']:g}/s | mean batch at capacity | stopped because |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for p in sorted(result["points"], key=lambda p: (p["workers"], p["threads"], p["batch_size"],
                                                     p["max_batch_delay"])):
        lines.append(f"| {p['workers']} | {p['threads']} | {p['batch_size']} | {p['max_batch_delay']} | "
                     f"{p['capacity_rate'] if p.get('capacity_rate') is not None else p.get('error', 'none')} | "
                     f"{p.get('p99_at_capacity_ms')} | {p.get('low_load_p50_ms')} / {p.get('low_load_p99_ms')} | "
                     f"{p.get('mean_batch_at_capacity')} | {p.get('stopped_because', '')} |")
    best = result["recommendation"]
    lines += ["", "## Recommendation", ""]
    throughput = best.get("throughput")
    if throughput:
        lines += [
            f"- **Highest throughput at the SLO**: batchSize {throughput['batch_size']}, maxBatchDelay "
            f"{throughput['max_batch_delay']} ms, {throughput['workers']} worker(s) x {throughput['threads']} "
            f"thread(s): {throughput['capacity_rate']} requests/s.",
            "",
            "  model-config.yaml:",
            "",
            "  ```yaml",
            f"  minWorkers: {throughput['workers']}",
            f"  maxWorkers: {throughput['workers']}",
            f"  batchSize: {throughput['batch_size']}",
            f"  maxBatchDelay: {throughput['max_batch_delay']}",
            "  handler:",
            f"    threads: {throughput['threads']}",
            "  ```",
        ]
    latency = best.get("latency")
    if latency:
        lines.append(f"- **Lowest latency at low load** ({result['start_rate']:g}/s): batchSize "
                     f"{latency['batch_size']}, maxBatchDelay {latency['max_batch_delay']} ms, {latency['workers']} "
                     f"worker(s) x {latency['threads']} thread(s): p50 {latency['low_load_p50_ms']} ms, "
                     f"p99 {latency['low_load_p99_ms']} ms.")
    if not throughput and not latency:
        lines.append("- nothing passed; see the table")
    lines.append("")
    return "\n".join(lines)


def parse_list(text, kind=int):
    try:
        values = [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return values


def default_workers():
    return "1,2" if cores() >= 2 else "1"


def sweep(model, slo_ms, batch_sizes, delays, worker_counts, thread_counts, out_dir, search, model_store, log=print):
    """Run the whole grid on one private TorchServe; returns the result dict (also written to out_dir)."""
    source = Path(model_store) / f"{model}.mar"
    if not source.exists():
        raise RuntimeError(f"{source} not found: build it first (make mar)")
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    store = REPO / "build" / "tune" / f"{model}-store"
    plans = []
    for workers in worker_counts:
        for threads in (thread_counts or [threads_for(workers)]):
            name = f"{model}-w{workers}-t{threads}.mar"
            variant_archive(source, store / name, {"minWorkers": workers, "maxWorkers": workers},
                            {"threads": threads})
            plans += [(workers, threads, name, b, d) for b in batch_sizes for d in delays]
    log(f"tuning {model}: {len(plans)} configurations, p99 <= {slo_ms:g} ms -> {out_dir}")
    points = []
    model_traffic = loadtest.traffic(model)
    with servers.private_torchserve(f"tune-{model}", store, [], keep_logs_in=Path(out_dir) / "server-logs") as server:
        registration = ModelRegistration(server.management_url, model)
        for number, (workers, threads, archive, batch_size, delay) in enumerate(plans, 1):
            point = {"workers": workers, "threads": threads, "batch_size": batch_size, "max_batch_delay": delay}
            log(f"[{number}/{len(plans)}] batchSize {batch_size}, maxBatchDelay {delay} ms, {workers} worker(s) x "
                f"{threads} thread(s)")
            try:
                registration.register(archive, batch_size, delay, workers, threads)
                servers.wait_for_prediction(f"{server.inference_url}{model_traffic.path}",
                                            model_traffic.payloads(0, 0).next(), model_traffic.check, timeout=120)
                folder = Path(out_dir) / f"w{workers}-t{threads}-b{batch_size}-d{delay}"
                found = capacity_search.capacity(server.inference_url, model, slo_ms, folder, server.metrics_url,
                                                 log=log, **search)
            except RuntimeError as error:
                log(f"  failed: {error}")
                point["error"] = str(error)[:300]
                point["capacity_rate"] = None
                points.append(point)
                continue
            at_capacity, lowest = found["at_capacity"], found["at_start_rate"]
            point.update(capacity_rate=found["capacity_rate"], stopped_because=found["stopped_because"],
                         p99_at_capacity_ms=at_capacity["p99_ms"] if at_capacity else None,
                         p50_at_capacity_ms=at_capacity["p50_ms"] if at_capacity else None,
                         low_load_rate=lowest["rate"] if lowest else None,
                         low_load_p50_ms=lowest["p50_ms"] if lowest else None,
                         low_load_p99_ms=lowest["p99_ms"] if lowest else None,
                         report_dir=found["report_dir"])
            if at_capacity and at_capacity.get("report_dir"):
                summary_file = Path(at_capacity["report_dir"]) / "summary.json"
                if summary_file.exists():
                    server_side = json.loads(summary_file.read_text()).get("server") or {}
                    point["mean_batch_at_capacity"] = server_side.get("mean_batch_requests")
            points.append(point)
            log(f"  -> capacity {point['capacity_rate']}/s")
        registration.unregister()
    return {"model": model, "slo_ms": slo_ms, "cores": cores(), "started_at": started_at, "points": points,
            "start_rate": search["start_rate"], "step_seconds": search["step_seconds"],
            "min_requests": search.get("min_requests", 0),
            "recommendation": recommend(points)}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m loadtests.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, choices=sorted(loadtest.MODELS))
    parser.add_argument("--batch-sizes", type=parse_list, default=parse_list("1,8,16,32"), help="batchSize values")
    parser.add_argument("--delays", type=parse_list, default=parse_list("2,5,10"), help="maxBatchDelay values (ms)")
    parser.add_argument("--workers", type=parse_list, default=parse_list(default_workers()),
                        help="worker counts (default 1,2 on >= 2 cores)")
    parser.add_argument("--threads", type=parse_list,
                        help="torch threads per worker to sweep (default cores // workers)")
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
        result = sweep(args.model, args.slo_ms, args.batch_sizes, args.delays, args.workers, args.threads, out_dir,
                       capacity_search.search_kwargs(args), args.model_store)
    except (RuntimeError, requests.RequestException) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    (out_dir / "tune.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = render_markdown(result)
    (out_dir / "tune.md").write_text(markdown)
    plot_heatmap(result["points"], out_dir / "heatmap.png", f"{args.model}: requests/s at p99 <= {args.slo_ms:g} ms")
    print(markdown[markdown.index("## Recommendation"):])
    print(f"report: {out_dir}/tune.md")
    return 0


if __name__ == "__main__":
    from scripts.server import exit_on_sigterm

    exit_on_sigterm()
    sys.exit(main())
