"""The cost check (scripts/reliability/cost.py): its verdict fails on every kind of bad outcome, and the requests it
times really are the largest the shipped limits accept."""

import json

import pytest

from handlers.text.dialects.native import parse_embedding
from handlers.text.requests.common import TextLimits
from handlers.text.requests.embedding import VectorSpace
from scripts.reliability.cost import archive_config, classifier_requests, judge, minilm_requests

GOOD_TIMES = {"chars": 0.40, "padding": 0.68}
GOOD_RSS = {"steady": {101: 500.0, 102: 510.0}, "after": {101: 520.0, 102: 540.0}}


def test_good_measurements_pass_and_the_figure_shows_them():
    row = judge("minilm", GOOD_TIMES, GOOD_RSS, [])
    assert row.passed, row.figure
    assert "padding 680 ms" in row.figure and "+5.9%" in row.figure


BAD = {
    "a request over 1 s": ({**GOOD_TIMES, "padding": 1.2}, GOOD_RSS, [], "the padding request took 1.20 s"),
    "RSS +11 %": (GOOD_TIMES, {"steady": {101: 500.0}, "after": {101: 555.0}}, [], "above +10%"),
    "nothing timed": ({}, GOOD_RSS, [], "no maximum-size request was timed"),
    "RSS not read": (GOOD_TIMES, {"steady": {101: 500.0}, "after": {101: None}}, [], "could not be read"),
    "no workers measured": (GOOD_TIMES, {"steady": {}, "after": {}}, [], "not measured on the same workers"),
    "worker replaced": (
        GOOD_TIMES,
        {"steady": {101: 500.0}, "after": {103: 480.0}},
        [],
        "not measured on the same workers",
    ),
    "a refused max-size request": (GOOD_TIMES, GOOD_RSS, ["chars request: answered 413"], "answered 413"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_outcome_fails_the_check_with_its_reason(case):
    times, rss, failures, reason = BAD[case]
    row = judge("minilm", times, rss, failures)
    assert not row.passed
    assert reason in row.figure and any(reason in r for r in row.details["reasons"])


def test_the_targets_are_parameters_of_the_verdict():
    assert not judge("minilm", GOOD_TIMES, GOOD_RSS, [], time_target=0.5).passed
    assert not judge("minilm", GOOD_TIMES, GOOD_RSS, [], rss_target=0.05).passed


def test_without_a_time_target_the_times_are_reported_and_the_rest_still_judged():
    # The short form (make test): a slow CPU kind's time is a figure, not a failure; memory and answers still count.
    slow = {**GOOD_TIMES, "padding": 1.55}
    row = judge("minilm", slow, GOOD_RSS, [], time_target=None)
    assert row.passed and "padding 1550 ms" in row.figure and row.details["median_seconds"]["padding"] == 1.55
    assert not judge("minilm", slow, {"steady": {101: 500.0}, "after": {101: 555.0}}, [], time_target=None).passed
    assert not judge("minilm", slow, GOOD_RSS, ["1 of 30 maximum-size requests were not answered 200"], None).passed


@pytest.fixture(scope="module")
def minilm_limits(model_store):
    return archive_config(model_store, "minilm")[1]


def test_minilm_max_requests_are_accepted_and_reach_the_shipped_limits(minilm_limits, unpacked_model):
    """Each kind parses under the shipped limits and hits the token/char limits exactly (checked with the archive's
    own tokenizer), so the check times the real worst case and not something smaller."""
    from handlers.text.model import read_model_files

    tokenizer = read_model_files(unpacked_model("minilm"), "embedding").tokenizer
    limits = TextLimits(
        minilm_limits["max_inputs"], minilm_limits["max_text_chars"], minilm_limits["max_request_chars"]
    )
    kinds = {kind.name: kind for kind in minilm_requests(minilm_limits, 1 << 20)}
    assert set(kinds) == {"chars", "padding", "rows", "plain", "body"}
    tokens = {}
    for name, kind in kinds.items():
        body = kind.make(3)
        parsed = parse_embedding(
            json.loads(body) if kind.content_type == "application/json" else body,
            kind.content_type,
            VectorSpace(384),
            limits,
        )
        counts = [len(e.ids) for e in tokenizer.encode_batch(parsed.texts)]
        tokens[name] = (sum(counts), len(counts), sum(len(t) for t in parsed.texts))
        assert kind.make(3) == body and kind.make(4) != body  # reproducible, and distinct per repetition
    max_tokens, max_chars = minilm_limits["max_request_tokens"], minilm_limits["max_request_chars"]
    assert tokens["chars"] == (max_tokens, max_tokens // 256, max_chars)
    assert tokens["padding"][0] == max_tokens and tokens["padding"][1] == max_tokens // 129 + 1
    assert tokens["rows"][:2] == (max_tokens, minilm_limits["max_inputs"])
    assert tokens["plain"][2] == minilm_limits["max_text_chars"]
    assert [len(kinds["body"].make(n)) for n in range(3)] == [(1 << 20) - 64] * 3  # just under max_request_size


def test_classifier_max_requests_carry_max_rows(model_store):
    limits = archive_config(model_store, "classifier")[1]
    rows, body = classifier_requests(limits, 1 << 20)
    assert [len(body.make(n)) for n in range(5)] == [(1 << 20) - 64] * 5  # whatever the numbers' lengths
    for kind in (rows, body):
        assert len(json.loads(kind.make(0))["inputs"]) == limits["max_rows_per_request"]
        assert kind.problem(json.dumps([{"label": 0}] * limits["max_rows_per_request"]).encode()) is None
        assert kind.problem(json.dumps([{"label": 0}]).encode()) is not None
