"""The reliability checks. Each returns rows of (check, figure, target, passed, details) for the report.

Every check judges every part of its own target and fails with the reason when one is missed or cannot be measured
(nothing answered, no worker to kill, an empty corpus): a check that cannot fail proves nothing.
tests/unit/test_reliability_checks.py feeds each one fabricated bad outcomes and sees it fail.
"""

import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import requests

from scripts.reliability import corpus
from scripts.reliability.traffic import closed_loop, open_loop, percentile, steady_load, strict_json

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


class CheckFailed(Exception):
    """A measurement later checks depend on (the capacity estimate) failed: carries the failing Row for the report,
    so the suite reports it instead of going on with a made-up figure."""

    def __init__(self, row):
        super().__init__(f"{row.check}: {row.figure}")
        self.row = row


def describe(server, model):
    response = requests.get(f"{server.management_url}/models/{model}", headers=server.headers("management"),
                            timeout=30)
    response.raise_for_status()
    return response.json()[0]


def worker_pids(server, model):
    return sorted(worker["pid"] for worker in describe(server, model)["workers"])


def verify(reference, outcomes):
    """Count answers that are missing, not 200, or not equal to that input's own reference answer (an answer that is
    not strict JSON, e.g. with NaN in it, is wrong: a strict client could not read it)."""
    lost = sum(1 for o in outcomes if o is None or o.status == 0)
    errors = sum(1 for o in outcomes if o is not None and o.status not in (0, 200))
    mismatches = 0
    for outcome in outcomes:
        if outcome is not None and outcome.status == 200:
            try:
                ok = reference.matches(outcome.index, outcome.json())
            except (ValueError, KeyError, TypeError, IndexError):
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
    answered = sum(1 for o in outcomes if o is not None and o.status == 200) - mismatches
    # One outcome per request sent, and at least one: an empty run has nothing wrong in it and proves nothing.
    passed = requests_total > 0 and len(outcomes) == requests_total and mismatches == lost == errors == 0
    return Row(f"{reference.name}: {requests_total} distinct requests from {clients} clients",
               f"{mismatches} mismatches, {lost} lost, {errors} errors ({requests_total / elapsed:.0f} req/s)",
               "0 / 0 / 0 of > 0 requests", passed,
               {"requests": requests_total, "clients": clients, "mismatches": mismatches, "lost": lost,
                "errors": errors, "correct": answered, "seconds": round(elapsed, 2)})


def judge_bad_answer(case, status, text):
    """Why a bad request's answer is not what its corpus entry expects, or None: the status, a strict-JSON object
    body, and a message containing the expected fragment (an entry without one could never fail that part; only
    TorchServe's own 413, which has no body, is judged on its status alone)."""
    if status != case.status:
        return f"{case.name}: status {status} (wanted {case.status}): {text[:200]}"
    if status == 413 and not case.message:
        return None  # TorchServe's frontend refuses a body over max_request_size itself, with an empty answer
    try:
        body = strict_json(text)
    except ValueError as error:
        return f"{case.name}: the {status} answer is not strict JSON ({error}): {text[:200]}"
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str) or not message:
        return f"{case.name}: the {status} answer has no 'message': {text[:200]}"
    if not case.message:
        return f"{case.name}: the corpus entry gives no expected message fragment, so its message is not checked"
    if case.message not in message:
        return f"{case.name}: message {message!r} lacks {case.message!r}"
    return None


def run_bad_input(server, reference):
    """Send the model's bad-request corpus with a good request after each (its answer compared with the reference);
    returns (cases, failures, pids_before, pids_after)."""
    model = reference.name
    url = f"{server.inference_url}/predictions/{model}"
    session = requests.Session()
    session.headers.update(server.headers("inference"))
    cases = corpus.load(model)
    pids_before = worker_pids(server, model)
    failures = []
    for case in cases:
        response = session.post(url, data=case.body, headers={"Content-Type": case.content_type}, timeout=60)
        problem = judge_bad_answer(case, response.status_code, response.text)
        if problem:
            failures.append(problem)
        good = session.post(url, data=reference.body(0), headers={"Content-Type": "application/json"}, timeout=60)
        try:
            correct = good.status_code == 200 and reference.matches(0, strict_json(good.text))
        except (ValueError, KeyError, TypeError, IndexError):
            correct = False
        if not correct:
            failures.append(f"good request after {case.name!r} answered wrongly: {good.status_code} {good.text[:200]}")
    return cases, failures, pids_before, worker_pids(server, model)


def bad_input(server, reference):
    cases, failures, pids_before, pids_after = run_bad_input(server, reference)
    as_expected = len(cases) - sum(1 for f in failures if not f.startswith("good request"))
    if not cases:
        failures.append(f"the corpus for {reference.name} is empty")
    if not pids_before:
        failures.append("the model had no worker when the corpus started")
    restarted = pids_after != pids_before
    figure = f"{as_expected}/{len(cases)} answered as expected; worker restarts: {'yes' if restarted else 0}"
    if failures:
        more = f" (+{len(failures) - 2} more)" if len(failures) > 2 else ""
        figure += f" -- FAILED: {'; '.join(failures[:2])}{more}"
    return Row(f"{reference.name}: bad-input corpus ({len(cases)} requests, good ones interleaved)", figure,
               "all 4xx with message, good ones correct, 0 restarts", not failures and not restarted,
               {"failures": failures, "pids_before": pids_before, "pids_after": pids_after})


# ------------------------------------------------------------------------------------------------ overload
def measure_capacity(server, reference, seconds, clients=16):
    """Closed-loop throughput with `clients` clients: a quick estimate of what the server sustains (requests/s).

    Raises CheckFailed when it cannot be measured (nothing answered correctly) or the plain closed-loop load already
    had errors or wrong answers: the overload, worker-kill and soak checks are sized from it, and a made-up figure
    would let them pass against a broken server."""
    url = f"{server.inference_url}/predictions/{reference.name}"
    stop = threading.Event()
    threads, outcomes = steady_load(url, reference.body, clients, stop, headers=server.headers("inference"))
    started = time.perf_counter()
    time.sleep(seconds)
    window_end = time.perf_counter()
    stop.set()
    for thread in threads:
        thread.join()
    outcomes = list(outcomes)
    lost, errors, wrong = verify(reference, outcomes)
    # Only answers that arrived within the window count: the ones finishing while the clients stop would inflate it.
    correct_in_window = [o for o in outcomes if o.status == 200 and o.started_at + o.latency_s <= window_end]
    capacity = (len(correct_in_window) - wrong) / max(1e-9, window_end - started) if outcomes else 0.0
    statuses = sorted({o.status for o in outcomes if o.status != 200})
    if capacity > 0 and lost == errors == wrong == 0:
        return capacity
    reason = (f"no correct answer in {seconds:g}s" if capacity <= 0 else "errors under plain closed-loop load")
    raise CheckFailed(Row(
        f"{reference.name}: capacity estimate ({clients} clients, {seconds:g}s closed loop)",
        f"{reason}: {len(outcomes)} requests, {errors} errors (statuses {statuses}), {lost} lost, {wrong} wrong; "
        f"overload, worker-kill and soak not run", "> 0 req/s, 0 errors, 0 wrong", False,
        {"requests": len(outcomes), "errors": errors, "lost": lost, "wrong": wrong, "statuses": statuses,
         "capacity_rps": round(capacity, 2)}))


def overload(server, reference, capacity_rps, factor, seconds, settle_s=2.0):
    url = f"{server.inference_url}/predictions/{reference.name}"
    rate = capacity_rps * factor
    headers = server.headers("inference")
    generator_cpu = psutil.Process().cpu_times()
    wall = time.perf_counter()
    outcomes = open_loop(url, reference.body, rate, seconds, max_in_flight=512, headers=headers)
    wall = time.perf_counter() - wall
    after_cpu = psutil.Process().cpu_times()
    generator_share = ((after_cpu.user + after_cpu.system) - (generator_cpu.user + generator_cpu.system)) / (
        max(1e-9, wall) * (psutil.cpu_count() or 1))
    accepted = [o for o in outcomes if o and o.status == 200]
    rejected = [o for o in outcomes if o and o.status == 503]
    other = [o for o in outcomes if o is None or o.status not in (200, 503)]
    _, _, mismatches = verify(reference, accepted)
    rejection_p99 = percentile([o.latency_s * 1000 for o in rejected], 0.99)
    accepted_p99 = percentile([o.latency_s * 1000 for o in accepted], 0.99)
    starts = [o.started_at for o in outcomes if o]
    achieved = len(starts) / max(1e-9, max(starts) - min(starts)) if len(starts) > 1 else 0.0
    # Afterwards: normal traffic must be served at normal latency with zero errors.
    time.sleep(settle_s)
    after = closed_loop(url, [reference.body(i) for i in range(50)], 2, headers=headers)
    after_lost, after_errors, after_mismatches = verify(reference, after)
    after_p50 = percentile([o.latency_s * 1000 for o in after if o and o.status == 200], 0.5)
    # A server that answers everything 503 rejects fast and is never wrong: it must still serve (accepted > 0).
    reasons = []
    if not outcomes:
        reasons.append("no request was sent")
    if not accepted:
        reasons.append("no request was accepted")
    if other:
        reasons.append(f"{len(other)} answers neither 200 nor 503")
    if mismatches:
        reasons.append(f"{mismatches} accepted answers wrong")
    if rejected and (rejection_p99 is None or rejection_p99 > 50):
        reasons.append(f"rejection p99 {fmt_ms(rejection_p99)} > 50 ms")
    if after_lost or after_errors or after_mismatches or not after:
        reasons.append(f"after the overload: {after_errors + after_lost} errors, {after_mismatches} wrong "
                       f"of {len(after)}")
    return Row(f"{reference.name}: overload {factor:.0f}x capacity ({rate:.0f} req/s offered, {seconds}s open loop)",
               f"achieved {achieved:.0f} req/s; rejected {len(rejected)} (p99 {fmt_ms(rejection_p99)}), accepted {len(accepted)} "
               f"(p99 {fmt_ms(accepted_p99)}, {mismatches} wrong), other errors {len(other)}; "
               f"after: {after_errors + after_lost} errors, p50 {fmt_ms(after_p50)}"
               + (f" -- FAILED: {'; '.join(reasons)}" if reasons else ""),
               "accepted > 0, rejections p99 <= 50 ms, 0 other errors, 0 wrong, 0 errors after", not reasons,
               {"capacity_rps": round(capacity_rps, 1), "offered_rps": round(rate, 1),
                "achieved_rps": round(achieved, 1), "accepted": len(accepted), "rejected": len(rejected),
                "other_errors": len(other), "other_statuses": sorted({o.status for o in other if o}),
                "rejection_p99_ms": rejection_p99, "accepted_p99_ms": accepted_p99, "wrong_answers": mismatches,
                "after_errors": after_errors + after_lost, "after_wrong": after_mismatches, "after_p50_ms": after_p50,
                "late_starts": sum(1 for o in outcomes if o and o.start_lag_s > 0.05),
                "load_generator_cpu_share": round(generator_share, 3), "reasons": reasons})


def fmt_ms(value):
    return "-" if value is None else f"{value:.0f} ms"


# ------------------------------------------------------------------------------------------------ worker failure
def worker_kill(server, reference, clients=4, before_s=3, after_s=120, settle_s=1.0):
    """SIGKILL one worker under steady load: time until answers flow again and until the worker is replaced, failed
    and wrong answers.

    Failures are bounded by the batch the killed worker held: TorchServe fails that batch ("Worker died") and keeps
    every queued request for the other or the restarted worker. With `clients` closed-loop clients at most
    min(clients, batchSize) requests can be in that batch; more failures mean requests were lost beyond it."""
    url = f"{server.inference_url}/predictions/{reference.name}"
    described = describe(server, reference.name)
    batch_size = int(described.get("batchSize") or 1)
    in_flight_bound = min(clients, batch_size)
    stop = threading.Event()
    threads, outcomes = steady_load(url, reference.body, clients, stop, headers=server.headers("inference"))
    time.sleep(before_s)
    before_pids = worker_pids(server, reference.name)
    served_before = sum(1 for o in list(outcomes) if o.status == 200)
    if not before_pids or not served_before:
        stop.set()
        for thread in threads:
            thread.join()
        reason = "no worker to kill" if not before_pids else f"no answer in the {before_s}s before the kill"
        return Row(f"{reference.name}: SIGKILL a worker under load ({clients} clients)", f"not run: {reason}",
                   f"answers again <= 20 s, failures <= in-flight batch ({in_flight_bound}), 0 wrong, worker replaced",
                   False, {"pids_before": before_pids, "served_before": served_before,
                           "requests": len(outcomes)})
    pid = before_pids[0]
    killed_at = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    deadline = killed_at + after_s
    recovered_at = None
    while time.perf_counter() < deadline and recovered_at is None:
        time.sleep(0.05)
        recovered_at = next((o.started_at + o.latency_s for o in list(outcomes)
                             if o.status == 200 and o.started_at > killed_at), None)
    time.sleep(settle_s)
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
    reasons = []
    if recovery is None or recovery > 20:
        reasons.append("no answer within 20 s of the kill")
    if len(failed) > in_flight_bound:
        reasons.append(f"{len(failed)} failed > in-flight batch {in_flight_bound}")
    if wrong:
        reasons.append(f"{wrong} wrong answers")
    if replaced is None:
        reasons.append("worker not replaced")
    figure = (f"answers flow again after {recovery:.1f}s ({len(before_pids)} worker(s) before the kill); "
              f"{len(failed)} failed (in-flight bound {in_flight_bound}), {wrong} wrong; " if recovery is not None
              else f"no answer within {after_s}s; {len(failed)} failed (in-flight bound {in_flight_bound}); ")
    figure += f"worker replaced and READY after {replaced:.1f}s" if replaced is not None else "worker NOT replaced"
    if reasons:
        figure += f" -- FAILED: {'; '.join(reasons)}"
    return Row(f"{reference.name}: SIGKILL a worker under load ({clients} clients)", figure,
               f"answers again <= 20 s, failures <= in-flight batch ({in_flight_bound}), 0 wrong, worker replaced",
               not reasons,
               {"killed_pid": pid, "pids_before": before_pids, "new_pids": new_pids, "recovery_s": recovery,
                "replaced_s": replaced, "failed": len(failed), "in_flight_bound": in_flight_bound,
                "batch_size": batch_size, "failed_statuses": sorted({o.status for o in failed}), "wrong": wrong,
                "requests": len(outcomes), "reasons": reasons})


def hang(server, model, good_body, hang_body, response_timeout_s, good_check=None, recover_s=60.0):
    """One request hangs past responseTimeout: its batch fails, the worker is replaced, later requests succeed.

    good_check(answer) -> True when a good request's (strict JSON) answer is right; None: any JSON object."""
    url = f"{server.inference_url}/predictions/{model}"
    headers = {"Content-Type": "application/json", **server.headers("inference")}
    good_check = good_check or (lambda answer: isinstance(answer, dict))

    def good_answer(response):
        try:
            return response.status_code == 200 and bool(good_check(strict_json(response.text)))
        except (ValueError, KeyError, TypeError, IndexError):
            return False

    pid_before = worker_pids(server, model)
    started = time.perf_counter()
    hung = requests.post(url, data=hang_body, headers=headers, timeout=response_timeout_s + 60)
    hung_seconds = time.perf_counter() - started
    recovered = None
    deadline = time.perf_counter() + recover_s
    while time.perf_counter() < deadline:
        response = requests.post(url, data=good_body, headers=headers, timeout=60)
        if good_answer(response):
            recovered = time.perf_counter() - started
            break
        time.sleep(0.2)
    later = [requests.post(url, data=good_body, headers=headers, timeout=60) for _ in range(5)]
    later_ok = [good_answer(response) for response in later]
    pids_after = worker_pids(server, model)
    # Replaced: a worker again, and none of the old ones (an empty list would also differ from the one before).
    replaced = bool(pid_before) and bool(pids_after) and not set(pids_after) & set(pid_before)
    reasons = []
    if hung.status_code < 500:
        reasons.append(f"the hung request got {hung.status_code}, not a 5xx")
    if hung_seconds < response_timeout_s:
        reasons.append(f"it was answered after {hung_seconds:.1f}s, before responseTimeout: it did not hang")
    if recovered is None:
        reasons.append(f"no correct answer within {recover_s:g} s")
    if not all(later_ok):
        reasons.append(f"{later_ok.count(False)} of 5 later requests failed or were wrong")
    if not replaced:
        reasons.append("worker not replaced")
    figure = (f"hung request: {hung.status_code} after {hung_seconds:.1f}s; worker replaced: {replaced}; "
              + (f"next success {recovered:.1f}s after it was sent" if recovered is not None
                 else f"no success within {recover_s:g}s")
              + (f" -- FAILED: {'; '.join(reasons)}" if reasons else ""))
    return Row(f"{model}: a request hangs past responseTimeout ({response_timeout_s}s)", figure,
               "batch fails, worker replaced, later requests succeed", not reasons,
               {"hung_status": hung.status_code, "hung_body": hung.text[:200], "hung_seconds": round(hung_seconds, 2),
                "later_statuses": [response.status_code for response in later], "later_correct": later_ok,
                "worker_replaced": replaced, "pids_before": pid_before, "pids_after": pids_after,
                "reasons": reasons})


# ------------------------------------------------------------------------------------------------ security
def unsafe_loading(paths=("handlers", "scripts")):
    """Every torch.load in our code passes weights_only=True, and nothing calls pickle.load(s) (checked on the AST)."""
    import ast

    problems, files = [], 0
    for folder in paths:
        for file in sorted((REPO / folder).rglob("*.py")):
            files += 1
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
    # Scanning nothing (a moved folder) finds nothing unsafe: that must fail, not pass.
    return Row("model loading never unpickles", f"{len(problems)} unsafe load(s) in {files} files",
               "0 in > 0 files", files > 0 and not problems, {"problems": problems, "files": files})


def security(server, model_body, model, good_check=None):
    """With the production profile: no token or a made-up one -> refused; the key file's token -> served correctly;
    outside URL and oversized body refused. good_check(answer) -> True for a right answer (None: a JSON object)."""
    inference = f"{server.inference_url}/predictions/{model}"
    json_type = {"Content-Type": "application/json"}
    results = {}
    token_headers = server.headers("inference")
    results["inference_without_token"] = requests.post(inference, data=model_body, timeout=60,
                                                       headers=json_type).status_code
    results["inference_wrong_token"] = requests.post(inference, data=model_body, timeout=60, headers={
        **json_type, "Authorization": "Bearer not-a-key"}).status_code
    served = requests.post(inference, data=model_body, timeout=60, headers={**json_type, **token_headers})
    results["inference_with_token"] = served.status_code
    results["management_without_token"] = requests.get(f"{server.management_url}/models", timeout=30).status_code
    results["management_with_token"] = requests.get(f"{server.management_url}/models", timeout=30,
                                                    headers=server.headers("management")).status_code
    outside = requests.post(f"{server.management_url}/models", timeout=60, headers=server.headers("management"),
                            params={"url": "https://example.com/evil.mar", "model_name": "evil"})
    results["register_outside_url"] = outside.status_code
    limit = int(server.props.get("max_request_size", 6553500))
    big = requests.post(inference, data=b"0" * (limit + 1024), timeout=60, headers={**json_type, **token_headers})
    results["oversized_body"] = big.status_code
    try:
        correct = served.status_code == 200 and bool((good_check or (lambda a: isinstance(a, dict)))(
            strict_json(served.text)))
    except (ValueError, KeyError, TypeError, IndexError):
        correct = False
    # TorchServe 0.12 refuses a missing or wrong token with 400 ("Token Authorization failed ..."), not 401.
    refused = (400, 401, 403)
    reasons = []
    if not token_headers:
        reasons.append("no inference key in the server's key_file.json (is token authorization on?)")
    for key in ("inference_without_token", "inference_wrong_token", "management_without_token"):
        if results[key] not in refused:
            reasons.append(f"{key} answered {results[key]}")
    if not correct:
        reasons.append(f"with the token: {served.status_code} {served.text[:120]}")
    if results["management_with_token"] != 200:
        reasons.append(f"management with the token answered {results['management_with_token']}")
    if not 400 <= results["register_outside_url"] < 500:
        reasons.append(f"registering from an outside URL answered {results['register_outside_url']}")
    if results["oversized_body"] != 413:
        reasons.append(f"an oversized body answered {results['oversized_body']}")
    return Row("production profile: tokens, allowed_urls, request size",
               ", ".join(f"{k}={v}" for k, v in results.items())
               + (f" -- FAILED: {'; '.join(reasons)}" if reasons else ""),
               "refused without or with a wrong token, correct 200 with it, outside URL 4xx, oversized 413",
               not reasons, {**results, "answer_correct": correct, "reasons": reasons})


def write_json(path, rows):
    Path(path).write_text(json.dumps([r.as_dict() for r in rows], indent=2, default=str) + "\n")
