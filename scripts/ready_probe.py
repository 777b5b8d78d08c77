"""Readiness check for a TorchServe: ready when every registered model's default version has its workers up AND no
model is stuck (requests waiting or unanswered, and nothing answered for --stuck-after seconds).

TorchServe 0.12's /ping answers 200 "Healthy" as soon as the frontend listens, while workers are still loading and
even when a model's workers cannot load at all (seen), and its describe says a worker is READY while that worker is
wedged, so neither can gate traffic. This asks the management API (worker counts, queued requests) and the metrics
port (requests received, answered, batches finished) instead, through scripts/ops/ (which the image carries beside
it); scripts/ops/progress.py says what counts as progress. It runs as a Kubernetes exec probe inside the image
(deploy/Dockerfile) and on a production host (it reads the management token from TorchServe's key file when there is
one).

    python -m scripts.ready_probe [--management-url http://127.0.0.1:8081] [--metrics-url http://127.0.0.1:8082]
                                  [--stuck-after 60] [--state-file PATH] [--key-file key_file.json]

A stall is seen across runs: each run keeps what it saw in --state-file (default: one file per management URL in the
temporary folder), and a model is reported stuck once a later run still sees its work unanswered --stuck-after seconds
after an earlier one first saw it.

Exit codes: 0 ready; 1 not ready (one line says why: unreachable, no models, a model short of READY workers, a model
stuck); 2 bad arguments.
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from scripts.ops.auth import KeyFileError, key_from_file
from scripts.ops.management import (
    DEFAULT_MANAGEMENT_URL,
    ManagementClient,
    ManagementError,
    ready_workers,
    wanted_workers,
)
from scripts.ops.progress import (
    DEFAULT_METRICS_URL,
    DEFAULT_STUCK_AFTER_S,
    MetricsUnusable,
    ProgressMonitor,
    stuck_models,
)


def not_ready_reason(client):
    """None when every registered model's default version has max(1, minWorkers) READY workers, else why not."""
    try:
        models = client.list_models()
        if not models:
            return "no models registered"
        for entry in models:
            description = client.description(entry["modelName"])
            wanted, ready = wanted_workers(description), len(ready_workers(description))
            if ready < wanted:
                return f"{entry['modelName']} {description.get('modelVersion')}: {ready}/{wanted} workers READY"
    except ManagementError as error:
        return management_failure(client, error)
    except (ValueError, KeyError, IndexError, TypeError) as error:
        return f"management API at {client.url} unusable: {error}"
    return None


def management_failure(client, error):
    if error.status is None:
        return f"management API at {client.url} unusable: {error}"
    return f"management API answered {error.status}: {error}"


def default_state_file(management_url):
    """One state file per server (its management URL), in the temporary folder."""
    digest = hashlib.sha256(management_url.rstrip("/").encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"ts-ready-probe-{digest}.json"


def load_monitor(path, stuck_after_s):
    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        state = None
    return ProgressMonitor.from_state(state, stuck_after_s)


def save_monitor(path, monitor):
    """Written whole, then renamed over the old state: a probe run beside this one never reads half of it."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(monitor.state()))
    os.replace(partial, path)


def stuck_reason(client, metrics_url, state_file, stuck_after_s, timeout):
    """None when no model is stuck, else which model is and why (or why progress cannot be seen)."""
    monitor = load_monitor(state_file, stuck_after_s)
    try:
        verdicts = stuck_models(client, metrics_url, monitor, time.time(), timeout)
    except ManagementError as error:
        return management_failure(client, error)
    except MetricsUnusable as error:
        return f"{error} (progress cannot be seen without it)"
    try:
        save_monitor(state_file, monitor)
    except OSError as error:
        return f"cannot keep the probe's state in {state_file}: {error.strerror}"
    stuck = [verdict for verdict in verdicts if verdict.stuck]
    if stuck:
        return "; ".join(f"stuck: {verdict.describe()} (--stuck-after {stuck_after_s:g})" for verdict in stuck)
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.ready_probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--management-url", default=os.environ.get("TS_MANAGEMENT_URL", DEFAULT_MANAGEMENT_URL))
    parser.add_argument("--metrics-url", default=os.environ.get("TS_METRICS_URL", DEFAULT_METRICS_URL))
    parser.add_argument(
        "--stuck-after",
        type=float,
        default=DEFAULT_STUCK_AFTER_S,
        help=f"seconds a model may have work and answer nothing before it is stuck (default {DEFAULT_STUCK_AFTER_S:g})",
    )
    parser.add_argument("--state-file", help="where runs keep what they saw (default: one file per management URL)")
    parser.add_argument("--key-file", help="TorchServe's key_file.json, when token authorization is on")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per HTTP call (default 2)")
    args = parser.parse_args(argv)
    if args.stuck_after <= 0:
        parser.error("--stuck-after must be positive")
    token = None
    if args.key_file and os.path.isfile(args.key_file):
        try:
            token = key_from_file(args.key_file, "management")
        except KeyFileError as error:
            print(f"not ready: {error}")
            return 1
    client = ManagementClient(args.management_url, token, f"key file {args.key_file}", args.key_file, args.timeout)
    state_file = args.state_file or default_state_file(args.management_url)
    reason = not_ready_reason(client) or stuck_reason(
        client, args.metrics_url, state_file, args.stuck_after, args.timeout
    )
    if reason:
        print(f"not ready: {reason}")
        return 1
    print("ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
