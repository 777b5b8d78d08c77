"""Capacity at a latency SLO: the highest open-loop arrival rate whose p99 stays within the SLO with no failures.

    python -m loadtests.capacity --model minilm --slo-ms 100 [--start-rate 8] [--step-seconds 20]

Each step is an open-loop run (loadtests.run, profile ``open``) at one target rate. The search grows the rate
geometrically (x --growth) until a step misses the SLO, then bisects between the last good and the first bad rate
until they are within --tolerance of each other. A step passes when p99 <= SLO, there were no failures (a 503 from a
full queue is one), no request was still open at the end, and the generator kept its schedule (no arrival dropped
at the in-flight cap, at most --max-late-share of the starts late): a generator that could not keep up measured
itself, not the server. A step lasts --step-seconds or as long as --min-requests arrivals take at its rate, whichever
is longer (capped at --max-step-seconds): a p99 needs enough samples to mean anything (48 requests, 12 s at 4/s,
make their p99 the single slowest one, and two long texts arriving together then fail a step that a rerun passes).
(The achieved rate is reported but not judged: a short Poisson schedule offers a little more or less than its target
by chance, which is not a generator failure.)

One step is one sample of a noisy machine: a neighbour's burst can fail a rate the server sustains, and a lucky window
can pass one it does not. So a step that fails, or passes with its p99 above --margin x SLO, is run again before the
search moves, up to --confirm runs of that rate: the rate passes when most of its runs pass (best of 3 by default,
stopping as soon as the majority is known; an even split counts as a failure, the cautious side). --confirm 1 is
the single-step search. The report lists every run and, per rate, how many runs passed and the spread (min, median,
max) of p99 and achieved rate; the capacity's own spread is the spread of its rate's runs.

Writes loadtests/reports/capacity-<model>-<time>/: capacity.json and capacity.md (the result and the curve: offered
rate vs achieved rate, throughput, p50, p99), capacity.png, and each step's full load-test report in step-NN-<rate>/.
Against a server with token authorization (the production profile) every step sends the inference token: --token /
$TS_INFERENCE_TOKEN (`make capacity TOKEN=...`) or TorchServe's key file (--key-file, default .run/key_file.json).
Exit codes: 0 searched (even if no rate passed: see the report), 1 a run or the server failed (a refused token
included), 2 bad arguments (a named key file that cannot be used included).
"""

import argparse
import datetime
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtests import run as loadtest
from scripts.ops.server import exit_on_sigterm

REPO = Path(__file__).resolve().parent.parent

REPORTS = REPO / "loadtests" / "reports"


@dataclass
class Step:
    """One measured open-loop step."""

    rate: float  # offered (target) arrivals per second
    p50_ms: float | None
    p99_ms: float | None
    failures: int
    requests: int = 0
    achieved_rate: float | None = None  # the generator's actual start rate
    throughput: float | None = None  # completed requests per second
    unfinished: int = 0
    late_share: float = 0.0  # starts more than --late-ms behind schedule, as a share of all starts
    not_started: int = 0  # arrivals dropped at the generator's in-flight cap
    passed: bool = False
    reason: str = ""
    report_dir: str = ""
    run: int = 1  # 1 for a rate's first run, 2, 3 ... for its confirmations


def judge(step, slo_ms, max_late_share=0.1):
    """Set step.passed and step.reason (the first thing that failed) for this SLO."""
    if step.requests == 0 or step.p99_ms is None:
        step.passed, step.reason = False, "no completed requests"
    elif step.failures:
        step.passed, step.reason = False, f"{step.failures} failures"
    elif step.unfinished:
        step.passed, step.reason = False, f"{step.unfinished} requests still open at the end"
    elif step.p99_ms > slo_ms:
        step.passed, step.reason = False, f"p99 {step.p99_ms:g} ms > SLO {slo_ms:g} ms"
    elif step.not_started or step.late_share > max_late_share:
        step.passed, step.reason = (
            False,
            (
                f"the load generator fell behind ({step.not_started} not started, "
                f"{step.late_share:.0%} late): its limit, not the server's"
            ),
        )
    else:
        step.passed, step.reason = True, "ok"
    return step


def grow_to_bracket(attempt, tried, start_rate, max_rate, growth, min_rate, max_steps):
    """Phase 1: grow until a rate fails (or the cap / step budget is reached); on a first failure, shrink instead.

    ``attempt(rate) -> passed`` appends one entry per rate to ``tried``. Returns (last good rate, first bad rate,
    why it stopped or "")."""
    good, bad = None, None
    rate = start_rate
    while len(tried) < max_steps:
        if attempt(rate):
            good = rate
            if bad is not None:
                break
            if rate >= max_rate:
                return good, bad, f"reached --max-rate {max_rate:g}/s without missing the SLO"
            rate = min(rate * growth, max_rate)
        else:
            bad = rate
            if good is not None:
                break
            if rate / growth < min_rate:
                return good, bad, f"even {rate:g}/s missed the SLO"
            rate = rate / growth
    return good, bad, ""


def bisect_bracket(attempt, tried, good, bad, tolerance, max_steps):
    """Phase 2: bisect (geometric midpoint) between the last good and the first bad rate."""
    while len(tried) < max_steps:
        if (bad - good) / good <= tolerance:
            return good, bad, f"bracket within {tolerance:.0%}"
        middle = (good * bad) ** 0.5
        if attempt(middle):
            good = middle
        else:
            bad = middle
    return good, bad, ""


def needs_another_run(runs, slo_ms, confirm, margin):
    """Whether a rate's runs so far leave its verdict open: a failure, or a pass with p99 above margin x SLO, is
    confirmed, until the majority of ``confirm`` runs is known either way."""
    if len(runs) >= confirm:
        return False
    passes = sum(step.passed for step in runs)
    majority = confirm // 2 + 1
    if passes >= majority or len(runs) - passes > confirm - majority:
        return False  # decided: enough passes, or too many failures for a majority of passes
    latest = runs[-1]
    return not latest.passed or (latest.p99_ms or 0.0) > margin * slo_ms or passes < len(runs)


def spread(values):
    """min / median / max of the values that were measured (None where none was)."""
    values = sorted(value for value in values if value is not None)
    if not values:
        return None
    return {"min": values[0], "median": statistics.median(values), "max": values[-1]}


def rate_summary(rate, runs, confirm):
    """One rate's verdict from its runs (most of them must pass; an even split fails) and their spread."""
    passes = sum(step.passed for step in runs)
    return {
        "rate": rate,
        "runs": len(runs),
        "passes": passes,
        "passed": passes > len(runs) / 2,
        "confirmed": len(runs) > 1,
        "p99_ms": spread(step.p99_ms for step in runs),
        "p50_ms": spread(step.p50_ms for step in runs),
        "achieved_rate": spread(step.achieved_rate for step in runs),
        "reasons": [step.reason for step in runs],
    }


def search(
    measure,
    slo_ms,
    start_rate,
    max_rate,
    growth=2.0,
    tolerance=0.1,
    max_steps=12,
    min_rate=0.5,
    max_late_share=0.1,
    log=print,
    confirm=3,
    margin=0.85,
):
    """Highest passing rate found by geometric growth then bisection. ``measure(rate) -> Step``.

    A rate whose run fails, or passes with p99 > margin x SLO, is run again (up to ``confirm`` runs) and decided by
    the majority of its runs; ``max_steps`` counts rates, not runs. Returns ``{"capacity_rate", "steps" (every run),
    "rates" (one summary per rate tried, in order), "capacity_spread", "at_capacity", "bracket",
    "stopped_because"}``; capacity_rate is None when even the lowest rate tried failed.
    """
    if not (0 < start_rate <= max_rate) or growth <= 1 or tolerance <= 0:
        raise ValueError("need 0 < start_rate <= max_rate, growth > 1 and tolerance > 0")
    if confirm < 1 or not 0 < margin <= 1:
        raise ValueError("need confirm >= 1 and 0 < margin <= 1")
    steps, tried = [], []

    def attempt(rate):
        runs = []
        while not runs or needs_another_run(runs, slo_ms, confirm, margin):
            step = judge(measure(rate), slo_ms, max_late_share)
            step.run = len(runs) + 1
            runs.append(step)
            steps.append(step)
            log(
                f"  step {len(tried) + 1:2d}{'' if step.run == 1 else f' (run {step.run})'}: {rate:8.2f}/s -> "
                f"p50 {step.p50_ms} ms, p99 {step.p99_ms} ms, {step.failures} failures, achieved "
                f"{step.achieved_rate}/s: {'PASS' if step.passed else 'FAIL'} ({step.reason})"
            )
        summary = rate_summary(rate, runs, confirm)
        tried.append(summary)
        if len(runs) > 1:
            log(f"           {rate:8.2f}/s: {summary['passes']} of {len(runs)} runs passed")
        return summary["passed"]

    good, bad, stopped = grow_to_bracket(attempt, tried, start_rate, max_rate, growth, min_rate, max_steps)
    if not stopped and good is not None and bad is not None:
        good, bad, stopped = bisect_bracket(attempt, tried, good, bad, tolerance, max_steps)
    if not stopped:
        stopped = f"step budget ({max_steps}) used" if len(tried) >= max_steps else f"bracket within {tolerance:.0%}"
    at_rate = [step for step in steps if good is not None and step.rate == good]
    passing = [step for step in at_rate if step.passed]
    return {
        "capacity_rate": round(good, 3) if good is not None else None,
        "steps": steps,
        "rates": tried,
        "capacity_spread": next((summary for summary in tried if summary["rate"] == good), None),
        # The run whose report stands for the capacity: the passing run at that rate with the median p99.
        "at_capacity": sorted(passing, key=lambda step: step.p99_ms or 0.0)[(len(passing) - 1) // 2]
        if passing
        else None,
        "bracket": [good, bad],
        "stopped_because": stopped,
    }


def step_from_summary(rate, summary):
    open_loop = summary.get("open_loop") or {}
    started = open_loop.get("started") or 0
    return Step(
        rate=rate,
        p50_ms=summary.get("p50_ms"),
        p99_ms=summary.get("p99_ms"),
        failures=summary.get("failures", 0),
        requests=summary.get("requests", 0),
        achieved_rate=open_loop.get("achieved_rate"),
        throughput=summary.get("rps"),
        unfinished=open_loop.get("unfinished_at_stop") or 0,
        late_share=round((open_loop.get("late_starts") or 0) / started, 4) if started else 0.0,
        not_started=open_loop.get("not_started") or 0,
        report_dir=summary.get("report_dir", ""),
    )


def step_duration(rate, step_seconds, min_requests=0, max_step_seconds=None):
    """Seconds a step at ``rate`` runs: at least step_seconds, long enough for about min_requests arrivals, but no
    longer than max_step_seconds (a system that misses the SLO at 1/s need not be watched for 5 minutes)."""
    seconds = max(step_seconds, min_requests / rate if min_requests else 0.0)
    return min(seconds, max(step_seconds, max_step_seconds)) if max_step_seconds else seconds


def measure_with_locust(
    host,
    model,
    out_dir,
    step_seconds,
    metrics_url=None,
    cooldown_seconds=2.0,
    workers=0,
    payload_seed=0,
    arrivals="poisson",
    log=print,
    min_requests=0,
    max_step_seconds=None,
    token=None,
):
    """A ``measure(rate)`` that runs one open-loop Locust step per call into out_dir/step-NN-<rate>/."""
    counter = {"n": 0}

    def measure(rate):
        counter["n"] += 1
        duration = round(step_duration(rate, step_seconds, min_requests, max_step_seconds), 1)
        # Each step its own payload seed: a step repeating the previous step's texts would be answered from the
        # worker's embedding cache and pass at rates fresh traffic cannot sustain.
        settings = loadtest.settings_for(
            model,
            "open",
            rate=rate,
            duration=duration,
            workers=workers,
            payload_seed=payload_seed + counter["n"],
            arrivals=arrivals,
        )
        folder = Path(out_dir) / f"step-{counter['n']:02d}-{rate:.1f}"
        summary = loadtest.run(settings, host, metrics_url, folder, log=lambda *_: None, token=token)
        time.sleep(cooldown_seconds)  # let an overloaded server drain its queue before the next step
        return step_from_summary(rate, summary)

    return measure


def plot_curve(steps, slo_ms, png_path, title, capacity_rate=None):
    if not steps:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(steps, key=lambda step: step.rate)
    rates = [step.rate for step in ordered]
    figure, (latency, throughput) = plt.subplots(1, 2, figsize=(11, 4.5))
    latency.plot(rates, [step.p50_ms for step in ordered], "o-", label="p50")
    latency.plot(rates, [step.p99_ms for step in ordered], "o-", label="p99")
    latency.axhline(slo_ms, color="tab:red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    for step in ordered:
        if not step.passed:
            latency.plot([step.rate], [step.p99_ms or slo_ms], "x", color="tab:red", markersize=10)
    if capacity_rate:
        latency.axvline(capacity_rate, color="tab:green", linestyle=":", label=f"capacity {capacity_rate:g}/s")
    latency.set_xlabel("offered rate (requests/s, open loop)")
    latency.set_ylabel("response time (ms)")
    latency.set_yscale("log")
    latency.legend()
    latency.grid(alpha=0.3, which="both")
    latency.set_title(title)
    throughput.plot(rates, rates, "--", color="tab:gray", label="offered")
    throughput.plot(rates, [step.throughput for step in ordered], "o-", color="tab:green", label="completed/s")
    throughput.set_xlabel("offered rate (requests/s)")
    throughput.set_ylabel("requests/s")
    throughput.legend()
    throughput.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return True


def spread_text(values):
    return "–" if not values else f"{values['min']:g} / {values['median']:g} / {values['max']:g}"


def render_spread(result):
    """The per-rate verdicts: how many of each rate's runs passed and the spread of its runs."""
    rates = result.get("rates") or []
    if not any(summary["runs"] > 1 for summary in rates):
        return []
    lines = [
        "",
        f"## Repeated rates (a rate passes when most of its runs pass; up to {result.get('confirm')} runs, a pass "
        f"with p99 > {result.get('margin')} x SLO confirmed too)",
        "",
        "| offered /s | runs passed | p99 ms min / median / max | achieved /s min / median / max | verdict |",
        "|---:|---:|---|---|---|",
    ]
    for summary in sorted(rates, key=lambda summary: summary["rate"]):
        lines.append(
            f"| {summary['rate']:.2f} | {summary['passes']} of {summary['runs']} | {spread_text(summary['p99_ms'])} | "
            f"{spread_text(summary['achieved_rate'])} | {'pass' if summary['passed'] else 'FAIL'} |"
        )
    return lines


def render_markdown(result):
    lines = [
        f"# Capacity of {result['model']} at p99 <= {result['slo_ms']:g} ms",
        "",
        f"**{result['capacity_rate'] if result['capacity_rate'] is not None else 'none'} requests/s** "
        f"(highest open-loop rate that passed; search stopped: {result['stopped_because']}).",
        "",
        f"Host {result['host']}, {result['step_seconds']:g} s per step (longer where {result.get('min_requests', 0)} "
        f"arrivals need it), {result['arrivals']} arrivals, "
        f"started {result['started_at']}.",
        "",
        "| offered /s | achieved /s | completed /s | requests | failures | p50 ms | p99 ms | result |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for step in sorted(result["steps"], key=lambda s: (s["rate"], s.get("run", 1))):
        again = f" (run {step['run']})" if step.get("run", 1) > 1 else ""
        lines.append(
            f"| {step['rate']:.2f} | {step['achieved_rate']} | {step['throughput']} | {step['requests']} | "
            f"{step['failures']} | {step['p50_ms']} | {step['p99_ms']} | "
            f"{'pass' if step['passed'] else 'FAIL: ' + step['reason']}{again} |"
        )
    lines += render_spread(result)
    lines += [
        "",
        "Each step's full report (CSV, HTML, server-side figures, timeline) is in its step-NN-<rate>/ folder.",
        "",
    ]
    return "\n".join(lines)


def capacity(
    host,
    model,
    slo_ms,
    out_dir=None,
    metrics_url=None,
    start_rate=8.0,
    max_rate=4000.0,
    growth=2.0,
    tolerance=0.1,
    max_steps=12,
    step_seconds=20.0,
    cooldown_seconds=2.0,
    workers=0,
    payload_seed=0,
    arrivals="poisson",
    max_late_share=0.1,
    warmup_seconds=10.0,
    min_requests=0,
    max_step_seconds=None,
    log=print,
    token=None,
    confirm=3,
    margin=0.85,
):
    """Run the search against a server (sending `token` when given) and write the capacity report; returns the
    result dict."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(out_dir or REPORTS / f"capacity-{model}-{stamp}")
    out_dir.mkdir(parents=True, exist_ok=True)
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    log(
        f"capacity search: {model} at p99 <= {slo_ms:g} ms, {step_seconds:g} s steps (>= {min_requests} requests) "
        f"from {start_rate:g}/s -> {out_dir}"
    )
    if warmup_seconds > 0:
        # A just-started server is slow for its first requests (lazy init, allocator, empty cache): an unmeasured
        # step first, with another payload seed so the measured steps do not hit what it cached.
        log(f"warm-up: {warmup_seconds:g} s at {start_rate:g}/s (not measured)")
        measure_with_locust(
            host,
            model,
            out_dir / "warmup",
            warmup_seconds,
            metrics_url,
            cooldown_seconds,
            workers,
            payload_seed + 1000,
            arrivals,
            log,
            token=token,
        )(start_rate)
    measure = measure_with_locust(
        host,
        model,
        out_dir,
        step_seconds,
        metrics_url,
        cooldown_seconds,
        workers,
        payload_seed,
        arrivals,
        log,
        min_requests,
        max_step_seconds,
        token=token,
    )
    found = search(
        measure,
        slo_ms,
        start_rate,
        max_rate,
        growth,
        tolerance,
        max_steps,
        max_late_share=max_late_share,
        log=log,
        confirm=confirm,
        margin=margin,
    )
    result = {
        "model": model,
        "slo_ms": slo_ms,
        "host": host,
        "started_at": started_at,
        "step_seconds": step_seconds,
        "min_requests": min_requests,
        "max_step_seconds": max_step_seconds,
        "arrivals": arrivals,
        "capacity_rate": found["capacity_rate"],
        "bracket": found["bracket"],
        "stopped_because": found["stopped_because"],
        "confirm": confirm,
        "margin": margin,
        "steps": [asdict(step) for step in found["steps"]],
        "rates": found["rates"],
        "capacity_spread": found["capacity_spread"],
    }
    result["at_capacity"] = asdict(found["at_capacity"]) if found["at_capacity"] else None
    # The first step is always at --start-rate: the same low load for every configuration, so comparable.
    result["at_start_rate"] = asdict(found["steps"][0]) if found["steps"] else None
    (out_dir / "capacity.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "capacity.md").write_text(render_markdown(result))
    plot_curve(
        found["steps"], slo_ms, out_dir / "capacity.png", f"{model}: latency vs offered load", found["capacity_rate"]
    )
    result["report_dir"] = str(out_dir)
    return result


# The search's options: (flag, type, default, help, keyword of capacity() or None). Data, so the CLI, the tuner and
# the comparison share one list and search_kwargs cannot forget one.
SEARCH_OPTIONS = (
    ("--slo-ms", float, 100.0, "p99 latency objective in ms (default 100)", None),
    ("--start-rate", float, 8.0, "first offered rate, requests/s", "start_rate"),
    ("--max-rate", float, 4000.0, "never offer more than this", "max_rate"),
    ("--growth", float, 2.0, "rate factor between steps before bisection", "growth"),
    ("--tolerance", float, 0.1, "stop bisecting when within this fraction", "tolerance"),
    ("--max-steps", int, 12, "most steps per search", "max_steps"),
    ("--step-seconds", float, 20.0, "shortest duration of a step", "step_seconds"),
    (
        "--min-requests",
        int,
        300,
        "a step runs until about this many arrivals (p99 from >= 3 tail samples); 0 = off",
        "min_requests",
    ),
    (
        "--max-step-seconds",
        float,
        120.0,
        "cap on a step's duration however few arrivals that gives (low rates)",
        "max_step_seconds",
    ),
    (
        "--warmup-seconds",
        float,
        10.0,
        "unmeasured traffic at the start rate before the first step (0 = none)",
        "warmup_seconds",
    ),
    (
        "--confirm",
        int,
        3,
        "runs a questionable rate gets at most (a failure, or a pass above --margin x SLO); it passes when most of "
        "them pass, so use an odd number (2: a pass needs both, a failure is final); 1 = no repeats",
        "confirm",
    ),
    (
        "--margin",
        float,
        0.85,
        "a pass with p99 above this fraction of the SLO is confirmed before the search moves up",
        "margin",
    ),
    ("--cooldown-seconds", float, 2.0, "pause between steps (queue drains)", "cooldown_seconds"),
    ("--arrivals", str, "poisson", "arrival process: poisson or uniform", "arrivals"),
    ("--payload-seed", int, 0, "seed of the payload mix", "payload_seed"),
    ("--locust-workers", int, 0, "distributed Locust: N local worker processes", "workers"),
    (
        "--max-late-share",
        float,
        0.1,
        "a step fails as generator-limited above this share of late starts",
        "max_late_share",
    ),
)


def add_search_arguments(parser):
    for flag, kind, default, text, _ in SEARCH_OPTIONS:
        choices = ("poisson", "uniform") if flag == "--arrivals" else None
        parser.add_argument(flag, type=kind, default=default, choices=choices, help=text)


def search_kwargs(args):
    """capacity()'s keywords from parsed SEARCH_OPTIONS."""
    return {keyword: getattr(args, flag[2:].replace("-", "_")) for flag, _, _, _, keyword in SEARCH_OPTIONS if keyword}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.capacity", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        required=True,
        help=f"{', '.join(sorted(loadtest.MODELS))}, or the name of an embedding model packaged from its folder",
    )
    add_search_arguments(parser)
    loadtest.add_server_arguments(parser, "capacity-<model>")
    args = parser.parse_args(argv)
    if args.slo_ms <= 0 or args.start_rate <= 0 or args.step_seconds <= 0 or args.min_requests < 0:
        parser.error("--slo-ms, --start-rate and --step-seconds must be positive, --min-requests not negative")
    if args.confirm < 1 or not 0 < args.margin <= 1:
        parser.error("--confirm must be at least 1 and --margin in (0, 1]")

    log = (lambda *_: None) if args.json else print
    code, result = loadtest.run_cli(
        args,
        args.model,
        lambda inference_url, metrics_url, token: capacity(
            inference_url, args.model, args.slo_ms, args.out, metrics_url, log=log, token=token, **search_kwargs(args)
        ),
        log,
    )
    if result is None:
        return code
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        spread_at = result.get("capacity_spread") or {}
        print(
            f"capacity of {args.model} at p99 <= {args.slo_ms:g} ms: {result['capacity_rate']} requests/s "
            f"({result['stopped_because']}; p99 there {spread_text(spread_at.get('p99_ms'))} ms min / median / max "
            f"over {spread_at.get('runs', 0)} run(s))"
        )
        print(f"report: {result['report_dir']}/capacity.md")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
