"""Generation under concurrency: per-step scheduling against whole batches and against transformers' own server.

    python -m loadtests.generator_compare [--systems static,per-step,transformers-serve] [--users 1,4,16]
                                          [--seconds 1:120,4:150,16:180]
    make generator-compare

Each system (loadtests/generator_systems.py; all serve the measurement model, GPT-2 small's shape with random
weights) is started alone, warmed up, and loaded by Locust's ``CompletionsUser`` (loadtests/generator_user.py: OpenAI
completions, ``max_tokens`` drawn from 8 ... 256, 3 requests in 4 streamed, a closed loop) at each user count, then
stopped before the next starts. From every finished request's exact times (not Locust's buckets), leaving out the
first ``--settle`` seconds (10: Locust starts all users at once, so their first requests are prefilled together; that
first wave's worst time to first token is reported apart):

- time to first token p50 / p99 (streamed requests: to the first piece of text),
- inter-token p99 (every gap between two pieces of a stream),
- output tokens/s (tokens of the requests finished in the run / its length) and requests/s.

Percentiles are nearest-rank (scripts/ops/stats.py). The targets are recorded, never asserted: at 16 users per-step
reaches >= 2x the output tokens/s of whole batches, and its time to first token p99 at 16 users is <= 3x its figure
at 1 user. Writes loadtests/reports/generator-compare-<time>/compare.json and compare.md (the table, the targets,
the machine). Exit codes: 0 measured (a system that failed is in the report), 1 nothing could be measured, 2 bad
arguments.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from loadtests import generator_systems as systems
from scripts.ops import machine
from scripts.ops.server import exit_on_sigterm
from scripts.ops.stats import percentile

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "loadtests" / "reports"
DEFAULT_SECONDS = {1: 120, 4: 150, 16: 180}
# (what, system, users, other system, users, figure, at most / at least, factor): recorded, never asserted.
TARGETS = (
    ("output tokens/s at 16 users >= 2x whole batches", "per-step", 16, "static", 16, "tokens_per_s", ">=", 2.0),
    ("first-token p99 at 16 users <= 3x at 1 user", "per-step", 16, "per-step", 1, "first_token_p99_s", "<=", 3.0),
)


def figures(samples, seconds, settle):
    """The run's figures from its requests' samples (loadtests/generator_user.py Generation.sample), leaving out
    the first ``settle`` seconds: Locust starts every user at once, so the first requests all arrive together and are
    prefilled together (their first tokens are reported apart, as the first wave)."""
    begin = min((s["started"] for s in samples), default=0.0)
    wave = [s["first_token_s"] for s in samples if s["started"] < begin + 1.0 and s["first_token_s"] is not None]
    samples = [s for s in samples if s["ended"] >= begin + settle]  # finished in the measured window
    seconds -= settle
    done = [s for s in samples if s["error"] is None]
    streamed = [s for s in done if s["stream"] and s["started"] >= begin + settle]  # and started in it
    first = [s["first_token_s"] for s in streamed if s["first_token_s"] is not None]
    gaps = [gap for s in streamed for gap in s["gaps_s"]]
    tokens = sum(s["tokens"] or 0 for s in done)

    def rounded(value, digits=4):
        return None if value is None else round(value, digits)

    return {
        "requests": len(samples),
        "failed": len(samples) - len(done),
        "streamed": len(streamed),
        "first_wave_first_token_max_s": rounded(max(wave, default=None)),
        "first_token_p50_s": rounded(percentile(first, 0.5)),
        "first_token_p99_s": rounded(percentile(first, 0.99)),
        "inter_token_p50_s": rounded(percentile(gaps, 0.5)),
        "inter_token_p99_s": rounded(percentile(gaps, 0.99)),
        "total_p50_s": rounded(percentile([s["total_s"] for s in done], 0.5)),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 2),
        "requests_per_s": round(len(done) / seconds, 3),
        "errors": sorted({s["error"] for s in samples if s["error"]})[:5],
    }


def run_locust(endpoint, users, seconds, out_dir):
    """One closed-loop Locust run of CompletionsUser; returns its samples."""
    samples_path = out_dir / f"{endpoint.name}-{users}u.jsonl"
    samples_path.unlink(missing_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        GENERATOR_SAMPLES=str(samples_path),
        GENERATOR_COMPLETIONS_PATH=endpoint.completions_path,
        GENERATOR_MODEL=endpoint.model,
    )
    command = [str(Path(sys.executable).parent / "locust"), "-f", str(REPO / "loadtests" / "generator_user.py")]
    command += ["--headless", "-H", endpoint.base_url, "-u", str(users), "-r", str(users), "-t", f"{seconds}s"]
    command += ["--only-summary", "--stop-timeout", "0", "CompletionsUser"]
    with open(out_dir / f"{endpoint.name}-{users}u.locust.log", "wb") as log:
        subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=seconds + 300)
    if not samples_path.exists():
        return []
    return [json.loads(line) for line in samples_path.read_text().splitlines() if line.strip()]


def measure(system, user_counts, seconds, settle, out_dir, log):
    results = {}
    with systems.start(system, log, out_dir / "logs" / system) as endpoint:
        for users in user_counts:
            duration = seconds.get(users, 150)
            log(f"{system}: {users} user(s) for {duration} s ...")
            started = time.perf_counter()
            samples = run_locust(endpoint, users, duration, out_dir)
            elapsed = time.perf_counter() - started
            results[users] = figures(samples, duration, settle)
            log(f"{system} {users}u: {json.dumps(results[users])} ({elapsed:.0f} s)")
            drain(endpoint, results[users], log)
    return results


def drain(endpoint, figures_, log, timeout=180):
    """Wait until the requests Locust left unanswered at the end of a run are done: they would hold places of the
    next run's users (a plain request is not cancelled by its client's leaving; a whole batch never is)."""
    started = time.perf_counter()
    if endpoint.describe_url:  # ours: until nothing runs or waits in the worker
        while time.perf_counter() - started < timeout:
            scheduling = requests.post(endpoint.describe_url, timeout=60).json()["scheduling"]
            if scheduling["running"] == 0 and scheduling["waiting"] == 0:
                break
            time.sleep(1.0)
    else:  # the peer says nothing of its queue: the longest request's worth of steps at the run's pace
        gap = figures_.get("inter_token_p50_s") or 0.2
        time.sleep(min(timeout, 5 + 256 * gap))
    log(f"{endpoint.name}: drained in {time.perf_counter() - started:.0f} s")


def target_checks(results):
    checks = []
    for what, system, users, other, other_users, key, relation, factor in TARGETS:
        value = (results.get(system) or {}).get(users, {}).get(key)
        base = (results.get(other) or {}).get(other_users, {}).get(key)
        if value is None or not base:
            checks.append({"target": what, "met": None, "why": "not measured"})
            continue
        ratio = value / base
        met = ratio >= factor if relation == ">=" else ratio <= factor
        checks.append({"target": what, "ratio": round(ratio, 2), "needed": f"{relation} {factor}", "met": met})
    return checks


def markdown(report):
    lines = [
        f"Generator under concurrency, {report['machine']} [{report['cpu_tag']}], {report['date']}",
        "",
        "| system | users | first token p50 | first token p99 | inter-token p99 | output tokens/s | requests/s | "
        "requests (failed) | first wave: first token max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ms(value):
        return "-" if value is None else f"{value * 1000:.0f} ms"

    for system, by_users in report["results"].items():
        if "error" in by_users:
            lines.append(f"| {system} | - | could not run: {by_users['error']} | | | | | | |")
            continue
        for users, f in by_users.items():
            lines.append(
                f"| {system} | {users} | {ms(f['first_token_p50_s'])} | {ms(f['first_token_p99_s'])} | "
                f"{ms(f['inter_token_p99_s'])} | {f['tokens_per_s']} | {f['requests_per_s']} | "
                f"{f['requests']} ({f['failed']}) | {ms(f['first_wave_first_token_max_s'])} |"
            )
    lines += ["", "| target | ratio | needed | met |", "|---|---:|---:|---|"]
    for check in report["targets"]:
        lines.append(f"| {check['target']} | {check.get('ratio', '-')} | {check.get('needed', '-')} | {check['met']} |")
    lines += ["", "Systems:"] + [f"- {name}: {systems.DESCRIPTIONS[name]}" for name in report["results"]]
    return "\n".join(lines) + "\n"


def parse_seconds(text):
    try:
        return {int(users): int(seconds) for users, seconds in (part.split(":") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected users:seconds,..., got {text!r}") from None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.generator_compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--systems", default=",".join(systems.SYSTEMS), help="comma-separated, in order")
    parser.add_argument("--users", default="1,4,16", help="user counts, comma-separated (default 1,4,16)")
    parser.add_argument(
        "--seconds",
        type=parse_seconds,
        default=DEFAULT_SECONDS,
        help="run length per user count, users:seconds,... (default 1:120,4:150,16:180)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds at the start of each run left out of its figures (default 10; the first wave is reported apart)",
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(systems.SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {unknown}; known: {', '.join(systems.SYSTEMS)}")
    try:
        user_counts = [int(users) for users in args.users.split(",")]
    except ValueError:
        parser.error(f"--users: expected integers, got {args.users!r}")
    exit_on_sigterm()
    out_dir = REPORTS / f"generator-compare-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    out_dir.mkdir(parents=True)
    results = {}
    for system in chosen:
        try:
            results[system] = measure(system, user_counts, args.seconds, args.settle, out_dir, print)
        except Exception as error:  # one system that cannot run must not lose the others' figures
            print(f"{system}: could not be measured: {error}", file=sys.stderr)
            results[system] = {"error": str(error)[:300]}
    report = {
        "date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}",
        "machine": machine.describe(),
        "cpu_tag": machine.cpu_kind(),
        "model": systems.MODEL,
        "seconds": args.seconds,
        "settle_s": args.settle,
        "results": results,
        "targets": target_checks(results),
    }
    (out_dir / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "compare.md").write_text(markdown(report))
    print(markdown(report))
    print(f"report: {out_dir}")
    return 0 if any("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
