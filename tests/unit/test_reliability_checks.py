"""Every reliability check can fail: each is fed fabricated outcomes (a fake server, the traffic functions and HTTP
calls replaced) that break one part of its target, and must fail naming it; the good outcome must pass.

No server runs here: what a real TorchServe answers is covered by tests/integration/test_reliability_quick.py.
"""

import json
import threading
import time
from types import SimpleNamespace

import pytest

from scripts.ops.auth import bearer
from scripts.reliability import corpus, correctness, resilience, rows, security, soak
from scripts.reliability.traffic import Outcome, strict_json

BATCH_SIZE = 4


class FakeManagement:
    """The management client as the checks use it: the model's description and worker PIDs from `state`, and raw
    answers from `respond(method, path, token, params)` (the security check's calls)."""

    def __init__(self, state, token=None, respond=None):
        self.state, self.token, self.respond = state, token, respond

    def description(self, model):
        return {"batchSize": BATCH_SIZE, "workers": [dict(w) for w in self.state["workers"]]}

    def worker_pids(self, model):
        return sorted(worker["pid"] for worker in self.state["workers"])

    def request(self, method, path, params=None, timeout=None):
        return self.respond(method, path, self.token, params)


class FakeServer:
    inference_url = "http://127.0.0.1:1"
    management_url = "http://127.0.0.1:2"

    def __init__(self, tokens=None, props=None):
        self.tokens = tokens or {}
        self.props = props or {}
        self.state = {"workers": [{"pid": 100, "status": "READY"}]}
        self.respond = None
        self.client = None  # a test may put its own client here

    def headers(self, api):
        return {"Authorization": f"Bearer {self.tokens[api]}"} if api in self.tokens else {}

    def management(self, timeout=30.0, authorized=True):
        return self.client or FakeManagement(
            self.state, self.tokens.get("management") if authorized else None, self.respond
        )

    def pid(self):
        return 1


class EchoReference:
    """Request i's right answer is {"echo": i}."""

    name = "fake"

    def body(self, index):
        return json.dumps({"i": index}).encode()

    def matches(self, index, answer):
        return answer == {"echo": index}


def answer(index, status=200, body=None, started_at=0.0, latency_s=0.01):
    payload = json.dumps({"echo": index}).encode() if body is None else body
    return Outcome(index, status, latency_s, payload, started_at)


def good(count):
    return [answer(i) for i in range(count)]


@pytest.fixture
def server():
    return FakeServer()


@pytest.fixture
def workers(server):
    """The model's workers as the management API reports them; a test changes state["workers"] to simulate
    restarts."""
    return server.state


def test_strict_json_refuses_the_tokens_python_accepts():
    assert strict_json('{"a": [1.5, -2e-300]}') == {"a": [1.5, -2e-300]}
    for text in ('{"p": [NaN]}', '{"p": Infinity}', "[-Infinity]"):
        json.loads(text)  # Python's own parser takes them...
        with pytest.raises(ValueError):
            strict_json(text)  # ...a strict client does not


# ------------------------------------------------------------------------------------------------ concurrency
@pytest.mark.parametrize(
    "breakage, expected",
    [
        (lambda o: o.__setitem__(3, None), "1 lost"),
        (lambda o: o.__setitem__(3, answer(3, status=0, body=b"timed out")), "1 lost"),
        (lambda o: o.__setitem__(3, answer(3, status=500, body=b'{"message": "x"}')), "1 errors"),
        (lambda o: o.__setitem__(3, answer(3, body=b'{"echo": 4}')), "1 mismatches"),
        (lambda o: o.__setitem__(3, answer(3, body=b'{"echo": NaN}')), "1 mismatches"),
        (lambda o: o.__setitem__(3, answer(3, body=b"null")), "1 mismatches"),
    ],
)
def test_concurrency_fails_on_a_lost_failed_or_wrong_answer(monkeypatch, server, breakage, expected):
    outcomes = good(10)
    monkeypatch.setattr(correctness, "closed_loop", lambda url, bodies, clients, headers=None: outcomes)
    assert correctness.concurrency(server, EchoReference(), 10, 2).passed
    breakage(outcomes)
    row = correctness.concurrency(server, EchoReference(), 10, 2)
    assert not row.passed and expected in row.figure


def test_concurrency_fails_when_nothing_was_sent(monkeypatch, server):
    monkeypatch.setattr(correctness, "closed_loop", lambda url, bodies, clients, headers=None: [])
    assert not correctness.concurrency(server, EchoReference(), 0, 2).passed


def test_concurrency_fails_when_outcomes_are_missing(monkeypatch, server):
    monkeypatch.setattr(correctness, "closed_loop", lambda url, bodies, clients, headers=None: good(5))
    assert not correctness.concurrency(server, EchoReference(), 10, 2).passed


# ------------------------------------------------------------------------------------------------ bad input
CASE = corpus.BadRequest("json null", b"null", "application/json", 400, "JSON object")


@pytest.mark.parametrize(
    "case, status, text, expected",
    [
        (CASE, 500, '{"code": 500, "message": "inference failed"}', "status 500 (wanted 400)"),
        (CASE, 200, '{"label": 1}', "status 200 (wanted 400)"),
        (CASE, 400, '{"code": 400, "message": "something else"}', "lacks 'JSON object'"),
        (CASE, 400, '{"code": 400, "message": "not a JSON object", "x": NaN}', "not strict JSON"),
        (CASE, 400, "Bad Request", "not strict JSON"),
        (CASE, 400, '{"code": 400}', "has no 'message'"),
        (
            corpus.BadRequest("no fragment", b"null", "application/json", 400, ""),
            400,
            '{"code": 400, "message": "anything"}',
            "gives no expected message",
        ),
    ],
)
def test_a_bad_request_answer_is_judged_on_status_json_and_message(case, status, text, expected):
    assert expected in correctness.judge_bad_answer(case, status, text)


def test_the_expected_bad_request_answer_passes():
    assert correctness.judge_bad_answer(CASE, 400, '{"code": 400, "message": "body must be a JSON object"}') is None


def test_torchserves_own_413_is_judged_on_its_status():
    """The frontend refuses a body over max_request_size before any handler, with an empty answer (seen)."""
    oversized = corpus.BadRequest("oversized body", b"x", "application/json", 413, "")
    assert correctness.judge_bad_answer(oversized, 413, "") is None
    assert "status 400 (wanted 413)" in correctness.judge_bad_answer(oversized, 400, '{"message": "x"}')


class FakeSession:
    """Answers a corpus request with `bad` and the good request with `good` (status, text)."""

    def __init__(self, bad, good_answer):
        self.headers = {}
        self.bad, self.good_answer = bad, good_answer

    def post(self, url, data, headers, timeout):
        status, text = self.good_answer if data == EchoReference().body(0) else self.bad
        return SimpleNamespace(status_code=status, text=text)


def run_bad_input(monkeypatch, server, workers, cases, bad, good_answer=(200, '{"echo": 0}'), restart=False):
    monkeypatch.setattr(correctness.corpus, "load", lambda model: cases)
    monkeypatch.setattr(correctness.requests, "Session", lambda: FakeSession(bad, good_answer))
    if restart:
        calls = iter([[100], [101]])
        server.client = SimpleNamespace(worker_pids=lambda model: next(calls))
    return correctness.bad_input(server, EchoReference())


def test_bad_input_passes_when_every_case_is_answered_as_expected(monkeypatch, server, workers):
    row = run_bad_input(monkeypatch, server, workers, [CASE] * 3, (400, '{"code": 400, "message": "a JSON object"}'))
    assert row.passed and row.figure.startswith("3/3 answered as expected")


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"bad": (500, '{"message": "boom"}')}, "status 500"),
        ({"bad": (400, '{"message": "a JSON object"}'), "good_answer": (500, '{"message": "x"}')}, "good request"),
        ({"bad": (400, '{"message": "a JSON object"}'), "good_answer": (200, '{"echo": 7}')}, "answered wrongly"),
    ],
)
def test_bad_input_fails_on_a_wrong_answer(monkeypatch, server, workers, kwargs, expected):
    row = run_bad_input(monkeypatch, server, workers, [CASE], **kwargs)
    assert not row.passed and any(expected in failure for failure in row.details["failures"])


def test_bad_input_fails_when_a_worker_restarted(monkeypatch, server, workers):
    row = run_bad_input(monkeypatch, server, workers, [CASE], (400, '{"message": "a JSON object"}'), restart=True)
    assert not row.passed and "worker restarts: yes" in row.figure


def test_bad_input_fails_on_an_empty_corpus_or_without_workers(monkeypatch, server, workers):
    assert not run_bad_input(monkeypatch, server, workers, [], (400, "{}")).passed
    workers["workers"] = []
    assert not run_bad_input(monkeypatch, server, workers, [CASE], (400, '{"message": "a JSON object"}')).passed


@pytest.mark.parametrize("model", corpus.models_with_corpus())
def test_every_corpus_entry_names_a_message_fragment(model):
    """Except TorchServe's own 413 for a body over max_request_size, every case must say what its message
    contains; an empty fragment is contained in every message, so that part of the check could never fail."""
    cases = corpus.load(model)
    assert cases
    assert [c.name for c in cases if not c.message and c.status != 413] == []


# ------------------------------------------------------------------------------------------------ capacity
def fake_steady_load(outcomes):
    def steady_load(url, make_body, clients, stop, headers=None):
        return [], outcomes

    return steady_load


def test_capacity_is_measured_from_correct_answers(monkeypatch, server):
    monkeypatch.setattr(resilience, "steady_load", fake_steady_load(good(20)))
    assert resilience.measure_capacity(server, EchoReference(), 0.01) > 0


@pytest.mark.parametrize(
    "outcomes, expected",
    [
        ([], "no correct answer"),
        ([answer(i, status=503, body=b'{"code": 503}') for i in range(20)], "no correct answer"),
        (good(19) + [answer(19, status=500, body=b"{}")], "errors under plain closed-loop load"),
        (good(19) + [answer(19, body=b'{"echo": 0}')], "1 wrong"),
    ],
)
def test_capacity_estimate_fails_instead_of_inventing_a_figure(monkeypatch, server, outcomes, expected):
    monkeypatch.setattr(resilience, "steady_load", fake_steady_load(outcomes))
    with pytest.raises(rows.CheckFailed) as failure:
        resilience.measure_capacity(server, EchoReference(), 0.01)
    assert not failure.value.row.passed and expected in failure.value.row.figure


# ------------------------------------------------------------------------------------------------ overload
def run_overload(monkeypatch, server, outcomes, after=None, **options):
    monkeypatch.setattr(resilience, "open_loop", lambda *args, **kwargs: outcomes)
    monkeypatch.setattr(
        resilience, "closed_loop", lambda url, bodies, clients, headers=None: after or good(len(bodies))
    )
    return resilience.overload(server, EchoReference(), 10.0, 2.0, 1, settle_s=0, **options)


def mixed(accepted=10, rejected=10, reject_latency_s=0.005, accept_latency_s=0.01):
    return [answer(i, started_at=i * 0.05, latency_s=accept_latency_s) for i in range(accepted)] + [
        answer(
            accepted + i,
            status=503,
            body=b'{"code": 503}',
            started_at=(accepted + i) * 0.05,
            latency_s=reject_latency_s,
        )
        for i in range(rejected)
    ]


def test_overload_passes_with_fast_rejections_and_correct_acceptances(monkeypatch, server):
    row = run_overload(monkeypatch, server, mixed(), queue_size=16)
    assert row.passed, row.figure
    assert "job queue 16" in row.check and row.details["rejected"] == 10 and not row.details["capped"]


@pytest.mark.parametrize(
    "outcomes, after, expected",
    [
        (mixed(accepted=0, rejected=20), None, "no request was accepted"),  # a server answering everything 503
        (mixed(rejected=0), None, "nothing was rejected"),  # a server that was never overloaded proves nothing
        ([], None, "no request was sent"),
        (mixed() + [answer(99, status=500, body=b"{}", started_at=2.0)], None, "neither 200 nor 503"),
        (mixed() + [None], None, "neither 200 nor 503"),
        (mixed()[:-1] + [answer(9, body=b'{"echo": 1}', started_at=1.0)], None, "accepted answers wrong"),
        (mixed(reject_latency_s=0.5, accept_latency_s=2.0), None, "rejection p99 500 ms > 50 ms"),
        (mixed(reject_latency_s=0.02), None, "rejections (p50 20 ms) not faster than accepted requests (p50 10 ms)"),
        (mixed(), good(49) + [answer(49, status=503, body=b"{}")], "after the overload: 1 errors"),
        (mixed(), good(49) + [answer(49, body=b'{"echo": 1}')], "1 wrong of 50"),
    ],
)
def test_overload_fails(monkeypatch, server, outcomes, after, expected):
    row = run_overload(monkeypatch, server, outcomes, after)
    assert not row.passed and expected in row.figure, row.figure


def test_overload_rejection_bound_is_a_parameter(monkeypatch, server):
    """The quick run's looser bound: 200 ms rejections pass it while accepted requests wait longer."""
    outcomes = mixed(reject_latency_s=0.2, accept_latency_s=1.0)
    assert not run_overload(monkeypatch, server, outcomes).passed
    row = run_overload(monkeypatch, server, outcomes, rejection_p99_ms=250)
    assert row.passed and "p99 <= 250 ms" in row.target, row.figure


def test_overload_reports_a_capped_rate_and_still_fails_without_rejections(monkeypatch, server):
    monkeypatch.setattr(resilience, "open_loop", lambda *args, **kwargs: mixed(rejected=0))
    monkeypatch.setattr(resilience, "closed_loop", lambda url, bodies, clients, headers=None: good(len(bodies)))
    row = resilience.overload(server, EchoReference(), resilience.MAX_OVERLOAD_RPS, 2.0, 1, settle_s=0)
    assert "capped at the generator's" in row.check and row.details["capped"]
    assert not row.passed and "nothing was rejected" in row.figure


# ------------------------------------------------------------------------------------------------ overload model
@pytest.fixture
def classifier_archive(tmp_path):
    """A classifier.mar as scripts/package.py packs it: manifest, model-config.yaml, the exported program."""
    import io
    import zipfile

    import torch
    import yaml

    from scripts.train_classifier import MLPClassifier, export

    torch.manual_seed(0)
    program = io.BytesIO()
    torch.export.save(export(MLPClassifier(in_features=8, hidden=16, classes=4).eval()), program)
    path = tmp_path / "classifier.mar"
    manifest = {"model": {"modelName": "classifier", "configFile": "model-config.yaml", "handler": "network_model.py"}}
    config = {
        "minWorkers": 1,
        "batchSize": 16,
        "maxBatchDelay": 5,
        "handler": {"threads": 1, "max_rows_per_request": 64},
    }
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("model-config.yaml", yaml.safe_dump(config))
        archive.writestr("model.pt2", program.getvalue())
    return path


def test_overload_archive_is_the_classifier_with_a_short_queue_under_its_own_name(classifier_archive, tmp_path):
    import zipfile

    import yaml

    from scripts.reliability import overload

    store = tmp_path / "store"
    store.mkdir()
    built = overload.build_archive(classifier_archive, store)
    assert built == store / "classifier-overload.mar"
    with zipfile.ZipFile(built) as archive:
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
        config = yaml.safe_load(archive.read("model-config.yaml"))
        assert archive.read("model.pt2") == zipfile.ZipFile(classifier_archive).read("model.pt2")
    assert manifest["model"]["modelName"] == "classifier-overload"
    assert config["jobQueueSize"] == overload.QUEUE_SIZE and config["handler"]["max_rows_per_request"] == overload.ROWS
    assert config["handler"]["threads"] == 1 and config["batchSize"] == 16  # the rest as shipped
    assert overload.QUEUE_SIZE >= 16  # the capacity estimate's 16 closed-loop clients always fit in the queue


def test_heavy_reference_checks_every_row_of_every_answer(classifier_archive):
    import torch

    from scripts.reliability import overload
    from scripts.reliability.references import load_classifier

    reference = overload.HeavyClassifierReference(classifier_archive, rows=5, bodies=3)
    assert reference.name == "classifier-overload"
    body = json.loads(reference.body(4))  # cycles: request 4 sends body 1
    assert reference.body(4) == reference.body(1) and len(body["inputs"]) == 5 and len(body["inputs"][0]) == 8
    assert all(value == round(value, overload.DECIMALS) for row in body["inputs"] for value in row)
    model = load_classifier(classifier_archive)
    with torch.inference_mode():
        probabilities = torch.softmax(model(torch.tensor(body["inputs"], dtype=torch.float32)), dim=-1)
    served = [{"label": int(row.argmax()), "probabilities": row.tolist()} for row in probabilities]
    assert reference.matches(4, served)
    assert not reference.matches(5, served)  # another body's answer
    assert not reference.matches(4, served[:-1])  # a row missing
    assert not reference.matches(4, {"label": 0, "probabilities": served[0]["probabilities"]})  # not a list
    wrong_label = [dict(row) for row in served]
    wrong_label[2]["label"] = int(probabilities[2].argmin())
    assert not reference.matches(4, wrong_label)
    out_of_range = [dict(row) for row in served]
    out_of_range[0]["label"] = 99
    assert not reference.matches(4, out_of_range)
    off = [dict(row) for row in served]
    off[3]["probabilities"] = [p + 0.01 for p in off[3]["probabilities"]]
    assert not reference.matches(4, off)


# ------------------------------------------------------------------------------------------------ worker kill
def run_worker_kill(
    monkeypatch, server, workers, failures=2, recover=True, replace=True, wrong=0, served_before=True, after_s=2.0
):
    outcomes = [answer(i, started_at=time.perf_counter() - 1) for i in range(20 if served_before else 0)]

    def steady_load(url, make_body, clients, stop, headers=None):
        return [], outcomes

    def kill(pid, signal_number):
        assert pid == 100
        now = time.perf_counter()
        start = len(outcomes)
        outcomes.extend(
            answer(start + i, status=500, body=b'{"message": "Worker died."}', started_at=now) for i in range(failures)
        )
        if recover:
            start = len(outcomes)
            outcomes.extend(answer(start + i, started_at=now + 0.01) for i in range(5))
        outcomes.extend(answer(0, body=b'{"echo": 99}', started_at=now + 0.02) for _ in range(wrong))
        workers["workers"] = [{"pid": 101 if replace else 100, "status": "READY"}]

    monkeypatch.setattr(resilience, "steady_load", steady_load)
    monkeypatch.setattr(resilience.os, "kill", kill)
    return resilience.worker_kill(server, EchoReference(), clients=4, before_s=0, after_s=after_s, settle_s=0)


def test_worker_kill_passes_when_only_the_in_flight_batch_fails(monkeypatch, server, workers):
    row = run_worker_kill(monkeypatch, server, workers, failures=BATCH_SIZE)
    assert row.passed, row.figure
    assert row.details["in_flight_bound"] == BATCH_SIZE and row.details["failed"] == BATCH_SIZE


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"failures": BATCH_SIZE + 1}, f"{BATCH_SIZE + 1} failed > in-flight batch {BATCH_SIZE}"),
        ({"recover": False, "after_s": 0.3}, "no answer within 20 s"),
        ({"replace": False, "after_s": 0.3}, "worker not replaced"),
        ({"wrong": 1}, "1 wrong answers"),
        ({"served_before": False}, "not run: no answer"),
    ],
)
def test_worker_kill_fails(monkeypatch, server, workers, kwargs, expected):
    row = run_worker_kill(monkeypatch, server, workers, **kwargs)
    assert not row.passed and expected in row.figure, row.figure


def test_worker_kill_fails_without_a_worker(monkeypatch, server, workers):
    workers["workers"] = []
    row = run_worker_kill(monkeypatch, server, workers)
    assert not row.passed and "no worker to kill" in row.figure


# ------------------------------------------------------------------------------------------------ hang
HANG, GOOD = b'{"hang": true}', b'{"good": true}'


def run_hang(monkeypatch, server, workers, hung_status=500, later=(200, '{"label": 1}'), replace=True):
    def post(url, data, headers, timeout):
        if data == HANG:
            if replace:
                workers["workers"] = [{"pid": 101, "status": "READY"}]
            return SimpleNamespace(status_code=hung_status, text='{"code": 500, "message": "Worker died."}')
        return SimpleNamespace(status_code=later[0], text=later[1])

    monkeypatch.setattr(resilience.requests, "post", post)
    return resilience.hang(server, "fake", GOOD, HANG, 0, good_check=lambda answer: "label" in answer, recover_s=0.3)


def test_hang_passes_when_the_batch_fails_and_the_worker_is_replaced(monkeypatch, server, workers):
    row = run_hang(monkeypatch, server, workers)
    assert row.passed, row.figure


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"hung_status": 200}, "not a 5xx"),
        ({"later": (503, '{"message": "x"}')}, "no correct answer within 0.3 s"),
        ({"later": (200, '{"other": 1}')}, "5 of 5 later requests failed or were wrong"),
        ({"later": (200, '{"label": NaN}')}, "later requests failed or were wrong"),
        ({"replace": False}, "worker not replaced"),
    ],
)
def test_hang_fails(monkeypatch, server, workers, kwargs, expected):
    row = run_hang(monkeypatch, server, workers, **kwargs)
    assert not row.passed and expected in row.figure, row.figure


# ------------------------------------------------------------------------------------------------ security
SECURE = {"inference": "inf-key", "management": "mgmt-key"}


def fake_http(monkeypatch, answers):
    """answers: name -> status, where name is what the security check asks (see classify)."""

    def classify(method, url, headers, params=None, data=None):
        token = (headers or {}).get("Authorization", "").removeprefix("Bearer ")
        if "/predictions/" in url:
            if data and len(data) > 1000:
                return "oversized_body"
            return {"": "inference_without_token", "inf-key": "inference_with_token"}.get(
                token, "inference_wrong_token"
            )
        if params:
            return "register_outside_url"
        return "management_with_token" if token == "mgmt-key" else "management_without_token"

    def answer(name):
        status = answers[name]
        text = '{"label": 1}' if status == 200 else f'{{"code": {status}, "message": "refused"}}'
        return SimpleNamespace(status_code=status, text=answers.get(f"{name}_text", text))

    def respond(method):
        def call(url, headers=None, params=None, data=None, timeout=None):
            return answer(classify(method, url, headers, params, data))

        return call

    def management(method, path, token, params):
        return answer(classify(method, f"{FakeServer.management_url}{path}", bearer(token), params))

    monkeypatch.setattr(security.requests, "post", respond("POST"))
    return management


SECURE_ANSWERS = {
    "inference_without_token": 400,
    "inference_wrong_token": 400,
    "inference_with_token": 200,
    "management_without_token": 400,
    "management_with_token": 200,
    "register_outside_url": 404,
    "oversized_body": 413,
}


def run_security(monkeypatch, tokens=SECURE, **changes):
    management = fake_http(monkeypatch, {**SECURE_ANSWERS, **changes})
    server = FakeServer(tokens=tokens, props={"max_request_size": "100"})
    server.respond = management
    return security.security(server, b'{"inputs": []}', "fake", good_check=lambda answer: answer == {"label": 1})


def test_security_passes_with_the_production_settings(monkeypatch):
    row = run_security(monkeypatch)
    assert row.passed, row.figure


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"inference_without_token": 200}, "inference_without_token answered 200"),
        ({"inference_wrong_token": 200}, "inference_wrong_token answered 200"),
        ({"management_without_token": 200}, "management_without_token answered 200"),
        ({"inference_with_token": 400}, "with the token: 400"),
        ({"inference_with_token_text": '{"label": 2}'}, "with the token: 200"),
        ({"management_with_token": 400}, "management with the token answered 400"),
        ({"register_outside_url": 200}, "outside URL answered 200"),
        ({"oversized_body": 500}, "oversized body answered 500"),
    ],
)
def test_security_fails(monkeypatch, changes, expected):
    row = run_security(monkeypatch, **changes)
    assert not row.passed and expected in row.figure, row.figure


def test_security_fails_against_a_server_without_token_authorization(monkeypatch):
    everything_served = {name: 200 for name in SECURE_ANSWERS} | {"oversized_body": 413, "register_outside_url": 404}
    row = run_security(monkeypatch, tokens={}, **everything_served)
    assert not row.passed and "no inference key" in row.figure


# ------------------------------------------------------------------------------------------------ loading
def test_unsafe_loading_finds_an_unpickling_load(monkeypatch, tmp_path):
    (tmp_path / "handlers").mkdir()
    safe = tmp_path / "handlers" / "safe.py"
    safe.write_text("import torch\nstate = torch.load('w.pt', weights_only=True)\n")
    monkeypatch.setattr(security, "REPO", tmp_path)
    assert security.unsafe_loading(("handlers",)).passed
    (tmp_path / "handlers" / "unsafe.py").write_text(
        "import pickle, torch\nm = torch.load('m.pt')\no = pickle.loads(b'')\n"
    )
    row = security.unsafe_loading(("handlers",))
    assert not row.passed and row.figure.startswith("2 unsafe load(s)")


def test_unsafe_loading_fails_when_it_scanned_nothing(monkeypatch, tmp_path):
    (tmp_path / "handlers").mkdir()
    monkeypatch.setattr(security, "REPO", tmp_path)
    row = security.unsafe_loading(("handlers",))
    assert not row.passed and "in 0 files" in row.figure


# ------------------------------------------------------------------------------------------------ soak
def run_soak(monkeypatch, server, rss=lambda n: 500.0, statuses=None, pids=lambda n: [100], samples=8):
    """A soak whose load lasts until the sampler took `samples` samples; rss(n) and pids(n) per sample n."""
    taken = {"n": 0}
    enough = threading.Event()

    def worker_pids(model):
        taken["n"] += 1
        if taken["n"] >= samples:
            enough.set()
        return pids(taken["n"])

    def open_loop(url, make_body, rate, seconds, headers=None):
        enough.wait(10)
        count = len(statuses) if statuses is not None else 20
        return [
            answer(
                i, status=(statuses or [200] * count)[i], body=None if (statuses or [200] * count)[i] == 200 else b"{}"
            )
            for i in range(count)
        ]

    server.client = SimpleNamespace(worker_pids=worker_pids)
    monkeypatch.setattr(soak, "open_loop", open_loop)
    monkeypatch.setattr(soak, "rss_mb", lambda pid: rss(taken["n"]))
    return soak.soak(server, EchoReference(), 1, 10, sample_every=0.001)


def test_soak_passes_with_flat_memory_and_clean_answers(monkeypatch, server):
    row = run_soak(monkeypatch, server)
    assert row.passed, row.figure


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"rss": lambda n: 500.0 + 20 * n}, "worker RSS grew"),
        ({"rss": lambda n: None}, "worker RSS not measured"),
        ({"statuses": [200] * 19 + [500]}, "1 errors"),
        ({"statuses": []}, "no request was sent"),
        ({"pids": lambda n: [100] if n < 4 else [101]}, "1 worker restarts"),
    ],
)
def test_soak_fails(monkeypatch, server, kwargs, expected):
    row = run_soak(monkeypatch, server, **kwargs)
    assert not row.passed and expected in "; ".join(row.details["reasons"]), row.figure
