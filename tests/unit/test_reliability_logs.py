"""The "logs" reliability check's decisions (scripts/reliability/logs.py), fed fabricated log folders and outcomes.

Each rule must be able to fail: a measurement made from logs written the way TorchServe's built-in configuration
writes them, or with a traceback per bad request, or a start-up log that keeps growing, must not pass."""

import dataclasses
import gzip

import pytest

from scripts.reliability import logs

STAMP = "2026-12-01T05:34:56,{ms:03d}"


def event(ms, logger, message, thread="W-9000-classifier_1.0"):
    return f"{STAMP.format(ms=ms)} [INFO ] {thread} {logger} - {message}\n"


def access(ms, port):
    return f'{STAMP.format(ms=ms)} - /127.0.0.1:{port} "POST /predictions/classifier HTTP/1.1" 200 3\n'


def write_phase(log_dir, files):
    """Append text to log files and return (before, after, new lines) as logs_check would see them."""
    before = logs.snapshot(log_dir)
    for name, text in files.items():
        with open(log_dir / name, "a") as file:
            file.write(text)
    return before, logs.snapshot(log_dir), logs.new_lines(log_dir, before)


@pytest.fixture
def log_dir(tmp_path):
    (tmp_path / "ts_log.log").write_text(event(1, "org.pytorch.serve.ModelServer", "Inference API bind to: x", "main"))
    (tmp_path / "torchserve-start.log").write_text("Model server started.\n")
    (tmp_path / "model_log.log").write_text("")
    (tmp_path / "access_log.log").write_text("")
    return tmp_path


def phase(log_dir, name, files, requests, wrong=0):
    before, after, lines = write_phase(log_dir, files)
    return logs.measure(name, before, after, lines, requests, wrong)


def good_phase(log_dir, requests=100):
    return phase(log_dir, "good", {"access_log.log": "".join(access(i, 40000 + i) for i in range(requests))}, requests)


def bad_phase(log_dir, requests=100, model_lines=None):
    model_lines = (
        model_lines
        if model_lines is not None
        else "".join(
            event(
                i, "MODEL_LOG", "Failed json decoding of input data (JSONDecodeError: x); answered 4xx", "W-9000-stdout"
            )
            for i in range(requests)
        )
    )
    return phase(
        log_dir,
        "bad",
        {"access_log.log": "".join(access(i, 50000 + i) for i in range(requests)), "model_log.log": model_lines},
        requests,
    )


def test_bounded_logs_pass(log_dir):
    good, bad = good_phase(log_dir), bad_phase(log_dir)
    assert logs.judge(good, bad, 2000) == []
    assert good.lines == 100 and bad.lines == 200 and 60 < good.bytes_per_request < 120
    assert set(bad.bytes_by_file) == {"access_log.log", "model_log.log"}


def test_torchserve_default_config_fails(log_dir):
    """Every frontend event twice in ts_log, copies of worker and access lines in it, and all of it on stdout."""
    text = ""
    for i in range(100):
        for logger, message in (
            ("org.pytorch.serve.wlm.WorkerThread", f"Looping backend response at: {i}"),
            ("org.pytorch.serve.wlm.BatchAggregator", f"Sending response for jobId {i}"),
        ):
            text += event(i, logger, message) * 2
        text += event(i, "MODEL_LOG", "Backend received inference at: 1") + event(i, "ACCESS_LOG", f"/x:{i} 200")
    good = phase(
        log_dir,
        "good",
        {
            "ts_log.log": text,
            "torchserve-start.log": text,
            "access_log.log": "".join(access(i, 40000 + i) for i in range(100)),
        },
        100,
    )
    reasons = " | ".join(logs.judge(good, bad_phase(log_dir), 200_000))
    assert good.repeated_ts_events == 200 and good.copied_ts_events == 200
    for expected in (
        "event(s) twice",
        "copies of other logs' lines",
        "grew by",
        "log bytes/request >",
        "more than start-up output",
    ):
        assert expected in reasons


def test_a_traceback_per_bad_request_fails(log_dir):
    traceback = "".join(
        event(i, "MODEL_LOG", "Failed json decoding of input data. Forwarding encoded payload", "W-9000-stdout")
        + event(i, "MODEL_LOG", "Traceback (most recent call last):", "W-9000-stdout")
        + event(i, "MODEL_LOG", '  File "json/decoder.py", line 355, in raw_decode', "W-9000-stdout")
        + event(i, "MODEL_LOG", "json.decoder.JSONDecodeError: Expecting value", "W-9000-stdout")
        for i in range(100)
    )
    bad = bad_phase(log_dir, model_lines=traceback)
    reasons = logs.judge(good_phase(log_dir), bad, 2000)
    assert bad.tracebacks == 100
    assert any("traceback(s) written" in r for r in reasons)
    assert any("more log lines than a good one" in r for r in reasons)


def test_two_lines_per_bad_request_fail_even_without_traceback(log_dir):
    two = "".join(event(i, "MODEL_LOG", "bad body", "W-9000-stdout") * 2 for i in range(100))
    assert any("more log lines" in r for r in logs.judge(good_phase(log_dir), bad_phase(log_dir, model_lines=two), 0))


def test_start_log_growing_while_serving_fails(log_dir):
    good = good_phase(log_dir)
    bad = phase(
        log_dir,
        "bad",
        {
            "torchserve-start.log": "2026-... [ERROR] worker died\n",
            "access_log.log": "".join(access(i, 50000 + i) for i in range(100)),
        },
        100,
    )
    assert bad.start_log_growth > 0
    assert any("torchserve-start.log grew" in r for r in logs.judge(good, bad, 2000))


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"requests": 0}, "no requests were sent"),
        ({"wrong_answers": 3}, "not answered 200 with the reference answer"),
        ({"bytes_by_file": {"access_log.log": 10_000_000}}, "log bytes/request >"),
    ],
)
def test_each_rule_fails_alone(log_dir, change, reason):
    good, bad = good_phase(log_dir), bad_phase(log_dir)
    assert logs.judge(good, bad, 2000) == []
    reasons = logs.judge(dataclasses.replace(good, **change), bad, 2000)
    assert len(reasons) >= 1 and any(reason in r for r in reasons), reasons


def test_a_bad_phase_answered_with_5xx_fails(log_dir):
    bad = dataclasses.replace(bad_phase(log_dir), wrong_answers=100)
    assert any("not answered a 4xx" in r for r in logs.judge(good_phase(log_dir), bad, 2000))


def test_a_rolled_file_is_read_from_its_start_and_gz_bytes_count(log_dir):
    before = logs.snapshot(log_dir)
    # As log4j rolls: rename the full file, start a new one (longer than the old: only the inode tells), gzip the old.
    (log_dir / "ts_log.log").rename(log_dir / "ts_log.1.log")
    (log_dir / "ts_log.log").write_text(event(2, "org.pytorch.serve.wlm.WorkerThread", "Connecting to: x" * 10))
    with gzip.open(log_dir / "ts_log.1.log.gz", "wt") as rolled:
        rolled.write((log_dir / "ts_log.1.log").read_text())
    (log_dir / "ts_log.1.log").unlink()
    lines = logs.new_lines(log_dir, before)
    assert lines["ts_log.log"] == [event(2, "org.pytorch.serve.wlm.WorkerThread", "Connecting to: x" * 10).rstrip("\n")]
    assert "ts_log.1.log.gz" in logs.snapshot(log_dir)


def test_bad_bodies_send_large_cases_once_and_cycle_the_rest():
    bodies = logs.bad_bodies("classifier", 200)
    assert len(bodies) == 200
    large = [body for body, _ in bodies if len(body) > logs.LARGE_BODY_BYTES]
    assert len(large) == len(set(large))
    assert len({body for body, _ in bodies}) > 20, "the corpus' small cases are cycled"
