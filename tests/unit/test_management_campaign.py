"""The management campaign's pure parts: its call table and the judges of call answers and load answers
(scripts/reliability/management.py); the campaign itself runs against a real server in `make reliability`."""

import json

import pytest

from scripts.reliability.management import (
    COPY,
    Call,
    LoadAnswer,
    Window,
    call_table,
    codes,
    judge_call,
    judge_load,
    load_problems,
    problems_of_table,
    restarted,
    same_answer,
)

MODELS = {"classifier": "1.0", "minilm": "1.0", "generator": "1.0"}


def error(status, message="bad"):
    return json.dumps({"code": status, "type": "X", "message": message}).encode()


def test_the_table_is_consistent_and_covers_every_part_of_the_api():
    setup, calls = call_table(MODELS, "store", "classifier", rounds=2, scale={"minilm": 2})
    assert problems_of_table(setup + calls) == []
    names = " | ".join(call.name for call in calls)
    for expected in (
        "customized",
        "/all",
        "gRPC DescribeModel",
        "list limit=abc",
        "min_worker=-1",
        "100000",
        "min_worker=abc",
        "set-default",
        "twice",
        "not a zip",
        "allowed_urls",
        "token",
        "workflows",
        "metrics name[]=",
        "OPTIONS",
        "BREW",
        "unknown management path",
        f"unregister {COPY} under load",
        "scale minilm to 0",
    ):
        assert expected in names, expected
    # Two rounds of the per-model calls; the copy's lifecycle once, last, ending with its unregister.
    assert sum(call.name == "describe /models/generator customized" for call in calls) == 2
    assert [call.effect for call in calls if call.model == COPY][-1] == "drop"
    assert setup[0].effect == "scale" and setup[0].model == COPY


def test_the_table_check_refuses_an_undocumented_5xx_and_a_zero_never_restored():
    bad = [
        Call("a", "GET", "/x", codes(500)),
        Call("b", "PUT", "/models/m", codes(200), effect="zero", model="m"),
        Call("c", "PUT", "/models/m", codes(200), effect="scale"),
    ]
    problems = problems_of_table(bad)
    assert any("a: expects a 5xx" in p for p in problems)
    assert any("m: scaled to 0 and never back" in p for p in problems)
    assert any("c: effect scale without a model" in p for p in problems)


@pytest.mark.parametrize(
    "call, status, body, verdict",
    [
        (Call("d", "GET", "/models/m", codes(200)), 200, b'[{"modelName": "m"}]', ""),
        (Call("d", "GET", "/models/m", codes(200)), 200, b"<html>", "not JSON"),
        (Call("m", "GET", "/metrics", codes(200), api="metrics", answer="text"), 200, b"# HELP x\n", ""),
        (Call("s", "PUT", "/models/m", codes(400)), 400, error(400, "must be an integer"), ""),
        (Call("s", "PUT", "/models/m", codes(400)), 400, b"", "without a JSON message"),
        (Call("s", "PUT", "/models/m", codes(400)), 500, error(500), "answered 500, expected 400"),
        (Call("s", "PUT", "/models/m", codes(400)), 200, b"{}", "answered 200"),
        (Call("s", "PUT", "/models/m", codes(400)), 0, b"timed out", "no HTTP answer"),
        (Call("r", "POST", "/models", codes(400, 500), documented_5xx="doc"), 500, error(500), ""),
    ],
)
def test_judge_call(call, status, body, verdict):
    got = judge_call(call, status, body)
    assert (verdict in got and got) if verdict else got == ""


def answer(model, status, started=0.0, ended=1.0, right=True, detail=""):
    return LoadAnswer(model, status, started, ended, right and status == 200, detail)


def test_judge_load_excuses_only_what_a_call_documents():
    windows = [Window("a", "zero", 10.0, 20.0), Window("copy", "drop", 30.0)]
    answers = [
        answer("a", 200),
        answer("a", 200, right=False),  # a 200 with another model's answer
        answer("a", 503, 12.0, 12.1),  # inside its zero window
        answer("a", 503, 25.0, 25.1),  # after it: not excused
        answer("a", 500, 12.0, 12.1),  # a 500 is not the documented 503, even at 0 workers
        answer("a", 500, 11.0, 11.5, detail='{"code": 500, "message": "Worker died."}'),  # its batch, stopped
        answer("b", 503, 12.0, 12.1),  # another model's window excuses nothing
        answer("copy", 500, 29.0, 31.0),  # dropped by the unregister
        answer("copy", 404, 40.0, 40.1),
        answer("copy", 0, 29.0, 329.0),  # no answer at all: lost, even while unregistering
        answer("copy", 0, 1.0, 2.0),
    ]
    counts = judge_load(answers, windows)
    assert (counts["a"]["ok"], counts["a"]["wrong"], counts["a"]["zero_503"], counts["a"]["failed"]) == (1, 1, 2, 2)
    assert counts["b"]["failed"] == 1
    assert (counts["copy"]["dropped"], counts["copy"]["lost"]) == (2, 2)
    problems = load_problems(counts, ["a", "b", "copy", "never-sent"])
    assert "a: 1 wrong" in problems and "a: 2 failed" in problems and "copy: 2 lost" in problems
    assert "b: no request answered 200 under the campaign" in problems
    assert "never-sent: no request answered 200 under the campaign" in problems
    assert load_problems(judge_load([answer("a", 200), answer("a", 503, 12.0, 12.1)], windows), ["a"]) == []


def test_same_answer_tolerates_float_noise_and_request_ids_only():
    want = {"id": "x", "label": 3, "probabilities": [0.25, 0.75], "text": "hi"}
    assert same_answer({**want, "id": "y", "probabilities": [0.2504, 0.7496]}, want)
    assert not same_answer({**want, "label": 4}, want)
    assert not same_answer({**want, "probabilities": [0.3, 0.7]}, want)
    assert not same_answer({**want, "text": "ho"}, want)
    assert not same_answer({k: v for k, v in want.items() if k != "label"}, want)
    assert not same_answer({**want, "label": True}, {**want, "label": 1})


def test_restarted_names_gone_pids_outside_the_scaled_models():
    before = {"a": [1, 2], "b": [3], "c": [4]}
    after = {"a": [1, 2], "b": [5], "c": [6]}
    assert restarted(before, after, scaled={"c"}) == {"b": [3]}
    assert restarted(before, before, scaled=set()) == {}
