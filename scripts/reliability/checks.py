"""The reliability checks. Each returns rows of (check, figure, target, passed, details) for the report."""

import json
import os
import re
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import requests

from scripts.reliability import corpus
from scripts.reliability.traffic import closed_loop, open_loop, percentile, steady_load

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Row:
    check: str
    figure: str
    target: str
    passed: bool
    details: dict = field(default_factory=dict)

    def as_dict(self):
        return asdict(self)


def describe(server, model):
    response = requests.get(f"{server.management_url}/models/{model}", headers=server.headers("management"),
                            timeout=30)
    response.raise_for_status()
    return response.json()[0]


def worker_pids(server, model):
    return sorted(worker["pid"] for worker in describe(server, model)["workers"])


def verify(reference, outcomes):
    """Count answers that are missing, not 200, or not equal to that input's own reference answer."""
    lost = sum(1 for o in outcomes if o is None or o.status == 0)
    errors = sum(1 for o in outcomes if o is not None and o.status not in (0, 200))
    mismatches = 0
    for outcome in outcomes:
        if outcome is not None and outcome.status == 200:
            try:
                ok = reference.matches(outcome.index, outcome.json())
            except (ValueError, KeyError, TypeError):
                ok = False
            mismatches += 0 if ok else 1
    return lost, errors, mismatches


# ------------------------------------------------------------------------------------------------ correctness
def concurrency(server, reference, requests_total, clients):
    url = f"{server.inference_url}/predictions/{reference.name}"
    started = time.perf_counter()
    outcomes = closed_loop(url, [reference.body(i) for i in range(requests_total)], clients,
                           headers=server.headers("inference"))
    elapsed = time.perf_counter() - started
    lost, errors, mismatches = verify(reference, outcomes)
    return Row(f"{reference.name}: {requests_total} distinct requests from {clients} clients",
               f"{mismatches} mismatches, {lost} lost, {errors} errors ({requests_total / elapsed:.0f} req/s)",
               "0 / 0 / 0", mismatches == lost == errors == 0,
               {"requests": requests_total, "clients": clients, "mismatches": mismatches, "lost": lost,
                "errors": errors, "seconds": round(elapsed, 2)})


def run_bad_input(server, model, good_body):
    """Send the model's bad-request corpus with a good request after each; returns (cases, failures, pids_same)."""
    url = f"{server.inference_url}/predictions/{model}"
    session = requests.Session()
    session.headers.update(server.headers("inference"))
    cases = corpus.load(model)
    pids_before = worker_pids(server, model)
    failures = []
    for case in cases:
        response = session.post(url, data=case.body, headers={"Content-Type": case.content_type}, timeout=60)
        try:
            message = str(response.json().get("message", ""))
        except (ValueError, AttributeError):
            message = ""
        if response.status_code != case.status:
            failures.append(f"{case.name}: status {response.status_code} (wanted {case.status}): {response.text[:200]}")
        elif case.message not in message:
            failures.append(f"{case.name}: message {message!r} lacks {case.message!r}")
        good = session.post(url, data=good_body, headers={"Content-Type": "application/json"}, timeout=60)
        if good.status_code != 200:
            failures.append(f"good request after {case.name!r} failed: {good.status_code} {good.text[:200]}")
    return cases, failures, worker_pids(server, model) == pids_before


def bad_input(server, reference):
    cases, failures, same_pids = run_bad_input(server, reference.name, reference.body(0))
    return Row(f"{reference.name}: bad-input corpus ({len(cases)} requests, good ones interleaved)",
               f"{len(cases) - len(failures)}/{len(cases)} answered as expected; worker restarts: "
               f"{0 if same_pids else 'yes'}", "all 4xx with message, 0 restarts", not failures and same_pids,
               {"failures": failures})


# ------------------------------------------------------------------------------------------------ overload
def measure_capacity(server, reference, seconds, clients=16):
    """Closed-loop throughput with `clients` clients: a quick estimate of what the server sustains."""
    url = f"{server.inference_url}/predictions/{reference.name}"
    stop = threading.Event()
    threads, outcomes = steady_load(url, reference.body, clients, stop, headers=server.headers("inference"))
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    ok = [o for o in outcomes if o.status == 200]
    return len(ok) / seconds if ok else 1.0


def overload(server, reference, capacity_rps, factor, seconds):
    url = f"{server.inference_url}/predictions/{reference.name}"
    rate = capacity_rps * factor
    headers = server.headers("inference")
    generator_cpu = psutil.Process().cpu_times()
    wall = time.perf_counter()
    outcomes = open_loop(url, reference.body, rate, seconds, max_in_flight=512, headers=headers)
    wall = time.perf_counter() - wall
    after_cpu = psutil.Process().cpu_times()
    generator_share = ((after_cpu.user + after_cpu.system) - (generator_cpu.user + generator_cpu.system)) / (
        wall * (psutil.cpu_count() or 1))
    accepted = [o for o in outcomes if o and o.status == 200]
    rejected = [o for o in outcomes if o and o.status == 503]
    other = [o for o in outcomes if o is None or o.status not in (200, 503)]
    _, _, mismatches = verify(reference, accepted)
    rejection_p99 = percentile([o.latency_s * 1000 for o in rejected], 0.99)
    accepted_p99 = percentile([o.latency_s * 1000 for o in accepted], 0.99)
    achieved = len(outcomes) / max(1e-9, (max(o.started_at for o in outcomes if o) - min(o.started_at for o in outcomes if o)))
    # Afterwards: normal traffic must be served at normal latency with zero errors.
    time.sleep(2)
    after = closed_loop(url, [reference.body(i) for i in range(50)], 2, headers=headers)
    after_lost, after_errors, after_mismatches = verify(reference, after)
    after_p50 = percentile([o.latency_s * 1000 for o in after if o and o.status == 200], 0.5)
    passed = (not other and mismatches == 0 and after_lost == after_errors == after_mismatches == 0
              and (not rejected or rejection_p99 <= 50))
    return Row(f"{reference.name}: overload {factor:.0f}x capacity ({rate:.0f} req/s offered, {seconds}s open loop)",
               f"achieved {achieved:.0f} req/s; rejected {len(rejected)} (p99 {fmt_ms(rejection_p99)}), accepted {len(accepted)} "
               f"(p99 {fmt_ms(accepted_p99)}, {mismatches} wrong), other errors {len(other)}; "
               f"after: {after_errors + after_lost} errors, p50 {fmt_ms(after_p50)}",
               "rejections p99 <= 50 ms, 0 wrong, 0 errors after", passed,
               {"capacity_rps": round(capacity_rps, 1), "offered_rps": round(rate, 1),
                "achieved_rps": round(achieved, 1), "accepted": len(accepted), "rejected": len(rejected),
                "other_errors": len(other), "other_statuses": sorted({o.status for o in other if o}),
                "rejection_p99_ms": rejection_p99, "accepted_p99_ms": accepted_p99, "wrong_answers": mismatches,
                "after_errors": after_errors + after_lost, "after_p50_ms": after_p50,
                "late_starts": sum(1 for o in outcomes if o and o.start_lag_s > 0.05),
                "load_generator_cpu_share": round(generator_share, 3)})


def fmt_ms(value):
    return "-" if value is None else f"{value:.0f} ms"


# ------------------------------------------------------------------------------------------------ worker failure
def worker_kill(server, reference, clients=4, before_s=3, after_s=120):
    """SIGKILL one worker under steady load: time until answers flow again and until the worker is replaced, failed
    and wrong answers."""
    url = f"{server.inference_url}/predictions/{reference.name}"
    stop = threading.Event()
    threads, outcomes = steady_load(url, reference.body, clients, stop, headers=server.headers("inference"))
    time.sleep(before_s)
    before_pids = worker_pids(server, reference.name)
    pid = before_pids[0]
    killed_at = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    deadline = killed_at + after_s
    recovered_at = None
    while time.perf_counter() < deadline and recovered_at is None:
        time.sleep(0.05)
        recovered_at = next((o.started_at + o.latency_s for o in list(outcomes)
                             if o.status == 200 and o.started_at > killed_at), None)
    time.sleep(1)
    stop.set()
    for thread in threads:
        thread.join()
    failed = [o for o in outcomes if o.status != 200]
    _, _, wrong = verify(reference, [o for o in outcomes if o.status == 200])
    recovery = None if recovered_at is None else recovered_at - killed_at
    # With several workers the others keep answering at once; the check also waits until TorchServe has replaced the
    # killed one (every worker READY again, the old pid gone), so the next check starts from a whole, warm model.
    new_pids, replaced = worker_pids(server, reference.name), None
    while time.perf_counter() < deadline:
        workers = describe(server, reference.name)["workers"]
        new_pids = sorted(worker["pid"] for worker in workers)
        if (pid not in new_pids and len(workers) >= len(before_pids)
                and all(worker.get("status") == "READY" for worker in workers)):
            replaced = time.perf_counter() - killed_at
            break
        time.sleep(0.25)
    passed = recovery is not None and recovery <= 20 and wrong == 0 and replaced is not None
    figure = (f"answers flow again after {recovery:.1f}s ({len(before_pids)} worker(s) before the kill); "
              f"{len(failed)} failed, {wrong} wrong; " if recovery is not None
              else f"no answer within {after_s}s; {len(failed)} failed; ")
    figure += f"worker replaced and READY after {replaced:.1f}s" if replaced is not None else "worker NOT replaced"
    return Row(f"{reference.name}: SIGKILL a worker under load ({clients} clients)", figure,
               "answers again <= 20 s, failures <= in-flight batch, 0 wrong, worker replaced", passed,
               {"killed_pid": pid, "pids_before": before_pids, "new_pids": new_pids, "recovery_s": recovery,
                "replaced_s": replaced, "failed": len(failed),
                "failed_statuses": sorted({o.status for o in failed}), "wrong": wrong, "requests": len(outcomes)})


def hang(server, model, good_body, hang_body, response_timeout_s):
    """One request hangs past responseTimeout: its batch fails, the worker is replaced, later requests succeed."""
    url = f"{server.inference_url}/predictions/{model}"
    headers = {"Content-Type": "application/json", **server.headers("inference")}
    pid_before = worker_pids(server, model)
    started = time.perf_counter()
    hung = requests.post(url, data=hang_body, headers=headers, timeout=response_timeout_s + 60)
    hung_seconds = time.perf_counter() - started
    recovered = None
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        response = requests.post(url, data=good_body, headers=headers, timeout=60)
        if response.status_code == 200:
            recovered = time.perf_counter() - started
            break
        time.sleep(0.2)
    later = [requests.post(url, data=good_body, headers=headers, timeout=60).status_code for _ in range(5)]
    replaced = worker_pids(server, model) != pid_before
    passed = hung.status_code >= 500 and recovered is not None and later == [200] * 5 and replaced
    return Row(f"{model}: a request hangs past responseTimeout ({response_timeout_s}s)",
               f"hung request: {hung.status_code} after {hung_seconds:.1f}s; worker replaced: {replaced}; "
               f"next success {recovered:.1f}s after it was sent" if recovered else
               f"hung request: {hung.status_code}; no success within 60s",
               "batch fails, worker replaced, later requests succeed", passed,
               {"hung_status": hung.status_code, "hung_body": hung.text[:200], "later_statuses": later,
                "worker_replaced": replaced})


# ------------------------------------------------------------------------------------------------ security
def unsafe_loading(paths=("handlers", "scripts")):
    """Every torch.load in our code passes weights_only=True, and nothing calls pickle.load(s) (checked on the AST)."""
    import ast

    problems = []
    for folder in paths:
        for file in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text(), str(file))):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
                where = f"{file.relative_to(REPO)}:{node.lineno}"
                if owner == "torch" and node.func.attr == "load":
                    safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                               for k in node.keywords)
                    if not safe:
                        problems.append(f"{where}: torch.load without weights_only=True")
                if owner == "pickle" and node.func.attr in ("load", "loads"):
                    problems.append(f"{where}: pickle.{node.func.attr}")
    return Row("model loading never unpickles", f"{len(problems)} unsafe load(s)", "0", not problems,
               {"problems": problems})


def security(server, model_body, model):
    """With the production profile: no token -> refused; token -> served; outside URL and oversized body refused."""
    inference = f"{server.inference_url}/predictions/{model}"
    results = {}
    results["inference_without_token"] = requests.post(inference, data=model_body, timeout=60,
                                                       headers={"Content-Type": "application/json"}).status_code
    results["inference_with_token"] = requests.post(inference, data=model_body, timeout=60, headers={
        "Content-Type": "application/json", **server.headers("inference")}).status_code
    results["management_without_token"] = requests.get(f"{server.management_url}/models", timeout=30).status_code
    results["management_with_token"] = requests.get(f"{server.management_url}/models", timeout=30,
                                                    headers=server.headers("management")).status_code
    outside = requests.post(f"{server.management_url}/models", timeout=60, headers=server.headers("management"),
                            params={"url": "https://example.com/evil.mar", "model_name": "evil"})
    results["register_outside_url"] = outside.status_code
    limit = int(server.props.get("max_request_size", 6553500))
    big = requests.post(inference, data=b"0" * (limit + 1024), timeout=60, headers={
        "Content-Type": "application/json", **server.headers("inference")})
    results["oversized_body"] = big.status_code
    # TorchServe 0.12 refuses a missing or wrong token with 400 ("Token Authorization failed ..."), not 401.
    refused = (400, 401, 403)
    passed = (results["inference_without_token"] in refused and results["inference_with_token"] == 200
              and results["management_without_token"] in refused and results["management_with_token"] == 200
              and 400 <= results["register_outside_url"] < 500 and results["oversized_body"] == 413)
    return Row("production profile: tokens, allowed_urls, request size",
               ", ".join(f"{k}={v}" for k, v in results.items()),
               "refused without token, 200 with, outside URL 4xx, oversized 413", passed, results)


def write_json(path, rows):
    Path(path).write_text(json.dumps([r.as_dict() for r in rows], indent=2, default=str) + "\n")
