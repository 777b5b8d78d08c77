"""Management-API campaign: every call TorchServe 0.12 offers, with good and bad parameters, sent raw while every
served model is under load.

    python -m scripts.reliability --only management              # its own server (the full form: 3 rounds)
    python -m scripts.reliability.management --running           # against `make serve` (one round)

The calls go out as curl sends them (plain `requests`, the query string as written, no client-side checks):
describe plain and customized (`/models/<m>`, `/all`, `/<version>`, gRPC DescribeModel), list with odd `limit` and
`next_page_token`, bad worker counts (negative, huge, non-numeric), set-default to a present and a missing version,
registering twice, a missing archive, a `.mar` that is not a zip, URLs outside allowed_urls, the token API on a server
without tokens, the workflow endpoints, the metrics endpoint with odd `name[]=`, OPTIONS, unknown methods and paths.
A second copy of an archive is registered under another name, scaled up, down to 0 and back, and unregistered while
its own requests flow.

Judged (each a Row): every call answered with the status its table row names (no 5xx unless TorchServe documents
one; every 4xx with a JSON message); every load request answered 200 with the model's own answer, except a 503 while
a model was deliberately at 0 workers and whatever the copy's requests get once it is being unregistered
(unregistering drops its queued requests); afterwards every model answers a normal request, every worker is READY,
and no worker PID changed for a model the campaign did not scale.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from scripts.reliability.rows import Row
from scripts.reliability.traffic import Client

COPY = "mc-copy"  # the second registration of an archive that gets scaled to 0 and unregistered under load
BROKEN = "mc-broken.mar"  # written into the model store for the call: bytes that are not a zip
CALL_TIMEOUT = 300  # a synchronous register or scale waits for workers to load on a busy 2-core host
# A simple, valid request per bundled model and what every 200 answer to it must hold; other models (a user's, an
# image model) are sent the body given to campaign() and judged against their first answer.
BODIES: dict[str, dict[str, Any]] = {
    "classifier": {"inputs": [0.1] * 128},
    "minilm": {"text": "management calls must not hurt serving"},
    "generator": {"prompt": "Hello", "max_new_tokens": 2, "temperature": 0},
}
NO_CHANGE = frozenset({200})
BROKEN_5XX = (
    "registerModel's 500 in TorchServe's API description (OPTIONS /): the archive's worker could not start, the "
    "model is unregistered again"
)


@dataclass(frozen=True)
class Call:
    """One raw call. ``query`` is sent as written (curl-style); ``expect`` the statuses TorchServe documents for it;
    ``effect`` what it deliberately does to ``model``'s serving: "zero" (no workers until the next "restore": 503s
    allowed), "restore" (workers back when it returns), "drop" (unregister: its queued requests may fail), "scale"
    (worker PIDs may change)."""

    name: str
    method: str
    path: str
    expect: frozenset[int]
    query: str = ""
    api: str = "management"  # management | inference | metrics | grpc
    answer: str = "json"  # json | text | any: what a 200 must be
    effect: str = ""
    model: str = ""
    documented_5xx: str = ""  # why TorchServe answers this one with a 5xx (docs); empty: a 5xx is a failure
    timeout: float = 60.0

    def url(self, bases: dict[str, str]) -> str:
        return bases[self.api] + self.path + (f"?{self.query}" if self.query else "")


def codes(*statuses: int) -> frozenset[int]:
    return frozenset(statuses)


def describe_calls(model: str, version: str) -> list[Call]:
    """Plain and customized describes of one model in every spelling (customized asks its handler, through the
    worker's queue: the call the frontend fixes made safe for continuous batching)."""
    calls = []
    for spelling in (f"/models/{model}", f"/models/{model}/all", f"/models/{model}/{version}"):
        calls.append(Call(f"describe {spelling}", "GET", spelling, NO_CHANGE))
        calls.append(
            Call(f"describe {spelling} customized", "GET", spelling, NO_CHANGE, "customized=true", timeout=120)
        )
    calls.append(Call(f"describe {model} customized=maybe", "GET", f"/models/{model}", NO_CHANGE, "customized=maybe"))
    calls.append(Call(f"describe {model} missing version", "GET", f"/models/{model}/9.9.9", codes(404)))
    calls.append(Call(f"gRPC DescribeModel {model} customized", "describe", model, NO_CHANGE, api="grpc"))
    return calls


def bad_worker_calls(model: str) -> list[Call]:
    """Worker counts the fixed frontend refuses with a 400 before touching a worker."""
    queries = (
        "min_worker=-1",
        "min_worker=0&max_worker=-5",
        "min_worker=3&max_worker=2",
        "min_worker=100000&max_worker=100000",
        "max_worker=2147483648",
        "min_worker=abc",
        "min_worker=1.5",
        "min_worker=",
    )
    calls = [
        Call(f"scale {model} {q}", "PUT", f"/models/{model}", codes(400), f"{q}&synchronous=true") for q in queries
    ]
    calls.append(Call(f"gRPC ScaleWorker {model} 100000", "scale", model, codes(400), api="grpc"))
    return calls


def list_calls() -> list[Call]:
    """List with odd paging values: out-of-range ones are clamped by TorchServe, non-numeric ones are a 400."""
    calls = [Call("list", "GET", "/models", NO_CHANGE)]
    for query in (
        "limit=0",
        "limit=-1",
        "limit=1",
        "limit=100000",
        "next_page_token=-3",
        "next_page_token=999",
        "limit=1&next_page_token=1",
    ):
        calls.append(Call(f"list {query}", "GET", "/models", NO_CHANGE, query))
    for query in ("limit=abc", "next_page_token=x1", "limit=99999999999"):
        calls.append(Call(f"list {query}", "GET", "/models", codes(400), query))
    calls.append(Call("gRPC ListModels", "list", "", NO_CHANGE, api="grpc"))
    return calls


def registration_calls(served: str, version: str, store_name: str) -> list[Call]:
    """Registering what is there already, what is not, what is broken and what allowed_urls refuses."""
    return [
        Call(f"register {served} twice", "POST", "/models", codes(409), f"url={served}.mar"),
        Call("register a missing archive", "POST", "/models", codes(404), "url=mc-missing.mar"),
        # TorchServe 0.12 passes a file that is not a zip on to a worker, which cannot load it: the registration is
        # undone and answered 500 (registerModel's documented "Internal Server Error"), nothing else is touched.
        Call(
            "register a .mar that is not a zip",
            "POST",
            "/models",
            codes(400, 500),
            f"url={BROKEN}&model_name=mc-broken",
            documented_5xx=BROKEN_5XX,
            timeout=CALL_TIMEOUT,
        ),
        Call("describe the broken archive's name", "GET", "/models/mc-broken", codes(404)),
        Call(
            "register an http URL outside allowed_urls", "POST", "/models", codes(404), "url=http://127.0.0.1:9/x.mar"
        ),
        Call("register file:///etc/passwd", "POST", "/models", codes(404), "url=file:///etc/passwd"),
        Call("register ../ outside the store", "POST", "/models", codes(404), f"url=../{store_name}/{served}.mar"),
        Call("register without url", "POST", "/models", codes(400)),
        Call(f"set-default {served} to its version", "PUT", f"/models/{served}/{version}/set-default", NO_CHANGE),
        Call(f"set-default {served} to a missing version", "PUT", f"/models/{served}/9.9.9/set-default", codes(404)),
        Call("unregister a missing model", "DELETE", "/models/mc-missing", codes(404)),
        Call(f"unregister {served} missing version", "DELETE", f"/models/{served}/9.9.9", codes(404)),
    ]


def surface_calls() -> list[Call]:
    """The rest of the surface: tokens (off here), workflows, metrics, OPTIONS, unknown methods and paths."""
    return [
        Call("token type=management (tokens off)", "GET", "/token", codes(400, 404, 405), "type=management"),
        Call("token type=inference (tokens off)", "GET", "/token", codes(400, 404, 405), "type=inference"),
        Call("token type=bogus (tokens off)", "GET", "/token", codes(400, 404, 405), "type=bogus"),
        Call("list workflows", "GET", "/workflows", NO_CHANGE),
        # The workflow API's integer parameters are read as their default when they are not numbers (unpatched).
        Call("list workflows limit=abc", "GET", "/workflows", codes(200, 400), "limit=abc"),
        Call("describe a missing workflow", "GET", "/workflows/mc-missing", codes(404)),
        Call("register a missing workflow", "POST", "/workflows", codes(400, 404), "url=mc-missing.war"),
        Call("unregister a missing workflow", "DELETE", "/workflows/mc-missing", codes(404)),
        Call("metrics", "GET", "/metrics", NO_CHANGE, api="metrics", answer="text"),
        Call(
            "metrics name[]=ts_inference_requests_total",
            "GET",
            "/metrics",
            NO_CHANGE,
            "name[]=ts_inference_requests_total",
            api="metrics",
            answer="text",
        ),
        Call("metrics name[]= (empty)", "GET", "/metrics", NO_CHANGE, "name[]=", api="metrics", answer="text"),
        Call(
            "metrics name[]=missing&name[]=%ff%00",
            "GET",
            "/metrics",
            NO_CHANGE,
            "name[]=missing&name[]=%ff%00",
            api="metrics",
            answer="text",
        ),
        Call(
            "metrics name[]=<long>", "GET", "/metrics", NO_CHANGE, "name[]=" + "m" * 4000, api="metrics", answer="text"
        ),
        Call("metrics unknown path", "GET", "/nope", codes(404), api="metrics", answer="any"),
        Call("OPTIONS management /", "OPTIONS", "/", NO_CHANGE),
        Call("OPTIONS inference /", "OPTIONS", "/", NO_CHANGE, api="inference"),
        Call("PATCH /models", "PATCH", "/models", codes(405)),
        Call("BREW /models (unknown method)", "BREW", "/models", codes(405)),
        Call("DELETE /models (no name)", "DELETE", "/models", codes(405)),
        Call("unknown management path", "GET", "/nope/deeper", codes(404)),
        Call("unknown inference path", "GET", "/nope", codes(404), api="inference"),
        Call("POST /models/<deep path>", "POST", "/models/a/b/c/d", codes(404, 405)),
    ]


def copy_lifecycle(archive: str) -> tuple[list[Call], list[Call]]:
    """(register the copy and scale it up, to 0 and back; unregister it): the second list runs last, under load."""
    path = f"/models/{COPY}"
    setup = [
        Call(
            f"register {archive}.mar as {COPY}",
            "POST",
            "/models",
            NO_CHANGE,
            f"url={archive}.mar&model_name={COPY}&initial_workers=1&synchronous=true",
            effect="scale",
            model=COPY,
            timeout=CALL_TIMEOUT,
        ),
    ]
    lifecycle = [
        Call(
            f"scale {COPY} to 2",
            "PUT",
            path,
            NO_CHANGE,
            "min_worker=2&max_worker=2&synchronous=true",
            effect="scale",
            model=COPY,
            timeout=CALL_TIMEOUT,
        ),
        Call(
            f"scale {COPY} to 0",
            "PUT",
            path,
            NO_CHANGE,
            "min_worker=0&max_worker=0&synchronous=true",
            effect="zero",
            model=COPY,
            timeout=CALL_TIMEOUT,
        ),
        Call(
            f"describe {COPY} at 0 workers customized",
            "GET",
            path,
            codes(200, 503),
            "customized=true",
            documented_5xx="503 'has no worker to serve inference request' while a model has 0 workers",
        ),
        Call(
            f"scale {COPY} back to 1",
            "PUT",
            path,
            NO_CHANGE,
            "min_worker=1&max_worker=1&synchronous=true",
            effect="restore",
            model=COPY,
            timeout=CALL_TIMEOUT,
        ),
    ]
    unregister = [
        Call(
            f"unregister {COPY} under load",
            "DELETE",
            path,
            NO_CHANGE,
            "synchronous=true",
            effect="drop",
            model=COPY,
            timeout=CALL_TIMEOUT,
        ),
        Call(f"describe {COPY} after unregister", "GET", path, codes(404)),
    ]
    return setup, lifecycle + unregister


def scale_calls(model: str, workers: int) -> list[Call]:
    """One served model scaled up by one, down to 0 and back to ``workers`` under load (the full form)."""
    path = f"/models/{model}"

    def to(count: int, effect: str) -> Call:
        query = f"min_worker={count}&max_worker={count}&synchronous=true"
        return Call(
            f"scale {model} to {count}", "PUT", path, NO_CHANGE, query, effect=effect, model=model, timeout=CALL_TIMEOUT
        )

    return [to(workers + 1, "scale"), to(0, "zero"), to(workers, "restore")]


def call_table(
    models: dict[str, str], store_name: str, copy_of: str, rounds: int = 1, scale: dict[str, int] | None = None
) -> tuple[list[Call], list[Call]]:
    """(calls sent before the load starts, calls sent under load) for ``models`` {name: version}: ``rounds`` rounds of
    every call on every model, the served models in ``scale`` {name: workers} scaled up, to 0 and back, then the
    copy's scale-to-0 and unregister (once)."""
    setup, lifecycle = copy_lifecycle(copy_of)
    served = copy_of if copy_of in models else next(iter(models))
    one_round = list_calls() + registration_calls(served, models[served], store_name) + surface_calls()
    for model, version in models.items():
        one_round += describe_calls(model, version) + bad_worker_calls(model)
    scaling = [call for model, workers in (scale or {}).items() for call in scale_calls(model, workers)]
    return setup, one_round * rounds + scaling + lifecycle


def problems_of_table(calls: list[Call]) -> list[str]:
    """What is wrong with a call table itself: a 5xx expected without the documentation that says so, an effect
    without its model, a zero window never restored."""
    problems = []
    open_zero = set()
    for call in calls:
        if any(status >= 500 for status in call.expect) and not call.documented_5xx:
            problems.append(f"{call.name}: expects a 5xx without saying where TorchServe documents it")
        if call.effect and not call.model:
            problems.append(f"{call.name}: effect {call.effect} without a model")
        if call.effect == "zero":
            open_zero.add(call.model)
        if call.effect == "restore":
            open_zero.discard(call.model)
    problems += [f"{model}: scaled to 0 and never back" for model in sorted(open_zero)]
    return problems


# ------------------------------------------------------------------------------------------------ judging
def judge_call(call: Call, status: int, body: bytes) -> str:
    """Why this answer breaks the call's contract ("" when it keeps it)."""
    if status == 0:
        return f"no HTTP answer ({body[:200].decode(errors='replace')})"
    if status not in call.expect:
        return f"answered {status}, expected {'/'.join(str(s) for s in sorted(call.expect))}: {body[:200]!r}"
    if status >= 400 and call.api in ("management", "inference", "grpc"):
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if not message:
            return f"{status} without a JSON message: {body[:200]!r}"
    if status == 200 and call.answer == "json":
        try:
            json.loads(body)
        except ValueError:
            return f"200 that is not JSON: {body[:200]!r}"
    return ""


@dataclass(frozen=True)
class Window:
    """While ``kind`` ("zero" or "drop") applied to ``model``: from ``start`` to ``end`` (inf: to the end)."""

    model: str
    kind: str
    start: float
    end: float = math.inf


@dataclass(frozen=True)
class LoadAnswer:
    model: str
    status: int
    started: float
    ended: float
    right: bool  # a 200 whose body is the model's own answer
    detail: str = ""  # the start of a non-200 answer's body


# TorchServe's answer to the batch a worker was computing when a scale to 0 stopped it.
WORKER_STOPPED = "Worker died."


def excused(answer: LoadAnswer, windows: list[Window]) -> str:
    """ "zero" (a 503 while the model was deliberately at 0 workers, or the 500 of the batch its stopped worker was
    computing), "drop" (any answer once its unregister began), or ""."""
    for window in windows:
        if window.model != answer.model or answer.ended < window.start or answer.started > window.end:
            continue
        if window.kind == "drop" and answer.status != 0:  # dropped with an answer, not left without one
            return "drop"
        stopped_mid_batch = answer.status == 500 and WORKER_STOPPED in answer.detail
        if window.kind == "zero" and (answer.status == 503 or stopped_mid_batch):
            return "zero"
    return ""


def judge_load(answers: list[LoadAnswer], windows: list[Window]) -> dict[str, Counter]:
    """Per model: ok, wrong (200 with another answer), zero_503, dropped, lost (no HTTP answer), failed (any other
    status)."""
    counts: dict[str, Counter] = {}
    for answer in answers:
        count = counts.setdefault(answer.model, Counter())
        count[f"status {answer.status}"] += 1
        if answer.status == 200:
            count["ok" if answer.right else "wrong"] += 1
            continue
        reason = excused(answer, windows)
        if reason == "zero":
            count["zero_503"] += 1
        elif reason == "drop":
            count["dropped"] += 1
        elif answer.status == 0:
            count["lost"] += 1
        else:
            count["failed"] += 1
    return counts


def load_problems(counts: dict[str, Counter], models: list[str]) -> list[str]:
    """Every model got answers, none wrong, lost or failed outside what a call documents."""
    problems = []
    for model in models:
        count = counts.get(model, Counter())
        if not count["ok"]:
            problems.append(f"{model}: no request answered 200 under the campaign")
        for kind in ("wrong", "lost", "failed"):
            if count[kind]:
                problems.append(f"{model}: {count[kind]} {kind}")
    return problems


def same_answer(got: Any, want: Any, tolerance: float = 1e-3) -> bool:
    """The same JSON value, numbers within ``tolerance`` (batching changes float sums a little); keys that name the
    request (id, created) are not compared."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return False
        return all(key in ("id", "created") or same_answer(got[key], want[key], tolerance) for key in want)
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(same_answer(g, w, tolerance) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, bool) or not isinstance(want, int | float):
        return got == want
    return isinstance(got, int | float) and not isinstance(got, bool) and abs(got - want) <= tolerance


def restarted(before: dict[str, list[int]], after: dict[str, list[int]], scaled: set[str]) -> dict[str, list[int]]:
    """PIDs gone from a model the campaign did not scale."""
    gone = {}
    for model, pids in before.items():
        if model in scaled:
            continue
        missing = sorted(set(pids) - set(after.get(model, [])))
        if missing:
            gone[model] = missing
    return gone


# ------------------------------------------------------------------------------------------------ sending
def grpc_call(server: Any, call: Call) -> tuple[int, bytes]:
    """A gRPC management call as (HTTP-like status, JSON body): the error's code mapped to the status the REST API
    answers for the same refusal."""
    import grpc

    from scripts.ops.grpc_client import GrpcError, TorchServeGrpc

    http_of = {
        grpc.StatusCode.INVALID_ARGUMENT: 400,
        grpc.StatusCode.NOT_FOUND: 404,
        grpc.StatusCode.UNAVAILABLE: 503,
        grpc.StatusCode.ALREADY_EXISTS: 409,
    }
    try:
        with TorchServeGrpc.for_server(server, timeout=call.timeout) as client:
            if call.method == "describe":
                answer: Any = client.describe(call.path, customized=True)
            elif call.method == "scale":
                answer = client.scale(call.path, min_worker=100000, max_worker=100000)
            else:
                answer = client.list_models()
    except GrpcError as error:
        status = http_of.get(error.status, 500) if error.status is not None else 0
        return status, json.dumps({"message": str(error)}).encode()
    return 200, json.dumps(answer).encode()


def send(server: Any, call: Call, bases: dict[str, str]) -> tuple[int, bytes, float]:
    started = time.perf_counter()
    if call.api == "grpc":
        status, body = grpc_call(server, call)
        return status, body, time.perf_counter() - started
    headers = server.headers("inference" if call.api == "inference" else "management")
    try:
        answer = requests.request(call.method, call.url(bases), headers=headers, timeout=call.timeout)
        status, body = answer.status_code, answer.content
    except requests.RequestException as error:
        status, body = 0, str(error).encode()
    return status, body, time.perf_counter() - started


class Load:
    """Closed-loop requests to every model from ``clients`` threads each, until stopped; every answer kept."""

    def __init__(self, server: Any, bodies: dict[str, bytes], baselines: dict[str, Any], clients: int):
        self.server, self.bodies, self.baselines = server, bodies, baselines
        self.answers: list[LoadAnswer] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self.run, args=(model,), daemon=True) for model in bodies for _ in range(clients)
        ]

    def run(self, model: str) -> None:
        url = f"{self.server.inference_url}/predictions/{model}"
        client = Client(url, timeout=CALL_TIMEOUT, headers=self.server.headers("inference"))
        while not self.stop.is_set():
            started = time.perf_counter()
            status, payload = client.post(self.bodies[model])
            right = status == 200 and right_answer(payload, self.baselines[model])
            detail = "" if right else payload[:200].decode(errors="replace")
            with self.lock:
                self.answers.append(LoadAnswer(model, status, started, time.perf_counter(), right, detail))
            if status != 200:
                time.sleep(0.05)  # a model at 0 workers answers 503 at once: do not spin on it

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(CALL_TIMEOUT + 10)


def right_answer(payload: bytes, baseline: Any) -> bool:
    try:
        return same_answer(json.loads(payload), baseline)
    except ValueError:
        return False


def first_answers(server: Any, bodies: dict[str, bytes]) -> dict[str, Any]:
    """Each model's answer to its body, alone, before the campaign (the answer every later one must equal)."""
    answers = {}
    for model, body in bodies.items():
        answer = requests.post(
            f"{server.inference_url}/predictions/{model}",
            data=body,
            timeout=CALL_TIMEOUT,
            headers={"Content-Type": "application/json", **server.headers("inference")},
        )
        if answer.status_code != 200:
            raise RuntimeError(f"{model} does not answer its normal request: {answer.status_code} {answer.text[:300]}")
        answers[model] = answer.json()
    return answers


# ------------------------------------------------------------------------------------------------ campaign
@dataclass
class Record:
    """What the campaign sent and saw."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    open_zero: dict[str, float] = field(default_factory=dict)

    def mark(self, call: Call, started: float, ended: float) -> None:
        if call.effect == "zero":
            self.open_zero[call.model] = started
        elif call.effect == "restore":
            self.windows.append(Window(call.model, "zero", self.open_zero.pop(call.model, started), ended))
        elif call.effect == "drop":
            self.windows.append(Window(call.model, "drop", started))


def run_calls(server: Any, calls: list[Call], bases: dict[str, str], record: Record, log: Any) -> None:
    for call in calls:
        started = time.perf_counter()
        status, body, seconds = send(server, call, bases)
        record.mark(call, started, time.perf_counter())
        problem = judge_call(call, status, body)
        record.calls.append(
            {
                "call": call.name,
                "method": call.method,
                "api": call.api,
                "path": call.path,
                "query": call.query[:200],
                "status": status,
                "seconds": round(seconds, 2),
                "problem": problem,
                "body": body[:300].decode(errors="replace"),
            }
        )
        if problem:
            log(f"  [call] {call.name}: {problem}")


def worker_pids(server: Any, models: list[str]) -> dict[str, list[int]]:
    client = server.management()
    return {model: client.worker_pids(model) for model in models}


def all_ready(server: Any, models: list[str]) -> dict[str, list[str]]:
    """Models with a worker not READY: {model: statuses}."""
    client = server.management()
    not_ready = {}
    for model in models:
        statuses = [worker.get("status", "?") for worker in client.description(model)["workers"]]
        if not statuses or any(status != "READY" for status in statuses):
            not_ready[model] = statuses
    return not_ready


def campaign(
    server: Any,
    models: list[str],
    store: Path,
    copy_of: str = "classifier",
    rounds: int = 1,
    clients: int = 2,
    bodies: dict[str, Any] | None = None,
    scale_served: bool = False,
    log: Any = print,
) -> list[Row]:
    """The campaign against a running ``server`` serving ``models`` from ``store`` (the directory its model_store
    names: the broken archive is written there for the call and removed after). Returns three Rows: the calls, the
    load while they ran, and the models afterwards."""
    bodies = {**BODIES, **(bodies or {})}
    payloads = {model: json.dumps(bodies[model]).encode() for model in models}
    client = server.management()
    versions = {model: client.default_version(model) for model in models}
    bases = {"management": server.management_url, "inference": server.inference_url, "metrics": server.metrics_url}
    scale = {model: len(client.worker_pids(model)) for model in models} if scale_served else None
    setup, under_load = call_table(versions, Path(store).name, copy_of, rounds, scale)
    scaled = {call.model for call in setup + under_load if call.effect}
    record = Record()
    broken = Path(store) / BROKEN
    broken.write_bytes(b"this is not a zip archive\n" * 64)
    started = time.perf_counter()
    try:
        baselines = first_answers(server, payloads)
        pids_before = worker_pids(server, models)
        run_calls(server, setup, bases, record, log)
        copy_served = client.registered(COPY)
        loaded = {**payloads, COPY: payloads[copy_of]} if copy_served else payloads
        with Load(server, loaded, {**baselines, COPY: baselines[copy_of]}, clients) as load:
            time.sleep(1.0)  # requests in flight before the first call
            run_calls(server, under_load, bases, record, log)
            time.sleep(1.0)
    finally:
        broken.unlink(missing_ok=True)
        if server.management().registered(COPY):
            requests.delete(
                f"{server.management_url}/models/{COPY}", timeout=CALL_TIMEOUT, headers=server.headers("management")
            )
    seconds = time.perf_counter() - started
    after = after_campaign(server, models, payloads, baselines, pids_before, scaled)
    return [calls_row(record, rounds, seconds), load_row(load.answers, record.windows, list(loaded)), after]


def calls_row(record: Record, rounds: int, seconds: float) -> Row:
    failed = [c for c in record.calls if c["problem"]]
    server_errors = [c for c in record.calls if c["status"] >= 500]
    statuses = Counter(str(c["status"]) for c in record.calls)
    spread = ", ".join(f"{n}x {status}" for status, n in sorted(statuses.items()))
    figure = f"{len(record.calls)} raw calls in {seconds:.0f}s ({spread}); {len(failed)} not as documented"
    if server_errors:
        named = sorted(
            {f"{c['call']} ({'documented' if not c['problem'] else 'NOT documented'})" for c in server_errors}
        )
        figure += f"; 5xx: {', '.join(named)}"
    if failed:
        figure += " -- " + "; ".join(f"{c['call']}: {c['problem'][:120]}" for c in failed[:5])
    return Row(
        f"management API: every call raw under load ({rounds} round(s))",
        figure,
        "each call answered as documented (no 5xx TorchServe does not document, every 4xx with a JSON message)",
        bool(record.calls) and not failed,
        {"calls": record.calls, "failed": failed, "server_errors": server_errors},
    )


def load_row(answers: list[LoadAnswer], windows: list[Window], models: list[str]) -> Row:
    counts = judge_load(answers, windows)
    problems = load_problems(counts, models)
    figure = "; ".join(
        f"{model}: "
        + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.get(model, Counter()).items()) if "status" not in kind)
        for model in models
    )
    examples: dict[str, str] = {}
    for answer in answers:
        if answer.detail:
            examples.setdefault(f"{answer.model} {answer.status}", answer.detail)
    if problems:
        figure += " -- FAILED: " + "; ".join(problems)
    return Row(
        "management API: load on every model while the calls ran",
        figure,
        "every request answered 200 with the model's own answer; 503 only while a model was scaled to 0; the "
        f"unregistered copy's requests dropped only once its unregister began; {len(models)} models answered",
        not problems,
        {
            "counts": {model: dict(count) for model, count in counts.items()},
            "windows": [vars(window) | {"end": None if math.isinf(window.end) else window.end} for window in windows],
            "problems": problems,
            "examples": examples,
        },
    )


def after_campaign(
    server: Any,
    models: list[str],
    payloads: dict[str, bytes],
    baselines: dict[str, Any],
    pids_before: dict[str, list[int]],
    scaled: set[str],
) -> Row:
    problems = []
    for model in models:
        answer = requests.post(
            f"{server.inference_url}/predictions/{model}",
            data=payloads[model],
            timeout=CALL_TIMEOUT,
            headers={"Content-Type": "application/json", **server.headers("inference")},
        )
        if answer.status_code != 200 or not right_answer(answer.content, baselines[model]):
            problems.append(f"{model} answered {answer.status_code}: {answer.text[:200]}")
    pids_after = worker_pids(server, models)
    gone = restarted(pids_before, pids_after, scaled)
    problems += [f"{model}: worker(s) {pids} restarted" for model, pids in gone.items()]
    not_ready = all_ready(server, models)
    problems += [f"{model}: workers {statuses}" for model, statuses in not_ready.items()]
    still = server.management().registered(COPY)
    if still:
        problems.append(f"{COPY} still registered")
    figure = f"{len(models)} models answer a normal request; worker restarts {sum(map(len, gone.values()))}"
    if problems:
        figure += " -- FAILED: " + "; ".join(problems)
    return Row(
        "management API: every model afterwards",
        figure,
        "every model answers its normal request as before, every worker READY, no worker PID changed outside the "
        "scaled models",
        not problems,
        {"pids_before": pids_before, "pids_after": pids_after, "scaled": sorted(scaled), "problems": problems},
    )


# ------------------------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.reliability.management",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--running", action="store_true", help="against the `make serve` server (.run/)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every call (1)")
    parser.add_argument("--clients", type=int, default=2, help="load clients per model (2)")
    parser.add_argument("--copy-of", default="classifier", help="archive registered again, scaled to 0, unregistered")
    args = parser.parse_args(argv)
    if not args.running:
        parser.error("without --running, run it through the suite: python -m scripts.reliability --only management")
    import os

    from scripts.ops.server import dev_server

    server = dev_server(
        os.environ.get("TS_PROFILE_CONFIG") or Path(__file__).resolve().parents[2] / "config.properties"
    )
    if not server.running():
        print("error: no `make serve` server is running (start it, or drop --running)", file=sys.stderr)
        return 2
    models = [m["modelName"] for m in server.management().list_models()]
    rows = campaign(server, models, Path(server.props["model_store"]), args.copy_of, args.rounds, args.clients)
    for row in rows:
        print(f"[{'pass' if row.passed else 'FAIL'}] {row.check}: {row.figure}")
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
