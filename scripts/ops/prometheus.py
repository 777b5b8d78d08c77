"""The one lifecycle of the monitoring processes: Prometheus (with the project's rules) and the queue exporter; used by
`make monitor` / `make monitor-stop` (scripts/monitor.py) and the tests.

Binaries: `prometheus` and `promtool` from Debian's `prometheus` package (no PyPI package ships them).
`python -m scripts.ops.prometheus install` (`make prometheus-tools`, which `make test` runs first) installs it with
apt-get when either binary is missing, and does nothing when both are there.

A Prometheus runs from deploy/monitoring/prometheus.yml rendered into its own folder (the rules file by absolute
path, the scrape targets and interval of the caller's choosing), keeps its data there and listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from scripts.ops.server import process_alive, stop_process_tree

REPO = Path(__file__).resolve().parents[2]
MONITORING_DIR = REPO / "deploy" / "monitoring"
CONFIG_TEMPLATE = MONITORING_DIR / "prometheus.yml"
RULES = MONITORING_DIR / "rules.yml"
BINARIES = ("prometheus", "promtool")
DEBIAN_PACKAGE = "prometheus"
# The scrape jobs of deploy/monitoring/prometheus.yml (the alert TorchServeTargetDown names them too).
TORCHSERVE_JOB, QUEUE_JOB = "torchserve", "torchserve-queue"


class MissingBinary(RuntimeError):
    """prometheus or promtool is not installed; the message says how to get it."""


def binary(name: str) -> str:
    """The path of `prometheus` or `promtool`; MissingBinary (with the fix) when it is not on PATH."""
    found = shutil.which(name)
    if not found:
        raise MissingBinary(
            f"`{name}` is not installed: `make prometheus-tools` installs Debian's `{DEBIAN_PACKAGE}` package "
            f"(as root: apt-get install --no-install-recommends {DEBIAN_PACKAGE}), which has prometheus and promtool"
        )
    return found


def install() -> int:
    """Install Debian's prometheus package when a binary is missing: 0 when both are there afterwards."""
    missing = [name for name in BINARIES if not shutil.which(name)]
    if not missing:
        return 0
    if os.geteuid() != 0:
        print(
            f"error: {', '.join(missing)} missing and this is not root: run "
            f"`sudo apt-get install --no-install-recommends {DEBIAN_PACKAGE}`",
            file=sys.stderr,
        )
        return 1
    print(f"{', '.join(missing)} missing: installing Debian's {DEBIAN_PACKAGE} package (apt-get) ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", DEBIAN_PACKAGE],
    ):
        result = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if result.returncode != 0:
            print(result.stdout[-4000:], file=sys.stderr)
            print(f"error: {' '.join(command)} failed (exit {result.returncode})", file=sys.stderr)
            return 1
    still = [name for name in BINARIES if not shutil.which(name)]
    if still:
        print(f"error: {', '.join(still)} still missing after installing {DEBIAN_PACKAGE}", file=sys.stderr)
        return 1
    return 0


def promtool(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def render_config(
    target: Path, torchserve: str, exporter: str | None, interval: str = "5s", rules: Path = RULES
) -> Path:
    """deploy/monitoring/prometheus.yml with these scrape targets ("host:port") and interval, the rules by path."""
    config = yaml.safe_load(CONFIG_TEMPLATE.read_text())
    config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = interval
    config["rule_files"] = [str(rules)]
    targets = {TORCHSERVE_JOB: torchserve, QUEUE_JOB: exporter}
    config["scrape_configs"] = [
        {**job, "static_configs": [{"targets": [targets[job["job_name"]]]}]}
        for job in config["scrape_configs"]
        if targets.get(job["job_name"])
    ]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


class Process:
    """A background process of ours with a pid file; ours = its command line contains `marker`."""

    def __init__(self, name: str, run_dir: Path, log: Path, marker: str):
        self.name, self.run_dir, self.log, self.marker = name, run_dir, log, marker
        self.pid_file = run_dir / f"{name}.pid"
        self.started: subprocess.Popen[bytes] | None = None  # when this process started it

    def exited(self) -> bool:
        """It stopped: for one this process started, its own exit status says so (a look at its command line just
        after the start was seen to miss it on a busy machine); otherwise it is no longer running."""
        if self.started is not None:
            return self.started.poll() is not None
        return not self.running()

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        """Alive and ours: a pid file outlives a process that was killed, and its pid may since name another one."""
        pid = self.pid()
        if not process_alive(pid):
            return False
        try:
            return self.marker in " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            return False

    def start(self, command: list[str]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.pid_file.write_text(f"{process.pid}\n")
        self.started = process

    def stop(self, grace: float = 10.0) -> bool:
        """Stop it if it runs (False when it did not); the pid file goes either way."""
        pid, ours = self.pid(), self.running()
        if ours and pid is not None:
            stop_process_tree(pid, grace)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap it when it is our child (the tests)
        with contextlib.suppress(OSError):
            self.pid_file.unlink()
        return ours


class Monitor:
    """Prometheus on 127.0.0.1:`port` scraping a TorchServe metrics address and a queue exporter it starts on
    `exporter_port` (reading `management_url`), everything under `run_dir`, logs under `log_dir`."""

    def __init__(
        self,
        run_dir: Path,
        log_dir: Path,
        port: int,
        metrics: str,
        management_url: str,
        exporter_port: int,
        interval: str = "5s",
        key_file: Path | None = None,
    ):
        self.run_dir, self.port, self.interval = Path(run_dir), port, interval
        self.metrics, self.management_url, self.exporter_port, self.key_file = (
            metrics,
            management_url,
            exporter_port,
            key_file,
        )
        self.config = self.run_dir / "prometheus.yml"
        self.url = f"http://127.0.0.1:{port}"
        self.prometheus = Process("prometheus", self.run_dir, Path(log_dir) / "prometheus.log", str(self.config))
        self.exporter = Process(
            "queue-exporter", self.run_dir, Path(log_dir) / "queue-exporter.log", "scripts.ops.queue_exporter"
        )
        self.exporter_url = f"http://127.0.0.1:{exporter_port}/metrics"

    def running(self) -> bool:
        return self.prometheus.running()

    def start(self, wait: float = 60.0) -> None:
        """Start the exporter and Prometheus and wait until Prometheus is ready (RuntimeError with its log's tail)."""
        prometheus = binary("prometheus")
        render_config(self.config, host_port(self.metrics), f"127.0.0.1:{self.exporter_port}", self.interval)
        exporter = [sys.executable, "-m", "scripts.ops.queue_exporter", "--port", str(self.exporter_port)]
        exporter += ["--management-url", self.management_url]
        if self.key_file:
            exporter += ["--key-file", str(self.key_file)]
        if not self.exporter.running():
            self.exporter.start(exporter)
        self.prometheus.start(
            [
                prometheus,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.run_dir / 'data'}",
                "--storage.tsdb.retention.time=7d",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ]
        )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.prometheus.exited():
                raise RuntimeError(f"prometheus exited at start:\n{tail(self.prometheus.log)}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"prometheus not ready within {wait:.0f}s:\n{tail(self.prometheus.log)}")

    def stop(self) -> list[str]:
        """Stop both; the names of those that were running."""
        return [process.name for process in (self.prometheus, self.exporter) if process.stop()]

    def query(self, expression: str) -> list[dict[str, Any]]:
        """An instant query's result vector (Prometheus' HTTP API)."""
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expression}, timeout=10).json()
        if answer.get("status") != "success":
            raise RuntimeError(f"query {expression!r}: {answer}")
        return answer["data"]["result"]

    def api(self, path: str) -> Any:
        """GET /api/v1/<path>'s data."""
        answer = requests.get(f"{self.url}/api/v1/{path}", timeout=10).json()
        if answer.get("status") != "success":
            raise RuntimeError(f"/api/v1/{path}: {answer}")
        return answer["data"]


def host_port(url: str) -> str:
    """ "http://127.0.0.1:8082" -> "127.0.0.1:8082"."""
    return url.split("//", 1)[-1].rstrip("/")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


@contextlib.contextmanager
def running_monitor(monitor: Monitor, wait: float = 60.0) -> Iterator[Monitor]:
    """A started monitor, always stopped afterwards."""
    try:
        monitor.start(wait)
        yield monitor
    finally:
        monitor.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.ops.prometheus", description=__doc__)
    parser.add_argument("action", choices=("install", "check"), help="install: the binaries when missing; check: say")
    args = parser.parse_args(argv)
    if args.action == "install":
        return install()
    try:
        for name in BINARIES:
            print(f"{name}: {binary(name)}")
    except MissingBinary as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
