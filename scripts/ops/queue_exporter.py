"""Per-model job queue depth and workers as Prometheus metrics, read from TorchServe's management API.

TorchServe 0.12 exports no queue depth on its metrics port (:8082 has request counts, latency sums and its own
host gauges only), yet the queue is what a full server is made of: `job_queue_size` requests per model version, then
503 at once. The management API's description of a model version carries it (``jobQueueStatus``: pendingRequests,
remainingCapacity) with the version's workers, so this exporter asks it on every scrape (one GET per model, answered
by the frontend without involving a worker) and answers in Prometheus' text format:

    torchserve_queue_pending_requests{ModelName,ModelVersion}     requests waiting in the job queue
    torchserve_queue_remaining_capacity{ModelName,ModelVersion}   free places left (pending + remaining = the limit)
    torchserve_workers{ModelName,ModelVersion,Status}             workers by status (READY, UNLOADING, ...)
    torchserve_min_workers{ModelName,ModelVersion}                the version's minWorkers
    torchserve_management_up                                      1 when the management API answered this scrape

`make monitor` runs it beside the development server; in Kubernetes it is a sidecar of each TorchServe pod (the
management API stays on the pod's loopback). The labels are the handlers' own (ModelName), so rules join the two.

    python -m scripts.ops.queue_exporter [--port 8084] [--management-url http://127.0.0.1:8081] [--key-file F]

Exit codes: 0 stopped by a signal, 2 bad arguments or the port cannot be bound.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from scripts.ops.management import DEFAULT_MANAGEMENT_URL, ManagementClient, ManagementError

DEFAULT_PORT = 8084
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PENDING = "torchserve_queue_pending_requests"
REMAINING = "torchserve_queue_remaining_capacity"
WORKERS = "torchserve_workers"
MIN_WORKERS = "torchserve_min_workers"
MANAGEMENT_UP = "torchserve_management_up"
# name -> help text; the names every rule, dashboard and HPA may use from this exporter.
METRICS = {
    PENDING: "Requests waiting in the model version's job queue (TorchServe's jobQueueStatus.pendingRequests).",
    REMAINING: "Free places in the job queue; pending + remaining = job_queue_size, beyond it TorchServe answers 503.",
    WORKERS: "The model version's workers by status.",
    MIN_WORKERS: "The model version's minWorkers.",
    MANAGEMENT_UP: "1 when TorchServe's management API answered this scrape, else 0.",
}

Sample = tuple[str, dict[str, str], float]


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def version_samples(description: dict[str, Any]) -> list[Sample]:
    """The samples of one model version's description."""
    labels = {"ModelName": str(description.get("modelName")), "ModelVersion": str(description.get("modelVersion"))}
    samples: list[Sample] = []
    queue = description.get("jobQueueStatus") or {}
    if "pendingRequests" in queue:
        samples.append((PENDING, labels, float(queue["pendingRequests"])))
    if "remainingCapacity" in queue:
        samples.append((REMAINING, labels, float(queue["remainingCapacity"])))
    statuses: dict[str, int] = {"READY": 0}
    for worker in description.get("workers", []):
        status = str(worker.get("status"))
        statuses[status] = statuses.get(status, 0) + 1
    samples += [(WORKERS, {**labels, "Status": status}, float(count)) for status, count in sorted(statuses.items())]
    samples.append((MIN_WORKERS, labels, float(description.get("minWorkers") or 0)))
    return samples


def collect(client: ManagementClient) -> list[Sample]:
    """Every registered model version's samples, and whether the management API answered."""
    samples: list[Sample] = []
    try:
        for entry in client.list_models():
            for description in client.versions(entry["modelName"]):
                samples += version_samples(description)
    except ManagementError as error:
        print(f"queue exporter: {error}", file=sys.stderr)
        return [(MANAGEMENT_UP, {}, 0.0)]
    return [(MANAGEMENT_UP, {}, 1.0), *samples]


def render(samples: Iterable[Sample]) -> str:
    """Prometheus text format: each metric's HELP and TYPE once, then its samples."""
    by_name: dict[str, list[str]] = {name: [] for name in METRICS}
    for name, labels, value in samples:
        text = ",".join(f'{key}="{escape(label)}"' for key, label in labels.items())
        by_name[name].append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")
    lines = []
    for name, rows in by_name.items():
        if rows:
            lines += [f"# HELP {name} {METRICS[name]}", f"# TYPE {name} gauge", *rows]
    return "\n".join(lines) + "\n"


def handler_for(client: Callable[[], ManagementClient]) -> type[BaseHTTPRequestHandler]:
    """/metrics asks a client made by `client()` for each scrape (it re-reads a key file, whose keys expire)."""

    class MetricsHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            try:
                samples = collect(client())
            except ManagementError as error:  # an unreadable key file
                print(f"queue exporter: {error}", file=sys.stderr)
                samples = [(MANAGEMENT_UP, {}, 0.0)]
            body = render(samples).encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            """Scrapes every few seconds are not news: no access log."""

    return MetricsHandler


def serve(address: str, port: int, client: Callable[[], ManagementClient]) -> ThreadingHTTPServer:
    """The exporter's HTTP server, bound (not yet serving: call serve_forever)."""
    return ThreadingHTTPServer((address, port), handler_for(client))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.ops.queue_exporter",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve /metrics on ({DEFAULT_PORT})")
    parser.add_argument("--address", default="127.0.0.1", help="address to bind (0.0.0.0 in a pod)")
    parser.add_argument("--management-url", default=DEFAULT_MANAGEMENT_URL, help="TorchServe's management API")
    parser.add_argument(
        "--key-file", help="TorchServe's key_file.json, for a server with token authorization (management key)"
    )
    args = parser.parse_args(argv)

    def client() -> ManagementClient:
        return ManagementClient.with_key_file(
            args.management_url, os.environ.get("TS_MANAGEMENT_TOKEN"), args.key_file, timeout=5
        )

    try:
        server = serve(args.address, args.port, client)
    except OSError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"queue exporter: http://{args.address}:{args.port}/metrics <- {args.management_url}", flush=True)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
