"""Where a served request's time goes at low load: one request at a time, against the same handler in process.

    python -m loadtests.breakdown [--models classifier,minilm] [--requests 300] [--gap-ms 5] [--words 8]
                                  [--set minilm:delay=0,workers=1] [--property async_logging=true]
                                  [--trace-logs] [--py-spy] [--jfr]

A private TorchServe (scripts/ops/server.py: free loopback ports, its own run folder, the archives of model_store/
as packaged) gets --requests requests per model from one keep-alive `http.client` connection, --gap-ms apart (after
--warmup unmeasured ones, and once the 1-minute load average is below --settle-load, or after --settle-max-s).
Bodies are the load tests' seeded payloads (loadtests/payloads.py): classifier rows, and for minilm distinct short
texts of --words words (no cache hit: the cache would hide the forward pass). Then the same bodies go, in the same
order, through the same archive's handler in this process (scripts/ops/handler_loader.load_handler: same code,
model-config.yaml, backend, precision and threads).

What each layer says about the same requests (means over the measured requests unless marked p50):

- client: wall time around the HTTP exchange (p50 and mean);
- access log: the frontend's own per-request milliseconds (access_log.log, whole ms; p50);
- ts_inference_latency_microseconds / ts_queue_latency_microseconds: TorchServe's per-request sums (Prometheus),
  request received -> answer written, and queued -> taken by a worker thread (it includes maxBatchDelay's wait);
- with --trace-logs (a copy of config/log4j2.xml without its per-request filters, so that the frontend writes the
  lines the shipped configuration drops): "Backend response time" (frontend -> worker -> frontend, whole ms) and the
  worker's PredictionTime (TorchServe's timer around handle(), ms with 2 decimals), per request;
- the handler's PreprocessSeconds + InferenceSeconds + PostprocessSeconds per batch (Prometheus histograms' sums);
- in process: handle() per request (p50, mean) and the same three stages.

--property sets one config.properties line for the private server (a TorchServe setting to try, e.g.
``async_logging=true``). --set re-registers a model through the management API with other batching or workers (e.g.
``delay=0``: the register API takes 0, an archive cannot; ``workers=1``), as loadtests/tune.py does.
--py-spy samples each model's first worker during the measured requests (`py-spy record --nonblocking`, raw stacks:
needs ptrace) and reports where its non-idle samples were; --jfr records the frontend with JDK Flight Recorder around
each model's requests (jcmd JFR.start/JFR.stop; `-XX:StartFlightRecording` in config.properties' vmargs works too, but
records start-up) and reports its hottest Java frames.

Writes loadtests/reports/breakdown-<time>/: breakdown.json, breakdown.md (the table), py-spy and JFR files.
Exit codes: 0 measured, 1 the server or a request failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import http.client
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from loadtests import prometheus
from loadtests.payloads import traffic
from scripts.ops import machine, registry, stats
from scripts.ops.payloads import sentence
from scripts.ops.server import (
    DEFAULT_CONFIG,
    LOG_CONFIG_OPTION,
    REPO,
    Server,
    absolute_log_config,
    exit_on_sigterm,
    private_server,
    read_properties,
)

REPORTS = REPO / "loadtests" / "reports"
LOG_CONFIG = REPO / "config" / "log4j2.xml"
# The private server owns these (free ports, the archives under test); --property may not set them.
PRIVATE_PROPERTIES = (
    "inference_address",
    "management_address",
    "metrics_address",
    "grpc_inference_port",
    "grpc_management_port",
    "model_store",
    "load_models",
)
SET_KEYS = {"batch": "batch_size", "delay": "max_batch_delay", "workers": "workers"}
# Frames whose inclusive share of a worker's non-idle py-spy samples the report gives (function name, file suffix).
PY_SPY_FRAMES = (
    ("handle_connection", "ts/model_service_worker.py"),
    ("retrieve_msg", "ts/protocol/otf_message_handler.py"),
    ("predict", "ts/service.py"),
    ("handle", "handlers/core/base.py"),
    ("run_batch", "handlers/core/base.py"),
    ("preprocess", ""),
    ("inference", ""),
    ("postprocess", ""),
    ("parse_request", ""),
    ("answer", "handlers/core/base.py"),
    ("record", "handlers/core/metrics.py"),
    ("emit_metrics", "ts/metrics/caching_metric.py"),
    ("create_predict_response", "ts/protocol/otf_message_handler.py"),
)
# Samples whose innermost Python frame is handle_connection itself: the worker in socket.sendall (a C call), sending
# the answer back.
SENDALL = "sendall (handle_connection's own line)"
# The leaf frame of a worker waiting for its next batch (the socket read): py-spy --nonblocking may not see it idle.
RECV_WAIT = "_retrieve_buffer (ts/protocol/otf_message_handler.py"


# ----------------------------------------------------------------------------------------------- payloads
# What a breakdown can send and check (bodies(), the load tests' traffic): rows of numbers, or embedding texts.
BREAKDOWN_KINDS = ("mlp", "embedding")


def model_kind(model: str, model_store: str) -> str | None:
    """The model's kind (scripts/ops/registry.py), None for a name it does not know."""
    try:
        return registry.model(model, model_store).kind
    except ValueError:
        return None


def bodies(model: str, count: int, words: int, stream: int, model_store: str | None = None) -> list[dict[str, Any]]:
    """`count` request bodies: distinct texts of `words` words for a text model (minilm), else the load tests'
    traffic (the classifier's rows)."""
    if registry.model(model, model_store).inputs == "texts":
        rng = random.Random(f"breakdown-minilm-{stream}")
        return [{"text": f"{index} {sentence(rng, words)}"} for index in range(count)]
    payloads = traffic(model).payloads(0, stream)
    return [payloads.next() for _ in range(count)]


# ----------------------------------------------------------------------------------------------- served
def settle(below: float, at_most_s: float) -> float:
    """Wait (up to `at_most_s`) until the 1-minute load average is below `below` (starting workers, or another job,
    raises it); returns the load average measured at."""
    deadline = time.monotonic() + at_most_s
    while os.getloadavg()[0] >= below and time.monotonic() < deadline:
        time.sleep(2)
    return os.getloadavg()[0]


def send_all(inference_url: str, model: str, requests_: list[dict[str, Any]], gap_s: float) -> list[float]:
    """One keep-alive connection, one request at a time, `gap_s` apart; each answer checked; seconds per request."""
    address = urlparse(inference_url)
    connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port or 80, timeout=60)
    check = traffic(model).check
    path = traffic(model).path
    headers = {"Content-Type": "application/json"}
    durations = []
    try:
        for body in requests_:
            data = json.dumps(body)
            started = time.perf_counter()
            connection.request("POST", path, data, headers)
            response = connection.getresponse()
            answer = response.read()
            durations.append(time.perf_counter() - started)
            if response.status != 200:
                raise RuntimeError(f"{model}: HTTP {response.status}: {answer[:200]!r}")
            reason = check(json.loads(answer))
            if reason:
                raise RuntimeError(f"{model}: wrong answer: {reason}")
            time.sleep(gap_s)
    finally:
        connection.close()
    return durations


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def read_from(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


ACCESS = re.compile(r'"POST /predictions/(?P<model>[^/ "]+)[^"]*" (?P<status>\d+) (?P<ms>\d+)')
BACKEND = re.compile(r"W-\d+-(?P<model>.+?)_[^ ]+ .*Backend response time: (?P<ms>\d+)")
WORKER_METRIC = re.compile(
    r"\[METRICS\](?P<name>PredictionTime|HandlerTime)\.\w+:(?P<ms>[\d.]+)\|#ModelName:(?P<model>[^,|]+)"
)


def access_ms(text: str, model: str) -> list[float]:
    return [float(m["ms"]) for m in ACCESS.finditer(text) if m["model"] == model]


def trace_figures(text: str, model: str) -> dict[str, list[float]]:
    """Per-request values from the frontend's unfiltered ts_log: backend round trip and the worker's timers."""
    figures: dict[str, list[float]] = {"backend_response_ms": [], "PredictionTime": [], "HandlerTime": []}
    for line in text.splitlines():
        match = BACKEND.search(line)
        if match and match["model"] == model:
            figures["backend_response_ms"].append(float(match["ms"]))
            continue
        match = WORKER_METRIC.search(line)
        if match and match["model"] == model:
            figures[match["name"]].append(float(match["ms"]))
    return figures


def trace_log_config(destination: Path) -> Path:
    """config/log4j2.xml without its per-request RegexFilters: the frontend then logs each batch's round trip and
    echoes each worker metric line (a diagnostic configuration; the shipped one drops them)."""
    text = LOG_CONFIG.read_text()
    text = re.sub(r"\s*<RegexFilter [^>]*/>", "", text)
    text = re.sub(r"\s*<Filters>\s*</Filters>", "", text)
    destination.write_text(text)
    return destination


def property_setting(text: str) -> tuple[str, str]:
    """--property KEY=VALUE: one config.properties line for the private server (load_models and the addresses are
    the private server's own)."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip() or key.strip() in PRIVATE_PROPERTIES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected KEY=VALUE with a config.properties key other than {', '.join(PRIVATE_PROPERTIES)}"
        )
    return key.strip(), value.strip()


def vmargs(log_config: Path) -> str:
    """config.properties' JVM options with another log4j2 configuration."""
    words = absolute_log_config(read_properties(DEFAULT_CONFIG).get("vmargs", "")).split()
    words = [w for w in words if not w.startswith(LOG_CONFIG_OPTION)] + [f"{LOG_CONFIG_OPTION}{log_config}"]
    return " ".join(words)


def jcmd(pid: int | None, *command: str) -> bool:
    """A JFR command to the frontend's JVM (JDK 17's jcmd: same user, no restart); False when it failed."""
    tool = shutil.which("jcmd") or str(Path(os.environ.get("JAVA_HOME", "/usr")) / "bin" / "jcmd")
    if pid is None:
        return False
    return subprocess.run([tool, str(pid), *command], capture_output=True).returncode == 0


def reregister(server: Server, model: str, settings: dict[str, int]) -> dict[str, Any]:
    """Register `model` again from its archive with other batching / workers (loadtests/tune.py's path)."""
    from loadtests.tune import register_point

    client = server.management(timeout=60)
    described = client.description(model)
    workers = settings.get("workers", len(described.get("workers", [])))
    return register_point(
        client,
        model,
        f"{model}.mar",
        settings.get("batch_size", described["batchSize"]),
        settings.get("max_batch_delay", described["maxBatchDelay"]),
        workers,
    )


def py_spy_start(pid: int, seconds: float, out: Path) -> subprocess.Popen | None:
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        print("note: py-spy is not installed in this venv (`.venv/bin/pip install py-spy`); not sampling")
        return None
    command = [str(exe), "record", "--pid", str(pid), "--nonblocking", "--rate", "1000", "--format", "raw"]
    command += ["--duration", str(max(1, round(seconds))), "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def py_spy_summary(raw: Path) -> dict[str, Any]:
    """Inclusive share of PY_SPY_FRAMES in the non-idle samples (collapsed stacks: 'frame;frame;... count')."""
    total = waiting = 0
    inclusive: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if frames[-1].startswith(RECV_WAIT):  # blocked in the socket read: idle, whatever --nonblocking saw
            waiting += count
            continue
        total += count
        leaves[frames[-1]] += count
        if frames[-1].partition(" (")[0].endswith("handle_connection"):
            inclusive[SENDALL] += count
        seen = set()
        for frame in frames:
            name, _, where = frame.partition(" (")
            name = name.rpartition(".")[2]  # py-spy names methods Class.method
            for wanted, suffix in PY_SPY_FRAMES:
                if name == wanted and suffix in where and wanted not in seen:
                    seen.add(wanted)
                    inclusive[wanted] += count
    return {
        "samples": total,
        "recv_wait_samples": waiting,
        "inclusive_share": {
            name: round(inclusive[name] / total, 3) for name in [*(n for n, _ in PY_SPY_FRAMES), SENDALL] if total
        },
        "top_leaves": [(frame, round(count / total, 3)) for frame, count in leaves.most_common(12)] if total else [],
    }


def jfr_summary(jfr_file: Path, top: int = 15) -> dict[str, Any]:
    """The hottest top frames of the frontend's Java execution samples (jdk.ExecutionSample)."""
    jfr = shutil.which("jfr") or str(Path(os.environ.get("JAVA_HOME", "/usr")) / "bin" / "jfr")
    result = subprocess.run(
        [jfr, "print", "--events", "jdk.ExecutionSample", str(jfr_file)], capture_output=True, text=True
    )
    if result.returncode != 0:
        return {"error": result.stderr.strip()[:300]}
    tops: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    for event in result.stdout.split("jdk.ExecutionSample")[1:]:
        thread = re.search(r'sampledThread = "([^"]*)"', event)
        frame = re.search(r"stackTrace = \[\s*\n\s*(\S[^\n]*)", event)
        if thread:
            threads[re.sub(r"\d+", "N", thread.group(1))] += 1
        if frame:
            tops[re.sub(r"\s+line:.*", "", frame.group(1))] += 1
    samples = sum(tops.values())
    return {
        "samples": samples,
        "top_frames": tops.most_common(top),
        "threads": threads.most_common(8),
    }


def measure_served(args: argparse.Namespace, out: Path) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    log_config = trace_log_config(out / "log4j2-trace.xml") if args.trace_logs else None
    overrides = dict(args.property)
    if log_config is not None:
        overrides["vmargs"] = vmargs(log_config)
    with private_server("breakdown", args.model_store, args.models, overrides=overrides, keep_logs_in=out) as server:
        for model, settings in args.set.items():
            described = reregister(server, model, settings)
            print(
                f"{model}: registered with batchSize {described['batchSize']}, maxBatchDelay "
                f"{described['maxBatchDelay']} ms, {len(described['workers'])} worker(s)"
            )
        logs = server.log_dir
        for model in args.models:
            description = server.management().description(model)
            warm = bodies(model, args.warmup, args.words, stream=1, model_store=args.model_store)
            measured = bodies(model, args.requests, args.words, stream=0, model_store=args.model_store)
            send_all(server.inference_url, model, warm, args.gap_ms / 1e3)
            load = settle(args.settle_load, args.settle_max_s)
            access_at, trace_at = log_size(logs / "access_log.log"), log_size(logs / "ts_log.log")
            before = prometheus.scrape(server.metrics_url)
            jfr_file = out / f"frontend-{model}.jfr"
            recording = args.jfr and jcmd(server.pid(), "JFR.start", "name=breakdown", "settings=profile")
            spy = None
            pids = sorted(worker["pid"] for worker in description.get("workers", []))
            if args.py_spy and pids:
                expected = args.requests * (args.gap_ms / 1e3 + 0.01)
                spy = py_spy_start(pids[0], expected, out / f"py-spy-{model}.txt")
            durations = send_all(server.inference_url, model, measured, args.gap_ms / 1e3)
            after = prometheus.scrape(server.metrics_url)
            if recording:
                jcmd(server.pid(), "JFR.stop", "name=breakdown", f"filename={jfr_file}")
            time.sleep(0.5)  # the access log and ts_log are written asynchronously
            server_side = prometheus.server_figures(before, after, model)
            figures: dict[str, Any] = {
                "load_1min_before": round(load, 2),
                "batch_size": description.get("batchSize"),
                "max_batch_delay_ms": description.get("maxBatchDelay"),
                "workers": len(pids),
                "client_ms": summarize([d * 1e3 for d in durations]),
                "access_log_ms": summarize(access_ms(read_from(logs / "access_log.log", access_at), model)),
                "server": server_side,
            }
            if args.trace_logs:
                traced = trace_figures(read_from(logs / "ts_log.log", trace_at), model)
                figures["trace"] = {name: summarize(values) for name, values in traced.items()}
            if spy is not None:
                output = spy.communicate(timeout=args.requests + 60)[0].decode(errors="replace")
                raw = out / f"py-spy-{model}.txt"
                figures["py_spy"] = py_spy_summary(raw) if raw.exists() else {"error": output.strip().splitlines()[-3:]}
            if args.jfr:
                figures["jfr"] = jfr_summary(jfr_file) if jfr_file.exists() else {"error": "JFR did not record"}
            results[model] = figures
            print(f"{model}: served p50 {figures['client_ms']['p50']} ms (load {load:.2f})")
    return results


# ----------------------------------------------------------------------------------------------- in process
def measure_in_process(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """handle() of the same archive in this process, one request per call, the same bodies in the same order."""
    from scripts.ops.handler_loader import load_handler, record_metrics, set_requests

    with tempfile.TemporaryDirectory(prefix=f"breakdown-{model}-") as folder:
        with zipfile.ZipFile(Path(args.model_store) / f"{model}.mar") as archive:
            archive.extractall(folder)
        manifest = json.loads((Path(folder) / "MAR-INF" / "MANIFEST.json").read_text())
        handler, context = load_handler(folder, manifest["model"]["modelName"])
        check = traffic(model).check

        def call(body: dict[str, Any]) -> float:
            set_requests(context, [{"Content-Type": "application/json"}])
            started = time.perf_counter()
            [answer] = handler.handle([{"body": body}], context)
            elapsed = time.perf_counter() - started
            reason = check(json.loads(answer))
            if reason:
                raise RuntimeError(f"{model} in process: wrong answer: {reason}")
            return elapsed

        for body in bodies(model, args.warmup, args.words, stream=1, model_store=args.model_store):
            call(body)
        recorder = record_metrics(context)
        load = settle(args.settle_load, args.settle_max_s)
        durations = []
        for body in bodies(model, args.requests, args.words, stream=0, model_store=args.model_store):
            durations.append(call(body))
            time.sleep(args.gap_ms / 1e3)
        stages = {
            stage: round(statistics.fmean(recorder.values(stage)) * 1e3, 3)
            for stage in prometheus.HANDLER_STAGES
            if recorder.values(stage)
        }
        return {
            "load_1min_before": round(load, 2),
            "backend": handler.backend,
            "precision": handler.precision,
            "threads": handler.threads,
            "handle_ms": summarize([d * 1e3 for d in durations]),
            "stage_mean_ms": stages,
        }


# ----------------------------------------------------------------------------------------------- report
def summarize(values: list[float]) -> dict[str, float | None]:
    """count, mean, p50 and p90 (the project's nearest-rank percentiles, scripts/ops/stats.py)."""
    return stats.summary(values, {"p50": 0.5, "p90": 0.9})


def stage_sum(server: dict[str, Any]) -> float | None:
    means = [server.get(f"{key}_mean_ms") for key in ("preprocess", "inference", "postprocess")]
    return round(sum(means), 3) if all(m is not None for m in means) else None  # type: ignore[arg-type]


def rows_for(model: str, served: dict[str, Any], local: dict[str, Any]) -> list[tuple[str, Any]]:
    server = served["server"]
    trace = served.get("trace", {})
    rows: list[tuple[str, Any]] = [
        (
            "config",
            f"batchSize {served['batch_size']}, maxBatchDelay {served['max_batch_delay_ms']} ms, "
            f"{served['workers']} worker(s); {local['backend']} {local['precision']}, "
            f"{local['threads']} thread(s)",
        ),
        ("client p50 / mean (ms)", f"{served['client_ms']['p50']} / {served['client_ms']['mean']}"),
        ("access log p50 (whole ms)", served["access_log_ms"]["p50"]),
        ("ts_inference_latency mean (ms)", server.get("mean_frontend_latency_ms")),
        ("ts_queue_latency mean (ms)", server.get("mean_queue_ms")),
    ]
    if trace:
        rows.append(("backend response time mean (whole ms, frontend)", trace["backend_response_ms"]["mean"]))
        rows.append(
            (
                "PredictionTime mean / p50 (ms, worker)",
                f"{trace['PredictionTime']['mean']} / {trace['PredictionTime']['p50']}",
            )
        )
    rows += [
        (
            "handler stages mean: pre + inference + post (ms)",
            f"{server.get('preprocess_mean_ms')} + {server.get('inference_mean_ms')} + "
            f"{server.get('postprocess_mean_ms')} = {stage_sum(server)}",
        ),
        ("mean batch size (requests)", server.get("mean_batch_requests")),
        ("padded tokens per forward pass, mean (text models)", server.get("mean_padded_tokens_per_pass")),
        ("in-process handle() p50 / mean (ms)", f"{local['handle_ms']['p50']} / {local['handle_ms']['mean']}"),
        (
            "in-process stages mean: pre + inference + post (ms)",
            " + ".join(str(local["stage_mean_ms"].get(s)) for s in prometheus.HANDLER_STAGES),
        ),
        ("served p50 - in-process p50 (ms)", round(served["client_ms"]["p50"] - local["handle_ms"]["p50"], 3)),
        ("load average (1 min) served / in process", f"{served['load_1min_before']} / {local['load_1min_before']}"),
    ]
    if "py_spy" in served:
        spy = served["py_spy"]
        if "inclusive_share" in spy:
            shares = ", ".join(f"{k} {v:.0%}" for k, v in spy["inclusive_share"].items() if v)
            rows.append((f"py-spy: worker non-idle samples ({spy['samples']}), inclusive", shares))
        else:
            rows.append(("py-spy", f"failed: {spy.get('error')}"))
    return rows


def render(report: dict[str, Any]) -> str:
    lines = [
        f"# Low-load breakdown ({report['cpu']}, {report['requests']} requests {report['gap_ms']} ms apart, "
        f"{report['time']})",
        "",
        f"`{report['command']}`",
        "",
    ]
    for model, rows in report["rows"].items():
        lines += [f"## {model}", "", "| what | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in rows]
        lines.append("")
    for model, figures in report["served"].items():
        jfr = figures.get("jfr")
        if jfr and "top_frames" in jfr:
            lines += [f"JFR, {model}: {jfr['samples']} Java execution samples of the frontend; hottest top frames:", ""]
            lines += ["```", *(f"{count:5d}  {frame}" for frame, count in jfr["top_frames"]), "```"]
            lines += ["", "threads: " + ", ".join(f"{name} {count}" for name, count in jfr["threads"]), ""]
        elif jfr:
            lines += [f"JFR, {model}: {jfr.get('error')}", ""]
    return "\n".join(lines)


def parse_set(values: list[str]) -> dict[str, dict[str, int]]:
    settings: dict[str, dict[str, int]] = {}
    for value in values:
        model, _, pairs = value.partition(":")
        for pair in pairs.split(","):
            key, _, number = pair.partition("=")
            if key not in SET_KEYS or not number.isdigit():
                raise argparse.ArgumentTypeError(f"--set {value!r}: expected MODEL:batch=N,delay=MS,workers=N")
            settings.setdefault(model, {})[SET_KEYS[key]] = int(number)
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.breakdown", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="classifier,minilm", help="comma-separated (default classifier,minilm)")
    parser.add_argument("--requests", type=int, default=300, help="measured requests per model (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured requests first (default 30)")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="pause after each answer (default 5)")
    parser.add_argument("--words", type=int, default=8, help="words per minilm text (default 8: a short text)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODEL:batch=N,delay=MS,workers=N",
        help="re-register a model with other batching/workers before measuring (repeatable)",
    )
    parser.add_argument(
        "--property",
        action="append",
        type=property_setting,
        default=[],
        metavar="KEY=VALUE",
        help="a config.properties setting for the private server, e.g. async_logging=true (repeatable)",
    )
    parser.add_argument(
        "--trace-logs",
        action="store_true",
        help="frontend logs without the per-request filters: backend round trip, PredictionTime",
    )
    parser.add_argument("--py-spy", action="store_true", help="sample each model's first worker with py-spy")
    parser.add_argument(
        "--jfr",
        action="store_true",
        help="JDK Flight Recorder on the frontend (jcmd JFR.start/stop around each model's requests)",
    )
    parser.add_argument(
        "--settle-load",
        type=float,
        default=0.5,
        help="before each measurement wait until the 1-minute load average is below this (default 0.5) ...",
    )
    parser.add_argument("--settle-max-s", type=float, default=150.0, help="... for at most this long (default 150)")
    parser.add_argument("--no-in-process", action="store_true", help="skip the in-process handle() timing")
    parser.add_argument("--model-store", default=str(REPO / "model_store"))
    parser.add_argument("--out", help="report folder (default loadtests/reports/breakdown-<time>)")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        args.set = parse_set(args.set)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    unknown = [m for m in args.models if model_kind(m, args.model_store) not in BREAKDOWN_KINDS]
    if unknown or any(m not in args.models for m in args.set):
        parser.error(
            f"--models and --set take models of kind {' or '.join(BREAKDOWN_KINDS)}, such as classifier and minilm "
            f"(got {unknown or list(args.set)})"
        )
    missing = [m for m in args.models if not (Path(args.model_store) / f"{m}.mar").exists()]
    if missing or args.requests < 1:
        parser.error(f"archives missing in {args.model_store}: {missing} (make mar)" if missing else "--requests >= 1")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or REPORTS / f"breakdown-{stamp}").resolve()  # the JVM runs in another folder
    out.mkdir(parents=True, exist_ok=True)
    flags = sorted(machine.cpu_flags() & set(machine.NOTABLE_FLAGS))
    try:
        served = measure_served(args, out)
        local = {} if args.no_in_process else {model: measure_in_process(args, model) for model in args.models}
    except (RuntimeError, OSError, http.client.HTTPException) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    report = {
        "time": stamp,
        "cpu": f"{machine.cores()} cores, flags {', '.join(flags) or 'none of ' + str(machine.NOTABLE_FLAGS)}",
        "command": "python -m loadtests.breakdown " + " ".join(argv if argv is not None else sys.argv[1:]),
        "requests": args.requests,
        "gap_ms": args.gap_ms,
        "served": served,
        "in_process": local,
        "rows": {model: rows_for(model, served[model], local[model]) for model in args.models if model in local},
    }
    (out / "breakdown.json").write_text(json.dumps(report, indent=2))
    text = render(report)
    (out / "breakdown.md").write_text(text)
    print(text)
    print(f"report: {out}/breakdown.md")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
