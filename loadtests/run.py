"""Run one load-test profile with Locust (headless) and write a report folder.

    python -m loadtests.run --model minilm --profile steady [--users 8] [--duration 60] [--rate 20] [--workers 2]

Profiles (defaults in PROFILES; every one accepts --users/--duration, so CI can run any of them for seconds):
  smoke   2 closed-loop users for 5 s: does it work at all (CI)
  steady  constant closed-loop users
  step    closed-loop users added --step-users at a time every --step-seconds up to --users
  spike   --spike-base-users, a sudden jump to --users for --step-seconds, then back (recovery)
  open    open loop: requests start at --rate per second whatever the responses do (no coordinated omission)

Against --host when given (nothing is started), else against config.properties' server: used if it answers,
otherwise started for the run and stopped afterwards. A server with token authorization (the production profile)
gets the inference token from --token / $TS_INFERENCE_TOKEN (`make loadtest TOKEN=...`) or TorchServe's key file
(--key-file, default .run/key_file.json as `make serve PROFILE=production` writes it); see scripts/ops/auth.py.
The report folder loadtests/reports/<model>-<profile>-<time>/ holds Locust's CSVs (with full history) and HTML
report, locust.log, summary.json, summary.md and timeline.png; open-loop runs add open_loop.json (target vs achieved
rate).
Exit codes: 0 ran (failures, if any, are in the report), 1 Locust or the server failed (a refused token
included), 2 bad arguments (a named key file that cannot be used included).
"""

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from loadtests import preflight, prometheus, report
from loadtests.payloads import MODELS, traffic
from scripts.ops import auth
from scripts.ops.server import DEFAULT_CONFIG, development_server, exit_on_sigterm, free_ports

REPO = Path(__file__).resolve().parent.parent

REPORTS = REPO / "loadtests" / "reports"
LOCUSTFILE = REPO / "loadtests" / "locustfile.py"
SHAPES = {"step": REPO / "loadtests" / "shapes" / "step.py", "spike": REPO / "loadtests" / "shapes" / "spike.py"}
USER_CLASSES = {"classifier": "ClassifierUser", "minilm": "MinilmUser"}


@dataclass(frozen=True)
class Profile:
    users: int
    duration: float  # seconds
    open_loop: bool = False
    shape: str = ""
    rate: float = 0.0  # open loop: arrivals per second
    step_users: int = 2
    step_seconds: float = 15.0
    spike_base_users: int = 2


PROFILES = {
    "smoke": Profile(users=2, duration=5),
    "steady": Profile(users=8, duration=60),
    "step": Profile(users=16, duration=120, shape="step", step_users=2, step_seconds=15),
    "spike": Profile(users=32, duration=60, shape="spike", step_seconds=20, spike_base_users=2),
    "open": Profile(users=1, duration=60, open_loop=True, rate=20.0),
}


@dataclass
class LoadTest:
    """Everything one run needs besides the server's URLs."""

    model: str
    profile: str
    users: int
    duration: float
    rate: float = 0.0
    workers: int = 0
    step_users: int = 2
    step_seconds: float = 15.0
    spike_base_users: int = 2
    think_ms: float = 0.0
    payload_seed: int = 0
    arrivals: str = "poisson"
    max_in_flight: int = 512
    late_ms: float = 10.0
    max_retries: int = 3
    drain_seconds: float = 5.0
    extra_locust_args: list = field(default_factory=list)

    @property
    def open_loop(self):
        return PROFILES[self.profile].open_loop


def settings_for(model, profile, **overrides):
    """A LoadTest from a profile's defaults and the given overrides (None = keep the default)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose from {sorted(PROFILES)}")
    traffic(model)  # raises for an unknown model
    base = PROFILES[profile]
    settings = LoadTest(
        model=model,
        profile=profile,
        users=base.users,
        duration=base.duration,
        rate=base.rate,
        step_users=base.step_users,
        step_seconds=base.step_seconds,
        spike_base_users=base.spike_base_users,
    )
    return replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def locust_commands(settings, host, prefix, html, open_loop_report, final_stats):
    """The master (or only) Locust command and the worker commands, as argument lists."""
    locust = str(Path(sys.executable).parent / "locust")
    shape = PROFILES[settings.profile].shape
    files = [str(LOCUSTFILE)] + ([str(SHAPES[shape])] if shape else [])
    users = settings.users
    if settings.open_loop and settings.workers:
        users = settings.workers  # one open-loop user per worker process, each at rate / workers
    custom = [
        "--model",
        settings.model,
        "--payload-seed",
        str(settings.payload_seed),
        "--think-ms",
        str(settings.think_ms),
        "--max-retries",
        str(settings.max_retries),
        "--rate",
        str(settings.rate),
        "--open-loop-users",
        str(users),
        "--arrivals",
        settings.arrivals,
        "--max-in-flight",
        str(settings.max_in_flight),
        "--late-ms",
        str(settings.late_ms),
        "--drain-seconds",
        str(settings.drain_seconds),
        "--final-stats",
        str(final_stats),
        "--step-users",
        str(settings.step_users),
        "--step-seconds",
        str(settings.step_seconds),
        "--spike-base-users",
        str(settings.spike_base_users),
    ]
    if open_loop_report:
        custom += ["--open-loop-report", str(open_loop_report)]
    user_class = "OpenLoopUser" if settings.open_loop else USER_CLASSES.get(settings.model, "EmbeddingUser")
    master = [
        locust,
        "-f",
        ",".join(files),
        "--headless",
        "-H",
        host,
        "-u",
        str(users),
        # Closed loop: all users within ~1 s, so the run measures the level, not the ramp.
        "-r",
        str(max(1, users)),
        "-t",
        f"{int(round(settings.duration))}s",
        "--csv",
        str(prefix),
        "--csv-full-history",
        "--html",
        str(html),
        "--only-summary",
        # At the end, let requests in flight finish (and count) instead of dropping them; no new ones start.
        "--stop-timeout",
        f"{max(1, round(settings.drain_seconds))}s",
        "--exit-code-on-error",
        "0",
        *custom,
        *settings.extra_locust_args,
    ]
    workers = []
    if settings.workers:
        (port,) = free_ports(1)
        master += [
            "--master",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(port),
            "--expect-workers",
            str(settings.workers),
            "--expect-workers-max-wait",
            "60",
        ]
        worker = [
            locust,
            "-f",
            ",".join(files),
            "--worker",
            "--master-host",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--only-summary",
            *custom,
        ]
        workers = [list(worker) for _ in range(settings.workers)]
    master.append(user_class)
    for command in workers:
        command.append(user_class)
    return master, workers


class CpuMonitor:
    """Samples the CPU time of a set of processes (the load generator) and of the whole machine."""

    def __init__(self, interval=0.5):
        import psutil

        self.psutil = psutil
        self.interval = interval
        self.processes = []
        self.last_seen = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self, pids):
        self.processes = [self.psutil.Process(pid) for pid in pids]
        self.machine_before = self.psutil.cpu_times()
        self.started = time.time()
        self.thread.start()

    def _sample(self):
        for process in self.processes:
            try:
                for member in [process] + process.children(recursive=True):
                    times = member.cpu_times()
                    self.last_seen[member.pid] = times.user + times.system
            except self.psutil.Error:
                continue  # exited: its last sample stands

    def _loop(self):
        while not self.stop_event.wait(self.interval):
            self._sample()

    def stop(self):
        self.stop_event.set()
        self.thread.join()
        wall = time.time() - self.started
        after = self.psutil.cpu_times()
        busy = (sum(after) - after.idle - getattr(after, "iowait", 0)) - (
            sum(self.machine_before) - self.machine_before.idle - getattr(self.machine_before, "iowait", 0)
        )
        total = sum(after) - sum(self.machine_before)
        cores = self.psutil.cpu_count() or 1
        cpu_seconds = sum(self.last_seen.values())
        return {
            "cpu_seconds": round(cpu_seconds, 2),
            "wall_seconds": round(wall, 2),
            "cores": cores,
            "cpu_share": round(cpu_seconds / (wall * cores), 3) if wall else None,
            "machine_busy_share": round(busy / total, 3) if total else None,
        }


def run_locust(master, workers, log_path, env, timeout_s):
    """Run the Locust master and its workers to the end, all output into `log_path`, with the load generator's CPU use
    measured; (master's exit code or None if it ran past `timeout_s`, CpuMonitor figures). Never leaves one running."""
    monitor = CpuMonitor()
    with open(log_path, "wb") as locust_log:
        processes = [subprocess.Popen(master, stdout=locust_log, stderr=subprocess.STDOUT, cwd=REPO, env=env)]
        processes += [
            subprocess.Popen(command, stdout=locust_log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
            for command in workers
        ]
        monitor.start([process.pid for process in processes])
        try:
            returncode = processes[0].wait(timeout=timeout_s)
            for worker in processes[1:]:
                worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            generator = monitor.stop()
    return returncode, generator


def run(settings, host, metrics_url=None, report_dir=None, log=print, token=None):
    """Run Locust for `settings` against `host` (sending `token` as a bearer token when given: a token, or a KeySource
    whose key file Locust then reads itself, after rotations too); write the report folder; return the summary."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    report_dir = Path(report_dir or REPORTS / f"{settings.model}-{settings.profile}-{stamp}")
    report_dir.mkdir(parents=True, exist_ok=True)
    prefix, html = report_dir / "locust", report_dir / "report.html"
    open_loop_file, final_stats = report_dir / "open_loop.json", report_dir / "final_stats.json"
    master, workers = locust_commands(
        settings, host, prefix, html, open_loop_file if settings.open_loop else "", final_stats
    )
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    # The token travels in the environment, not on Locust's command line (which the summary records); a key file's
    # as the file's path, so Locust re-reads it when the server's keys are rotated during the run.
    keys = auth.KeySource.of(token)
    env.pop(auth.TOKEN_ENV, None)
    env.pop(auth.KEY_FILE_ENV, None)
    if keys.renewable:
        env[auth.KEY_FILE_ENV] = str(keys.key_file)
    elif keys.key():
        env[auth.TOKEN_ENV] = keys.key()

    before = prometheus.scrape(metrics_url) if metrics_url else None
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    log(
        f"locust: {settings.profile} profile, {settings.model}, {settings.duration:g} s "
        f"({'rate ' + format(settings.rate, 'g') + '/s' if settings.open_loop else str(settings.users) + ' users'}"
        f"{', ' + str(settings.workers) + ' workers' if settings.workers else ''}) -> {report_dir}"
    )
    returncode, generator = run_locust(master, workers, report_dir / "locust.log", env, settings.duration + 180)
    after = prometheus.scrape(metrics_url) if metrics_url else None
    stats_csv = Path(f"{prefix}_stats.csv")
    if returncode != 0 or not (final_stats.exists() or stats_csv.exists()):
        tail = (report_dir / "locust.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(
            f"Locust {'timed out' if returncode is None else f'exited {returncode}'}; "
            f"log tail ({report_dir / 'locust.log'}):\n{tail}"
        )

    summary = {
        "model": settings.model,
        "profile": settings.profile,
        "host": host,
        "started_at": started_at,
        "duration_s": settings.duration,
        "users": settings.workers if settings.open_loop and settings.workers else settings.users,
        "workers": settings.workers,
        "token": token_summary(keys),
    }
    if final_stats.exists():
        summary.update(json.loads(final_stats.read_text()))
        summary["stats_source"] = "final_stats.json (Locust's stats after every user stopped)"
    else:
        summary.update(report.read_stats(stats_csv))
        summary["failure_reasons"] = report.read_failures(f"{prefix}_failures.csv")
        summary["stats_source"] = "locust_stats.csv (may miss the run's last second)"
    summary["queue_full_503"] = sum(
        row["occurrences"] for row in summary["failure_reasons"] if row["error"].startswith("503")
    )
    if settings.open_loop:
        summary["late_ms"] = settings.late_ms
        summary["open_loop"] = (
            json.loads(open_loop_file.read_text())
            if open_loop_file.exists()
            else {"target_rate": settings.rate, "achieved_rate": None, "note": "generator wrote no counters"}
        )
        summary["target_rate"] = summary["open_loop"]["target_rate"]
        summary["achieved_rate"] = summary["open_loop"]["achieved_rate"]
    summary["generator"] = generator
    if metrics_url:
        summary["server"] = server_side(settings, before, after)
    summary["settings"] = asdict(settings)
    summary["command"] = " ".join(master)
    summary["files"] = sorted(p.name for p in report_dir.iterdir())
    history = report.read_history(f"{prefix}_stats_history.csv")
    if report.plot_history(
        history, report_dir / "timeline.png", f"{settings.model} / {settings.profile}: latency and throughput over time"
    ):
        summary["files"] = sorted(set(summary["files"]) | {"timeline.png"})
    summary["files"] = sorted(set(summary["files"]) | {"summary.json", "summary.md"})
    summary["report_dir"] = str(report_dir)
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (report_dir / "summary.md").write_text(report.render_markdown(summary))
    return summary


def server_side(settings, before, after):
    """The server's figures for the run: those of the model the traffic is sent to (a network's traffic name such as
    ranking-oip names no model the server has)."""
    return prometheus.server_figures(before, after, traffic(settings.model).served_model)


def headline(summary):
    """One line for the terminal."""
    text = (
        f"{summary['model']}/{summary['profile']}: {summary['requests']} requests, {summary['failures']} failures, "
        f"{summary['rps']} req/s, p50 {summary['p50_ms']} ms, p95 {summary['p95_ms']} ms, "
        f"p99 {summary['p99_ms']} ms, p99.9 {summary['p999_ms']} ms"
    )
    if summary.get("open_loop"):
        loop = summary["open_loop"]
        text += (
            f"; open loop: target {loop['target_rate']}/s, achieved {loop['achieved_rate']}/s, "
            f"late {loop.get('late_starts')}, not started {loop.get('not_started')}"
        )
    generator = summary.get("generator") or {}
    if generator.get("cpu_share") is not None:
        text += f"; Locust used {generator['cpu_share']:.0%} of the machine"
    return text


def add_settings_arguments(parser, profile_default="steady"):
    parser.add_argument(
        "--model",
        required=True,
        help=f"model to load-test: {', '.join(sorted(MODELS))}, or an embedding model packaged from its folder (open "
        "loop: --profile open)",
    )
    parser.add_argument("--profile", default=profile_default, choices=sorted(PROFILES), help="load profile")
    parser.add_argument(
        "--users", type=int, help="users (closed loop; the peak for step/spike); open loop: ignored with --workers"
    )
    parser.add_argument("--duration", type=float, help="seconds")
    parser.add_argument("--rate", type=float, help="open profile: target arrivals per second (total)")
    parser.add_argument("--workers", type=int, default=0, help="run Locust distributed: master + N local workers")
    parser.add_argument("--step-users", type=int, help="step profile: users added per step")
    parser.add_argument("--step-seconds", type=float, help="step/spike profile: seconds per step or phase")
    parser.add_argument("--spike-base-users", type=int, help="spike profile: users outside the spike")
    parser.add_argument("--think-ms", type=float, help="closed loop: mean pause between a user's requests")
    parser.add_argument("--payload-seed", type=int, help="seed of the payload mix (default 0)")
    parser.add_argument("--arrivals", choices=("poisson", "uniform"), help="open loop: arrival process")
    parser.add_argument("--max-in-flight", type=int, help="open loop: most open requests per generator process")


def settings_from_args(args, profile=None):
    values = {
        key: getattr(args, key, None)
        for key in (
            "users",
            "duration",
            "rate",
            "workers",
            "step_users",
            "step_seconds",
            "spike_base_users",
            "think_ms",
            "payload_seed",
            "arrivals",
            "max_in_flight",
        )
    }
    return settings_for(args.model, profile or args.profile, **values)


def token_summary(keys):
    """How the run sent its token, for the summary (never the token itself)."""
    if keys.renewable:
        return f"sent (Authorization: Bearer), from {keys.key_file}, re-read after a rotation"
    return "sent (Authorization: Bearer)" if keys.key() else "none"


def add_server_arguments(parser, what):
    """Where the traffic goes: --host (nothing started), else the config's server (used or started), and the
    inference token; `what` names the report folder's default."""
    parser.add_argument("--host", help="inference URL of a running server (nothing is started); e.g. a baseline")
    parser.add_argument("--metrics-url", help="Prometheus endpoint to scrape before/after (default: the config's)")
    parser.add_argument(
        "--config",
        default=os.environ.get("TS_PROFILE_CONFIG") or str(DEFAULT_CONFIG),
        help="properties of the server to use or start when --host is not given (default "
        "$TS_PROFILE_CONFIG, else config.properties)",
    )
    parser.add_argument("--out", help=f"report folder (default loadtests/reports/{what}-<time>)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of the headline")
    auth.add_token_arguments(parser)


@contextlib.contextmanager
def target_server(args, model, log):
    """(inference URL, metrics URL or None, token) of the server to measure: --host, else the config's (started for
    the run when nothing answers). One checked request first, so a missing model or token fails in seconds."""
    if args.host:
        token = preflight.resolve_token(args, log)
        preflight.wait_for_model(args.host, model, token=token)
        yield args.host, args.metrics_url, token
        return
    with development_server(args.config, log=log) as urls:
        token = preflight.resolve_token(args, log)  # after the start: a server started here writes the key file
        preflight.wait_for_model(urls["inference"], model, token=token)
        yield urls["inference"], args.metrics_url or urls["metrics"], token


def run_cli(args, model, measure, log):
    """Run `measure(inference_url, metrics_url, token)` against the target server; (exit code, result)."""
    try:
        with target_server(args, model, log) as (inference_url, metrics_url, token):
            return 0, measure(inference_url, metrics_url, token)
    except auth.KeyFileError as error:  # a named key file that cannot be used
        print(f"error: {error}", file=sys.stderr)
        return 2, None
    except (RuntimeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1, None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_settings_arguments(parser)
    add_server_arguments(parser, "<model>-<profile>")
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as error:
        parser.error(str(error))
    if settings.users < 1 or settings.duration <= 0 or (settings.open_loop and settings.rate <= 0):
        parser.error("--users must be >= 1, --duration > 0 and (open profile) --rate > 0")

    log = (lambda *_: None) if args.json else print
    code, summary = run_cli(
        args,
        settings.model,
        lambda inference_url, metrics_url, token: run(
            settings, inference_url, metrics_url, args.out, log=log, token=token
        ),
        log,
    )
    if summary is None:
        return code
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(headline(summary))
        print(f"report: {summary['report_dir']}/summary.md")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
