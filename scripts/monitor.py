"""Prometheus with the project's alert and recording rules, watching the development server (`make monitor`).

    python -m scripts.monitor start [--port 9095] [--exporter-port 8084] [--profile production | --config FILE]
    python -m scripts.monitor stop
    python -m scripts.monitor status

`start` starts the queue exporter (scripts/ops/queue_exporter.py: queue depth and workers from the management API)
and Prometheus (deploy/monitoring/prometheus.yml and rules.yml) in the background, both on 127.0.0.1, against the
server the config describes (config.properties, or the profile `make serve PROFILE=` used: the same
$TS_PROFILE_CONFIG), and prints Prometheus' URL. Data and pid files: .run/monitor/; logs: logs/prometheus.log,
logs/queue-exporter.log. It does not need the server to run yet: its targets show as down until `make serve`.
`stop` stops both (`make monitor-stop`). The lifecycle is scripts/ops/prometheus.py, shared with the tests.
Exit codes: 0 ok (status: running), 1 failed to start (a port taken, prometheus missing) or (status) not running,
2 bad arguments.
"""

import argparse
import os
import sys

from scripts.ops.prometheus import MissingBinary, Monitor
from scripts.ops.server import (
    DEFAULT_CONFIG,
    LOG_DIR,
    REPO,
    RUN_DIR,
    ProfileError,
    check_config,
    in_use_message,
    port_taken,
    read_properties,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_PORT = 9095
DEFAULT_EXPORTER_PORT = 8084


def monitor_for(args):
    if args.config:
        config = check_config(args.config)
    elif args.profile:
        config = check_config(REPO / "config" / f"{args.profile}.properties")
    else:
        config = check_config(os.environ.get("TS_PROFILE_CONFIG") or DEFAULT_CONFIG)
    props = read_properties(config)
    tokens = props.get("disable_token_authorization", "false").lower() != "true"
    return Monitor(
        RUN_DIR / "monitor",
        LOG_DIR,
        args.port,
        props.get("metrics_address", "http://127.0.0.1:8082"),
        props.get("management_address", "http://127.0.0.1:8081"),
        args.exporter_port,
        key_file=RUN_DIR / "key_file.json" if tokens else None,
    )


def start(monitor):
    if monitor.running():
        print(f"Prometheus is already running: {monitor.url} (`make monitor-stop` stops it)")
        return EXIT_OK
    ports = [monitor.port] + ([] if monitor.exporter.running() else [monitor.exporter_port])  # ours is reused
    taken = [port for port in ports if port_taken(port)]
    if taken:
        for port in taken:
            print(f"error: {in_use_message(port)}", file=sys.stderr)
        print("Stop that program or pick other ports: make monitor PROMETHEUS_PORT=... EXPORTER_PORT=...")
        return EXIT_FAILED
    try:
        monitor.start()
    except (MissingBinary, RuntimeError) as error:
        monitor.stop()
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"""Prometheus is up: {monitor.url}  (alerts: {monitor.url}/alerts, rules: {monitor.url}/rules)
  scraping  TorchServe {monitor.metrics}/metrics and the queue exporter {monitor.exporter_url}
  data      {monitor.run_dir.relative_to(REPO)}/data, logs {LOG_DIR.relative_to(REPO)}/prometheus.log
  dashboard deploy/monitoring/grafana-dashboard.json (import it in Grafana with this Prometheus as data source)
Stop it with: make monitor-stop""")
    return EXIT_OK


def status(monitor):
    if not monitor.running():
        print("Prometheus is not running (`make monitor` starts it)")
        return EXIT_FAILED
    exporter = "running" if monitor.exporter.running() else "NOT running"
    print(f"Prometheus is running (pid {monitor.prometheus.pid()}): {monitor.url}")
    print(f"  queue exporter {monitor.exporter_url}: {exporter}")
    for target in monitor.api("targets")["activeTargets"]:
        error = f" ({target['lastError']})" if target.get("lastError") else ""
        print(f"  target {target['labels']['job']:18} {target['scrapeUrl']}: {target['health']}{error}")
    return EXIT_OK


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.monitor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"Prometheus' port ({DEFAULT_PORT})")
    parser.add_argument(
        "--exporter-port", type=int, default=DEFAULT_EXPORTER_PORT, help=f"queue exporter's ({DEFAULT_EXPORTER_PORT})"
    )
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--profile", help="config/<PROFILE>.properties (default: $TS_PROFILE_CONFIG, else config.properties)"
    )
    choice.add_argument("--config", help="a properties file")
    args = parser.parse_args(argv)
    try:
        monitor = monitor_for(args)
    except ProfileError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.action == "stop":
        stopped = monitor.stop()
        print(f"stopped: {', '.join(stopped)}" if stopped else "Prometheus is not running (nothing to stop)")
        return EXIT_OK
    if args.action == "status":
        return status(monitor)
    return start(monitor)


if __name__ == "__main__":
    sys.exit(main())
