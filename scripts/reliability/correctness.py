"""Correctness checks: distinct requests under concurrency, each answer compared with that input's own reference,
and the bad-input corpus (each answered with its 4xx and message, good requests between them still right, no
worker restarted)."""

import time

import requests

from scripts.reliability import corpus
from scripts.reliability.rows import Row, verify
from scripts.reliability.traffic import closed_loop, strict_json


def concurrency(server, reference, requests_total, clients):
    url = f"{server.inference_url}/predictions/{reference.name}"
    started = time.perf_counter()
    outcomes = closed_loop(
        url, [reference.body(i) for i in range(requests_total)], clients, headers=server.headers("inference")
    )
    elapsed = time.perf_counter() - started
    lost, errors, mismatches = verify(reference, outcomes)
    answered = sum(1 for o in outcomes if o is not None and o.status == 200) - mismatches
    # One outcome per request sent, and at least one: an empty run has nothing wrong in it and proves nothing.
    passed = requests_total > 0 and len(outcomes) == requests_total and mismatches == lost == errors == 0
    return Row(
        f"{reference.name}: {requests_total} distinct requests from {clients} clients",
        f"{mismatches} mismatches, {lost} lost, {errors} errors ({requests_total / elapsed:.0f} req/s)",
        "0 / 0 / 0 of > 0 requests",
        passed,
        {
            "requests": requests_total,
            "clients": clients,
            "mismatches": mismatches,
            "lost": lost,
            "errors": errors,
            "correct": answered,
            "seconds": round(elapsed, 2),
        },
    )


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
    message = corpus.error_message(body)
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
    client = server.management()
    pids_before = client.worker_pids(model)
    failures = []
    for case in cases:
        response = session.post(
            case.url(server.inference_url, model),
            data=case.body,
            headers={"Content-Type": case.content_type},
            timeout=60,
        )
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
    return cases, failures, pids_before, client.worker_pids(model)


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
    return Row(
        f"{reference.name}: bad-input corpus ({len(cases)} requests, good ones interleaved)",
        figure,
        "all 4xx with message, good ones correct, 0 restarts",
        not failures and not restarted,
        {"failures": failures, "pids_before": pids_before, "pids_after": pids_after},
    )
