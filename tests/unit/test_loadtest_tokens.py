"""The load tools' inference token: where it comes from (loadtests/auth.py) and that Locust sends it.

A tiny in-process HTTP server stands in for TorchServe with token authorization: it answers a classifier-shaped 200
to `Authorization: Bearer good-key` and TorchServe 0.12's own 400 otherwise. Against the real production profile:
tests/integration/test_loadtest_tokens.py.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadtests import auth
from loadtests import run as loadtest
from loadtests.payloads import CLASSIFIER_CLASSES

KEY = "good-key"
REFUSAL = b'{"code": 400, "type": "InvalidKeyException", "message": "Token Authorization failed. Token either ' \
          b'incorrect, expired, or not provided correctly"}'


class TokenServer(BaseHTTPRequestHandler):
    seen = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        authorization = self.headers.get("Authorization")
        TokenServer.seen.append(authorization)
        if authorization == f"Bearer {KEY}":
            status, body = 200, json.dumps({"label": 0, "probabilities": [1.0 / CLASSIFIER_CLASSES] *
                                            CLASSIFIER_CLASSES}).encode()
        else:
            status, body = 400, REFUSAL
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def token_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), TokenServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    TokenServer.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def key_file(tmp_path, content):
    path = tmp_path / "key_file.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_token_order_is_flag_then_key_file(tmp_path, monkeypatch):
    keys = key_file(tmp_path, {"management": {"key": "m"}, "inference": {"key": "i"}, "API": {"key": "a"}})
    assert auth.resolve("explicit", keys) == ("explicit", "--token/$TS_INFERENCE_TOKEN")
    assert auth.resolve(None, keys) == ("i", f"key file {keys}")
    monkeypatch.setattr("scripts.modelctl.DEFAULT_KEY_FILE", keys)  # the default path, as `make serve` writes it
    assert auth.resolve(None, None)[0] == "i"
    monkeypatch.setattr("scripts.modelctl.DEFAULT_KEY_FILE", tmp_path / "absent.json")
    assert auth.resolve(None, None)[0] is None  # a development server needs none


@pytest.mark.parametrize("content, expected", [
    (None, "not found"),
    ("not json", "not JSON"),
    ({"management": {"key": "m"}}, "no inference key"),
])
def test_a_named_key_file_that_gives_no_token_is_an_error(tmp_path, content, expected):
    path = tmp_path / "absent.json" if content is None else key_file(tmp_path, content)
    with pytest.raises(auth.TokenError, match=expected):
        auth.resolve(None, path)


def test_the_token_flag_defaults_to_the_environment(monkeypatch):
    import argparse

    monkeypatch.setenv(auth.TOKEN_ENV, "from-env")
    parser = argparse.ArgumentParser()
    auth.add_arguments(parser)
    assert parser.parse_args([]).token == "from-env"
    assert parser.parse_args(["--token", "flag"]).token == "flag"


def test_refusal_is_recognised_by_torchserves_message_not_by_a_handler_400():
    assert auth.refused(400, REFUSAL.decode())
    assert not auth.refused(400, '{"message": "\'text\' is longer than the limit of 256 tokens"}')
    assert not auth.refused(200, REFUSAL.decode())


def test_preflight_stops_at_once_with_a_hint_when_the_token_is_refused(token_server):
    with pytest.raises(RuntimeError, match="wants an inference token"):
        loadtest.preflight(token_server, "classifier", timeout=60)
    loadtest.preflight(token_server, "classifier", token=KEY)
    assert TokenServer.seen == [None, f"Bearer {KEY}"]


@pytest.mark.parametrize("token", [KEY, None])
def test_locust_sends_the_token_on_every_request(token_server, tmp_path, monkeypatch, token):
    monkeypatch.setenv(auth.TOKEN_ENV, "stale")  # the caller's environment must not leak into Locust
    settings = loadtest.settings_for("classifier", "smoke", users=1, duration=2)
    summary = loadtest.run(settings, token_server, report_dir=tmp_path / "report", log=lambda *_: None, token=token)

    assert summary["requests"] > 0 and TokenServer.seen
    if token:
        assert summary["failures"] == 0 and set(TokenServer.seen) == {f"Bearer {KEY}"}
    else:
        assert summary["failures"] == summary["requests"] and set(TokenServer.seen) == {None}
        assert all("Token Authorization failed" in row["error"] for row in summary["failure_reasons"])
    assert KEY not in (tmp_path / "report" / "summary.json").read_text()  # never written into a report
