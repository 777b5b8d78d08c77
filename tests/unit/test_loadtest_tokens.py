"""The load tools' inference token: where it comes from (scripts/ops/auth.py) and that Locust sends it.

A tiny in-process HTTP server stands in for TorchServe with token authorization: it answers a classifier-shaped 200
to `Authorization: Bearer good-key` and TorchServe 0.12's own 400 otherwise. Against the real production profile:
tests/integration/test_loadtest_tokens.py.
"""

import json

import pytest

from loadtests import preflight
from loadtests import run as loadtest
from loadtests.payloads import CLASSIFIER_CLASSES
from scripts.ops import auth
from tests.stub_http import stub_http_server

KEY = "good-key"
REFUSAL = (
    b'{"code": 400, "type": "InvalidKeyException", "message": "Token Authorization failed. Token either '
    b'incorrect, expired, or not provided correctly"}'
)


SEEN = []  # the Authorization header of every request the stand-in received


@pytest.fixture
def token_server():
    """TorchServe with token authorization, as far as the load tools see it: a classifier answer for the key."""

    def answer(method, path, headers):
        authorization = headers.get("Authorization")
        SEEN.append(authorization)
        if authorization == f"Bearer {KEY}":
            return 200, {"label": 0, "probabilities": [1.0 / CLASSIFIER_CLASSES] * CLASSIFIER_CLASSES}
        return 400, REFUSAL

    SEEN.clear()
    with stub_http_server(answer) as url:
        yield url


def key_file(tmp_path, content):
    path = tmp_path / "key_file.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_token_order_is_flag_then_key_file(tmp_path, monkeypatch):
    keys = key_file(tmp_path, {"management": {"key": "m"}, "inference": {"key": "i"}, "API": {"key": "a"}})
    assert auth.resolve_inference_token("explicit", keys) == ("explicit", "--token/$TS_INFERENCE_TOKEN")
    assert auth.resolve_inference_token(None, keys) == ("i", f"key file {keys}")
    monkeypatch.setattr("scripts.ops.auth.DEFAULT_KEY_FILE", keys)  # the default path, as `make serve` writes it
    assert auth.resolve_inference_token(None, None)[0] == "i"
    monkeypatch.setattr("scripts.ops.auth.DEFAULT_KEY_FILE", tmp_path / "absent.json")
    assert auth.resolve_inference_token(None, None)[0] is None  # a development server needs none


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "not found"),
        ("not json", "not JSON"),
        ({"management": {"key": "m"}}, "no inference key"),
    ],
)
def test_a_named_key_file_that_gives_no_token_is_an_error(tmp_path, content, expected):
    path = tmp_path / "absent.json" if content is None else key_file(tmp_path, content)
    with pytest.raises(auth.KeyFileError, match=expected):
        auth.resolve_inference_token(None, path)


def test_the_token_flag_defaults_to_the_environment(monkeypatch):
    import argparse

    monkeypatch.setenv(auth.TOKEN_ENV, "from-env")
    parser = argparse.ArgumentParser()
    auth.add_token_arguments(parser)
    assert parser.parse_args([]).token == "from-env"
    assert parser.parse_args(["--token", "flag"]).token == "flag"


def test_refusal_is_recognised_by_torchserves_message_not_by_a_handler_400():
    assert auth.refused(400, REFUSAL.decode())
    assert not auth.refused(400, '{"message": "\'text\' is longer than the limit of 256 tokens"}')
    assert not auth.refused(200, REFUSAL.decode())


def test_preflight_stops_at_once_with_a_hint_when_the_token_is_refused(token_server):
    with pytest.raises(RuntimeError, match="wants an inference token"):
        preflight.wait_for_model(token_server, "classifier", timeout=60)
    preflight.wait_for_model(token_server, "classifier", token=KEY)
    assert SEEN == [None, f"Bearer {KEY}"]


@pytest.mark.parametrize("token", [KEY, None])
def test_locust_sends_the_token_on_every_request(token_server, tmp_path, monkeypatch, token):
    monkeypatch.setenv(auth.TOKEN_ENV, "stale")  # the caller's environment must not leak into Locust
    settings = loadtest.settings_for("classifier", "smoke", users=1, duration=2)
    summary = loadtest.run(settings, token_server, report_dir=tmp_path / "report", log=lambda *_: None, token=token)

    assert summary["requests"] > 0 and SEEN
    if token:
        assert summary["failures"] == 0 and set(SEEN) == {f"Bearer {KEY}"}
    else:
        assert summary["failures"] == summary["requests"] and set(SEEN) == {None}
        assert all("Token Authorization failed" in row["error"] for row in summary["failure_reasons"])
    assert KEY not in (tmp_path / "report" / "summary.json").read_text()  # never written into a report
