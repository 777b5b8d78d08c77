"""The generator comparison's figures, targets and report (loadtests/generator_compare.py) and the constrained
requests' check (loadtests/generator_schema.py), on made-up samples: no server, no Locust."""

import json

import pytest

from loadtests import generator_compare as compare
from loadtests.generator_schema import REVIEW_SCHEMA, schema_error


def sample(started, total_s, tokens, stream=True, first=0.1, gaps=(), constrained=False, invalid=None, error=None):
    """One request's sample as loadtests/generator_user.py's Generation.sample writes it."""
    return {
        "started": started,
        "ended": started + total_s,
        "stream": stream,
        "max_new_tokens": 256,
        "tokens": tokens,
        "first_token_s": first if stream else None,
        "gaps_s": list(gaps),
        "total_s": total_s,
        "error": error,
        "constrained": constrained,
        "schema_error": invalid,
    }


def test_constrained_requests_are_counted_valid_of_total_and_priced_per_token_apart():
    samples = [
        sample(0.0, 1.0, 10),  # the first wave, finished before the settle time ends: left out
        sample(20.0, 2.0, 20),  # 0.1 s per token
        sample(21.0, 4.0, 20),  # 0.2
        sample(22.0, 3.0, 10, constrained=True),  # 0.3
        sample(23.0, 3.0, 10, constrained=True, invalid="JSONDecodeError: Expecting value"),  # 0.3, invalid
        sample(24.0, 1.0, None, error="HTTP 500"),  # failed: neither valid nor invalid
    ]
    got = compare.figures(samples, seconds=40, settle=10)
    assert got["requests"] == 5 and got["failed"] == 1
    assert (got["constrained"], got["schema_valid"], got["schema_valid_share"]) == (2, 1, 0.5)
    assert got["schema_errors"] == ["JSONDecodeError: Expecting value"]
    assert got["constrained_per_token_p50_s"] == pytest.approx(0.3)
    assert got["unconstrained_per_token_p50_s"] == pytest.approx(0.1)  # nearest-rank p50 of (0.1, 0.2)
    assert got["tokens_per_s"] == pytest.approx(60 / 30)


def test_a_run_without_constrained_requests_has_no_validity_figure():
    got = compare.figures([sample(0.0, 1.0, 10), sample(20.0, 2.0, 20)], seconds=40, settle=10)
    assert (
        got["requests"] == 1
        and got["constrained"] == 0
        and got["schema_valid_share"] is None
        and got["constrained_per_token_p50_s"] is None
    )


def results(ours_tokens=130.0, peer_tokens=100.0, ours_gap=0.2, peer_gap=0.25, first_1=0.1, first_16=0.3):
    ours_16 = {
        "tokens_per_s": ours_tokens,
        "inter_token_p99_s": ours_gap,
        "first_token_p99_s": first_16,
        "schema_valid_share": 1.0,
        "constrained_per_token_p50_s": 0.11,
        "unconstrained_per_token_p50_s": 0.1,
    }
    return {
        "per-step": {1: {"first_token_p99_s": first_1}, 16: ours_16},
        "transformers-serve": {16: {"tokens_per_s": peer_tokens, "inter_token_p99_s": peer_gap}},
    }


def test_the_targets_are_issue_35s_against_transformers_serve_and_our_own_one_user_figure():
    checks = {check["target"]: check for check in compare.target_checks(results())}
    assert [check["met"] for check in checks.values()] == [True] * 5
    throughput = checks["output tokens/s at 16 users >= 1.3x transformers serve's"]
    assert (throughput["ratio"], throughput["needed"]) == (1.3, ">= 1.3")
    assert checks["first-token p99 at 16 users <= 3x at 1 user"]["ratio"] == 3.0
    assert checks["constrained answers valid at 16 users: all"]["ratio"] == 1.0  # no base: the value itself
    assert checks["per-token cost at 16 users, constrained <= 1.2x unconstrained"]["ratio"] == 1.1


def test_targets_missed_or_not_measured_are_recorded_as_such():
    missed = results(ours_tokens=120.0, ours_gap=0.3, first_16=0.31)
    met = [check["met"] for check in compare.target_checks(missed)]
    assert met[:3] == [False, False, False]
    alone = {"per-step": results()["per-step"]}  # transformers serve could not run
    checks = compare.target_checks(alone)
    assert checks[0] == {"target": compare.TARGETS[0].what, "met": None, "why": "not measured"}
    assert checks[2]["met"] is True


def test_a_report_read_back_from_json_is_checked_the_same():
    read_back = json.loads(json.dumps(results()))  # user counts become strings
    assert compare.target_checks(read_back) == compare.target_checks(results())


def test_the_report_says_which_system_ran_the_unconstrained_mix():
    measured = [sample(0.0, 1.0, 10), sample(20.0, 2.0, 20), sample(21.0, 3.0, 10, constrained=True)]
    figures = compare.figures(measured, 40, 10)
    report = {
        "machine": "test",
        "cpu_tag": "AVX2 EPYC",
        "date": "2026-12-03 12:00",
        "schema_share": 0.2,
        "results": {
            "per-step": {16: {"schema_share": 0.2, **figures}},
            "transformers-serve": {16: {"schema_share": 0.0, **figures}},
        },
        "targets": compare.target_checks({}),
    }
    text = compare.markdown(report)
    assert "| 1 / 1 |" in text  # per-step's constrained answers: valid / total
    assert "transformers-serve ran the unconstrained mix" in text and "per-step ran" not in text


def test_schema_share_outside_0_to_1_is_refused(capsys):
    with pytest.raises(SystemExit) as stopped:
        compare.main(["--schema-share", "1.5"])
    assert stopped.value.code == 2 and "--schema-share must be between 0 and 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"city": "Oslo", "rating": 4, "open": true}', None),
        ('{"city": "Oslo", "rating": 4, "open": tr', "JSONDecodeError"),  # cut short by max_tokens
        ('{"city": "Oslo", "rating": 9, "open": true}', "ValidationError: 9 is greater than the maximum of 5"),
        ('{"city": "Oslo", "rating": 4}', "'open' is a required property"),
    ],
)
def test_a_constrained_answer_is_valid_only_if_it_parses_and_meets_the_schema(text, problem):
    error = schema_error(text, REVIEW_SCHEMA)
    assert error is None if problem is None else problem in error
