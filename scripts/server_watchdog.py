"""The watchdog beside a TorchServe: it replaces the workers of a stuck model, and stops a private server once the
process that started it is gone.

    python -m scripts.server_watchdog --management-url URL [--metrics-url URL] [--stuck-after 60] [--metrics-port N]
    python -m scripts.server_watchdog --owner PID --server-pid PID [--interval 1]
    (both together: a private server whose models are watched too)

Stuck models (--management-url): each round it looks at every model's progress (scripts/ops/progress.py: requests
waiting or unanswered, and nothing answered for --stuck-after seconds) and replaces the workers of each stuck model
through the management API: it scales the model's default version to 0 workers (TorchServe kills the worker
processes, and answers the requests they held with a 500), then back to its minWorkers/maxWorkers, and logs what it
did, to which model and why, one line each:

    ... model watchdog: classifier 1.0 is stuck (1 request waiting, ...; --stuck-after 60): replacing its workers ...
    ... model watchdog: classifier 1.0 workers replaced: 1/1 READY (pids 4242 -> 4311)

With --metrics-port it serves Prometheus text on :PORT/metrics: ts_model_stuck (1 while a model is stuck),
ts_model_stalled_seconds, ts_model_watchdog_restarts_total and ts_model_watchdog_last_check_timestamp_seconds.

Owner gone (--owner/--server-pid): the tests, the load-test tools and the reliability suite start TorchServe as a
daemon (`torchserve --start`) and stop it in a `finally` block. A SIGKILL (an out-of-memory kill, `kill -9`, a CI
runner's hard timeout) runs no `finally`, and the server would keep its ports, its workers and two cores busy for
good. `scripts.ops.server.start_isolated` starts this watchdog beside each private server, in its own session so a
signal to the owner's process group does not reach it. It polls both processes: when the server is gone it exits;
when the owner is gone it stops the server the way Server.stop does (SIGTERM to the frontend, whose shutdown hook stops
the workers), then SIGKILLs whatever of the server's process tree is still there after --grace seconds.

Exit codes: 0 the server stopped (by its owner or by this watchdog); 2 bad arguments. Watching models only, it runs
until it is stopped.
"""

from __future__ import annotations

import argparse
import http.server
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from scripts.ops.auth import KeyFileError
from scripts.ops.management import DEFAULT_MANAGEMENT_URL, ManagementClient, ManagementError, ready_workers
from scripts.ops.progress import (
    DEFAULT_METRICS_URL,
    DEFAULT_STUCK_AFTER_S,
    MetricsUnusable,
    ProgressMonitor,
    Verdict,
    stuck_models,
)

logger = logging.getLogger("model watchdog")


def process_alive(pid):
    # scripts.ops.server imports the handlers (absent from the image, where only the model watch runs).
    from scripts.ops.server import process_alive as alive

    return alive(pid)


def watch(owner, server_pid, interval=1.0, grace=30.0, each_round: Callable[[], None] | None = None):
    """Block until the server stops; stop it first if the owner dies. Returns what happened."""
    from scripts.ops.server import stop_process_tree

    while process_alive(server_pid):
        if not process_alive(owner):
            stop_process_tree(server_pid, grace)
            return "owner gone: server stopped"
        if each_round is not None:
            each_round()
        time.sleep(interval)
    return "server stopped by its owner"


class ModelWatch:
    """Looks at every model's progress each round and replaces the workers of the stuck ones."""

    def __init__(self, client: ManagementClient, metrics_url: str, stuck_after_s: float, timeout: float = 5.0):
        self.client = client
        self.metrics_url = metrics_url
        self.monitor = ProgressMonitor(stuck_after_s)
        self.timeout = timeout
        self.verdicts: list[Verdict] = []
        self.restarts: dict[str, int] = {}
        self.last_check: float | None = None
        self.last_problem: str | None = None
        self.lock = threading.Lock()

    def check(self) -> None:
        """One round; a server that cannot be asked is logged once (until it answers again), not fatal."""
        try:
            verdicts = stuck_models(self.client, self.metrics_url, self.monitor, time.monotonic(), self.timeout)
        except (ManagementError, MetricsUnusable) as error:
            if str(error) != self.last_problem:
                logger.warning("cannot look at the models' progress: %s", error)
                self.last_problem = str(error)
            return
        self.last_problem = None
        with self.lock:
            self.verdicts, self.last_check = verdicts, time.time()
        for verdict in verdicts:
            if verdict.stuck:
                self.replace_workers(verdict)

    def ready_description(self, name: str, version: str, wanted: int, timeout: float) -> dict:
        """The version's description once ``wanted`` workers are READY (a synchronous scale returns when they
        started, before they loaded), or as it is after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            description = self.client.description(name, version)
            if len(ready_workers(description)) >= wanted or time.monotonic() > deadline:
                return description
            time.sleep(0.25)

    def replace_workers(self, verdict: Verdict) -> None:
        """Scale the stuck version to 0 workers and back; say so before and after."""
        name, version = verdict.model, verdict.version
        try:
            description = self.client.description(name, version)
            low, high = int(description.get("minWorkers") or 1), int(description.get("maxWorkers") or 1)
            before = sorted(w.get("pid") for w in description.get("workers", []))
            logger.warning(
                "%s %s is stuck (%s; --stuck-after %g): replacing its workers (scaling to 0, then back to %d..%d)",
                name,
                version,
                verdict.why(),
                self.monitor.stuck_after_s,
                low,
                high,
            )
            load_timeout = float(description.get("startupTimeout") or 120) + 60
            self.client.scale(name, version, 0, 0, timeout=60)
            self.client.scale(name, version, low, high, timeout=load_timeout)
            after = self.ready_description(name, version, max(1, low), load_timeout)
            pids = sorted(w.get("pid") for w in after.get("workers", []))
            logger.warning(
                "%s %s workers replaced: %d/%d READY (pids %s -> %s)",
                name,
                version,
                len(ready_workers(after)),
                max(1, low),
                ",".join(map(str, before)) or "none",
                ",".join(map(str, pids)) or "none",
            )
        except ManagementError as error:
            logger.error("%s %s is stuck and replacing its workers failed: %s", name, version, error)
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.monitor.forget(name)

    def metrics_text(self) -> str:
        """The watchdog's view as Prometheus text (served on --metrics-port)."""
        with self.lock:
            verdicts, last_check, restarts = list(self.verdicts), self.last_check, dict(self.restarts)
        lines = [
            "# HELP ts_model_stuck 1 while the model has requests waiting or unanswered and answered none for "
            "--stuck-after seconds",
            "# TYPE ts_model_stuck gauge",
            *(f"ts_model_stuck{labels(v.model, v.version)} {int(v.stuck)}" for v in verdicts),
            "# HELP ts_model_stalled_seconds seconds the model has had work and made no progress (0 while answering)",
            "# TYPE ts_model_stalled_seconds gauge",
            *(f"ts_model_stalled_seconds{labels(v.model, v.version)} {v.stalled_for:.3f}" for v in verdicts),
            "# HELP ts_model_watchdog_restarts_total times the watchdog replaced a stuck model's workers",
            "# TYPE ts_model_watchdog_restarts_total counter",
            *(f"ts_model_watchdog_restarts_total{labels(name)} {count}" for name, count in sorted(restarts.items())),
            "# HELP ts_model_watchdog_last_check_timestamp_seconds when the watchdog last saw every model's progress",
            "# TYPE ts_model_watchdog_last_check_timestamp_seconds gauge",
        ]
        if last_check is not None:
            lines.append(f"ts_model_watchdog_last_check_timestamp_seconds {last_check:.3f}")
        return "\n".join(lines) + "\n"


# What --metrics-port serves (deploy/monitoring/rules.yml alerts on them).
METRICS = (
    "ts_model_stuck",
    "ts_model_stalled_seconds",
    "ts_model_watchdog_restarts_total",
    "ts_model_watchdog_last_check_timestamp_seconds",
)


def labels(model: str, version: str | None = None) -> str:
    quoted = model.replace("\\", "\\\\").replace('"', '\\"')
    return f'{{model_name="{quoted}"' + (f',model_version="{version}"' if version is not None else "") + "}"


def serve_metrics(watch_: ModelWatch, port: int, host: str = "0.0.0.0") -> http.server.ThreadingHTTPServer:
    """Prometheus text of `watch_` on host:port/metrics, from a daemon thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = watch_.metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def model_watch(args) -> ModelWatch:
    try:
        client = ManagementClient.with_key_file(args.management_url, None, args.key_file, timeout=args.timeout)
    except (ManagementError, KeyFileError) as error:
        raise SystemExit(f"model watchdog: {error}") from None
    return ModelWatch(client, args.metrics_url, args.stuck_after, args.timeout)


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.server_watchdog",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--owner", type=int, help="pid of the process that started the server")
    parser.add_argument("--server-pid", type=int, help="pid of TorchServe's frontend (its pid file)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between checks")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds after SIGTERM before SIGKILL")
    parser.add_argument("--management-url", help=f"watch this server's models (e.g. {DEFAULT_MANAGEMENT_URL})")
    parser.add_argument("--metrics-url", default=DEFAULT_METRICS_URL, help="its metrics address (default %(default)s)")
    parser.add_argument(
        "--stuck-after",
        type=float,
        default=DEFAULT_STUCK_AFTER_S,
        help="seconds a model may have work and answer nothing before its workers are replaced (default %(default)s)",
    )
    parser.add_argument("--key-file", help="TorchServe's key_file.json, when token authorization is on")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP call of a check (default 5)")
    parser.add_argument("--metrics-port", type=int, help="serve the watchdog's metrics on this port (/metrics)")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.grace < 0 or args.stuck_after <= 0:
        parser.error("--interval and --stuck-after must be positive and --grace not negative")
    if (args.owner is None) != (args.server_pid is None):
        parser.error("--owner and --server-pid go together")
    if args.owner is None and not args.management_url:
        parser.error("nothing to watch: give --management-url, or --owner and --server-pid")
    return args


def main(argv=None):
    args = parse_arguments(argv)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    watcher = model_watch(args) if args.management_url else None
    if watcher is not None:
        if args.metrics_port is not None:
            serve_metrics(watcher, args.metrics_port)
        logger.info(
            "watching the models of %s (stuck after %g s of work without progress; pid %d)",
            args.management_url,
            args.stuck_after,
            os.getpid(),
        )
    if args.owner is None:
        assert watcher is not None  # parse_arguments: --management-url without --owner
        while True:
            watcher.check()
            time.sleep(args.interval)
    print(watch(args.owner, args.server_pid, args.interval, args.grace, watcher.check if watcher else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
