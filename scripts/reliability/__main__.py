"""Reliability suite: starts its own TorchServe servers, runs every check, prints and saves a report.

    python -m scripts.reliability                # full: 10,000 requests per model, 30 s overload, soak 2 min
    python -m scripts.reliability --quick        # the short form `make test` runs (minutes, no long phases)
    python -m scripts.reliability --only soak --soak-minutes 10      # (make soak MINUTES=10)

Checks: correctness under concurrency (every answer compared with that input's own in-process reference), the
bad-input corpus (4xx + message, worker PIDs unchanged), log bytes per request (no tracebacks or repeated lines),
overload at ~2x capacity (open loop against classifier-overload, heavy requests and a 16-request job queue: some
must be rejected, fast; the accepted ones correct; normal service afterwards: scripts/reliability/overload.py),
SIGKILL of a worker under load, a request that hangs past responseTimeout, the production profile's security
settings, unsafe model loading, a memory soak, and a fuzz campaign per model (generated valid and invalid requests
sent concurrently: scripts/reliability/fuzz.py), and a management-API campaign (every call TorchServe offers, good
and bad parameters, sent raw while every model is under load: scripts/reliability/management.py).
The report (table + JSON + markdown) goes to loadtests/reports/reliability-<time>/. Exit code 1 if a check failed.
"""

import argparse
import concurrent.futures
import datetime
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

from scripts import package
from scripts.ops.server import exit_on_sigterm, java_home, start_isolated
from scripts.reliability import correctness, cost, fuzz, management, overload, resilience, security
from scripts.reliability.hang_handler import HANG_MARKER
from scripts.reliability.logs import logs_check
from scripts.reliability.references import WindowCursor, reference_for
from scripts.reliability.rows import CheckFailed, Row
from scripts.reliability.soak import soak

REPO = Path(__file__).resolve().parents[2]
ALL_CHECKS = (
    "concurrency",
    "bad_input",
    "logs",
    "overload",
    "worker_kill",
    "hang",
    "security",
    "loading",
    "soak",
    "fuzz",
    "cost",
    "management",
)
HANG_TIMEOUT_S = 5


def build_hang_archive(store):
    """The classifier with the test-only hanging handler and a short responseTimeout, as classifier-hang.mar."""
    config = yaml.safe_load((REPO / "models/classifier/model-config.yaml").read_text())
    config.update(responseTimeout=HANG_TIMEOUT_S, batchSize=1, maxBatchDelay=1)
    config_path = store / "hang-model-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    package.make_archive(
        "classifier-hang",
        "1.0",
        REPO / "scripts/reliability/hang_handler.py",
        [(path, path.name) for path in sorted((REPO / "build/classifier/model").iterdir())],
        config_path,
        store / "classifier-hang.mar",
    )


def prepare_store(models, workdir):
    """Build (incrementally) the archives under test into model_store/, then copy them into a private store."""
    store = workdir / "store"
    store.mkdir(parents=True)
    for model in models:
        package.build(model, REPO / "model_store", log=lambda *_: None)
        shutil.copy2(REPO / "model_store" / f"{model}.mar", store)
    return store


def table(rows):
    lines = ["| check | figure | target | result |", "|---|---|---|---|"]
    lines += [f"| {r.check} | {r.figure} | {r.target} | {'pass' if r.passed else 'FAIL'} |" for r in rows]
    return "\n".join(lines)


def load_checks(server, model, cursor, selected, args, java, add):
    """Worker kill and soak on one model: sized from its measured capacity."""
    if not selected & {"worker_kill", "soak"}:
        return
    capacity = 10.0
    if "soak" in selected:
        try:
            capacity = resilience.measure_capacity(server, cursor.take(0), args.capacity_seconds)
        except CheckFailed as failure:
            add(failure.row)  # the load checks below are sized from it: report why, skip them
            return
        cursor.take(int(capacity * args.capacity_seconds))
        print(f"{model}: measured capacity ~{capacity:.0f} req/s (closed loop, 16 clients)", flush=True)
    if "worker_kill" in selected:
        add(resilience.worker_kill(server, cursor.take(int(capacity * 10))))
    if "soak" in selected:
        rate = max(1.0, capacity * 0.5)
        seconds = args.soak_minutes * 60
        add(soak(server, cursor.take(0), seconds, rate, java_home=java, warmup_seconds=min(60.0, seconds / 3)))


def reference_pool(model, store, args):
    """The inputs and reference answers of one model's checks: twice the concurrency check's inputs, because later
    phases start where earlier ones stopped."""
    return reference_for(model, store, 2 * args.requests, seed=7)


def model_checks(server, model, pool, selected, args, java, add):
    """Every per-model check against the main server; later phases send inputs earlier ones did not (Window)."""
    cursor = WindowCursor(pool)
    if "concurrency" in selected:
        add(correctness.concurrency(server, cursor.take(args.requests), args.requests, args.clients))
    if "bad_input" in selected:
        add(correctness.bad_input(server, pool))
    if "logs" in selected:  # log bytes per request, half good, half bad (scripts/reliability/logs.py)
        add(logs_check(server, cursor.take(args.requests // 2), args.requests))
    load_checks(server, model, cursor, selected, args, java, add)


def overload_check(server, store, args):
    """Twice the capacity of classifier-overload (heavy requests, a short job queue: overload.py), open loop."""
    heavy = overload.HeavyClassifierReference(store / f"{overload.MODEL}.mar")
    try:
        # Closed loop with as many clients as the queue holds: nothing may be refused while measuring.
        capacity = resilience.measure_capacity(server, heavy, args.capacity_seconds, clients=overload.QUEUE_SIZE)
    except CheckFailed as failure:
        return failure.row
    print(f"{overload.MODEL}: measured capacity ~{capacity:.0f} req/s of {overload.ROWS} rows each", flush=True)
    return resilience.overload(
        server,
        heavy,
        capacity,
        2.0,
        args.overload_seconds,
        rejection_p99_ms=args.rejection_p99_ms,
        queue_size=overload.QUEUE_SIZE,
    )


def production_checks(selected, models, store, workdir, java, started, add):
    """The production profile's security settings (its own server) and unsafe model loading."""
    if "security" in selected:
        production = REPO / "config" / "production.properties"
        if not production.exists():
            check = "production profile: tokens, allowed_urls, request size"
            add(Row(check, "not run: config/production.properties not found", "the production profile exists", False))
        else:
            secure = start_isolated(production, workdir / "production", store, java, models[:1])
            started.append(secure)
            first = reference_for(models[0], store, 1)
            add(security.security(secure, first.body(0), models[0], lambda answer: first.matches(0, answer)))
    if "loading" in selected:
        add(security.unsafe_loading())


def late_checks(server, store, selected, served, args, add):
    """The hanging request, then the management campaign on every served model (last: it scales each to 0 and
    back, and registers and unregisters a copy under load: scripts/reliability/management.py)."""
    if "hang" in selected:
        good = json.dumps({"inputs": [0.5] * 128}).encode()
        hanging = json.dumps({"inputs": [HANG_MARKER] + [0.5] * 127}).encode()
        add(resilience.hang(server, "classifier-hang", good, hanging, HANG_TIMEOUT_S))
    if "management" in selected:  # every served model under load: last, it scales each to 0 and back
        rows_of = management.campaign(
            server, served, store, rounds=args.management_rounds, clients=3, scale_served=True
        )
        for row in rows_of:
            add(row)


def run(args):
    java = java_home()
    # --quick leaves the fuzzer out: `make test` runs its short form against the session server
    # (tests/integration/test_fuzz_server.py). The management campaign scales every model to 0 and back: full form only.
    quick_skips = {"fuzz", "management"} if args.quick else set()
    selected = set(args.only.split(",")) if args.only else set(ALL_CHECKS) - quick_skips
    models = args.models.split(",")
    fuzz_models = args.fuzz_models.split(",") if selected & {"fuzz", "management"} else []
    cost_models = list(cost.COST_MODELS) if "cost" in selected else []
    extra = [model for model in dict.fromkeys(fuzz_models + cost_models) if model not in models]
    rows = []
    workdir = Path(tempfile.mkdtemp(prefix="reliability-"))
    started = []

    def add(row):
        rows.append(row)
        print(f"[{'pass' if row.passed else 'FAIL'}] {row.check}: {row.figure}", flush=True)

    try:
        store = prepare_store(models + extra, workdir)
        if "hang" in selected:
            build_hang_archive(store)
        if "overload" in selected:
            package.build("classifier", REPO / "model_store", log=lambda *_: None)
            overload.build_archive(REPO / "model_store" / "classifier.mar", store)
        served = models + extra + (["classifier-hang"] if "hang" in selected else [])
        served += [overload.MODEL] if "overload" in selected else []
        print(f"starting TorchServe with {', '.join(served)} ...", flush=True)
        # The reference answers (minilm's: sentence-transformers over thousands of texts, the longest part of --quick)
        # are computed while TorchServe starts, and are all ready before the first check, so that no check (capacity,
        # recovery after a kill) shares the CPU with them.
        with concurrent.futures.ThreadPoolExecutor(1) as computing:
            computed = {model: computing.submit(reference_pool, model, store, args) for model in models}
            server = start_isolated(REPO / "config.properties", workdir / "main", store, java, served)
            started.append(server)
            pools = {model: future.result() for model, future in computed.items()}
        for model in models:
            model_checks(server, model, pools[model], selected, args, java, add)
        if "overload" in selected:
            add(overload_check(server, store, args))
        for model in cost_models:  # worst-case time and worker RSS of maximum-size requests (cost.py)
            # --quick (make test) reports the times without a bound: they depend on the CPU kind and the load.
            time_target = None if args.quick else cost.TIME_TARGET_S
            add(cost.cost_check(server, model, store, args.cost_requests, time_target=time_target))
        for model in fuzz_models:  # generated valid and invalid requests (scripts/reliability/fuzz.py)
            add(fuzz.campaign(server, model, store, args.fuzz_requests, args.fuzz_seed))
        late_checks(server, store, selected, list(dict.fromkeys(models + fuzz_models)), args, add)
        server.stop()
        started.remove(server)
        production_checks(selected, models, store, workdir, java, started, add)
    finally:
        for server in started:
            server.stop()
    return rows


def save(rows, out_dir, args):
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "arguments": vars(args),
        "passed": all(r.passed for r in rows),
        "checks": [r.as_dict() for r in rows],
    }
    (out_dir / "reliability.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out_dir / "reliability.md").write_text(
        f"# Reliability report\n\nCommand: `python -m scripts.reliability {' '.join(sys.argv[1:])}`\n\n{table(rows)}\n"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.reliability", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short form for CI (fewer requests, short phases)")
    parser.add_argument("--models", default="classifier,minilm", help="comma-separated models to check")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(ALL_CHECKS)}")
    parser.add_argument("--requests", type=int, help="requests per model for the concurrency check (10000)")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    parser.add_argument(
        "--overload-seconds", type=float, help="length of the overload phase, against classifier-overload (30)"
    )
    parser.add_argument(
        "--rejection-p99-ms",
        type=float,
        help=f"bound on the overload's rejections' p99 ({resilience.REJECTION_P99_MS:g}; --quick: 250)",
    )
    parser.add_argument("--capacity-seconds", type=float, help="length of the capacity estimate (10)")
    parser.add_argument("--soak-minutes", type=float, help="length of the memory soak (2)")
    parser.add_argument(
        "--fuzz-models",
        default=",".join(fuzz.FUZZ_MODELS),
        help="models the fuzz check sends generated requests to (all three; served beside --models)",
    )
    parser.add_argument("--fuzz-requests", type=int, help="generated requests per model for the fuzz check (5000)")
    parser.add_argument("--fuzz-seed", type=int, default=0, help="the fuzz grammar's seed (0)")
    parser.add_argument(
        "--cost-requests",
        type=int,
        help="maximum-size requests per model before the cost check reads worker RSS again (100)",
    )
    parser.add_argument(
        "--management-rounds", type=int, default=3, help="rounds of every management call under load (3)"
    )
    parser.add_argument("--out", type=Path, help="report folder (default loadtests/reports/reliability-<time>)")
    args = parser.parse_args(argv)
    defaults = {
        "requests": (500, 10000),
        "overload_seconds": (6, 30),
        "rejection_p99_ms": (250.0, resilience.REJECTION_P99_MS),
        "capacity_seconds": (4, 10),
        "soak_minutes": (0.25, 2),
        "fuzz_requests": (300, 5000),
        "cost_requests": (30, 100),
    }
    for key, (quick, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    started = time.perf_counter()
    rows = run(args)
    out_dir = args.out or REPO / "loadtests" / "reports" / f"reliability-{time.strftime('%Y%m%d-%H%M%S')}"
    save(rows, out_dir, args)
    print(f"\n{table(rows)}\n\nreport: {out_dir} ({time.perf_counter() - started:.0f}s)")
    return 0 if rows and all(r.passed for r in rows) else 1


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
