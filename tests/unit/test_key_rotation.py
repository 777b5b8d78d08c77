"""Key rotation without TorchServe: the clients' KeySource (scripts/ops/auth.py) and the rotator
(scripts/ops/key_rotation.py, `modelctl rotate-keys`), against a stand-in that behaves as TorchServe 0.12 was seen to:
GET /token?type=... with the API key switches that key at once (the old one is refused from then on, no grace), then
rewrites key_file.json in place with the new key and an expiration time. The real server: tests/integration/
test_key_rotation.py.
"""

import datetime
import json
import threading
import time

import pytest

from loadtests import run as loadtest
from loadtests.payloads import CLASSIFIER_CLASSES
from scripts import modelctl
from scripts.ops import auth, key_rotation
from scripts.ops.management import EXIT_USAGE, ManagementClient, ManagementError
from tests.stub_http import stub_http_server

REFUSAL = (
    400,
    b'{"code": 400, "type": "InvalidKeyException", "message": "Token Authorization failed. Token either '
    b'incorrect, expired, or not provided correctly"}',
)
LIFETIME_S = 60.0


class StubServer:
    """TorchServe's keys, its key file, and the rotation it does on /token."""

    def __init__(self, key_file):
        self.key_file = key_file
        self.keys = {"inference": "inference-key-0", "management": "management-key-0", "API": "api"}
        self.rotations = 0
        self.seen = []  # the Authorization header of every inference request
        self.lock = threading.Lock()
        self.write()

    def write(self):
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=LIFETIME_S)
        stamp = expires.isoformat().replace("+00:00", "Z")
        body = {kind: {"key": self.keys[kind], "expiration time": stamp} for kind in ("management", "inference")}
        self.key_file.write_text(json.dumps({**body, "API": {"key": self.keys["API"]}}))

    def rotate(self, kind, file_delay=0.0):
        with self.lock:
            self.rotations += 1
            self.keys[kind] = f"{kind}-key-{self.rotations}"
        time.sleep(file_delay)  # the key is switched before the file is rewritten
        self.write()

    def answer(self, method, path, headers):
        authorization = headers.get("Authorization")
        if path == "/token":
            return (200, b"\n") if authorization == f"Bearer {self.keys['API']}" else REFUSAL
        if path.startswith("/predictions/"):
            self.seen.append(authorization)
            if authorization != f"Bearer {self.keys['inference']}":
                return REFUSAL
            return 200, {"label": 0, "probabilities": [1.0 / CLASSIFIER_CLASSES] * CLASSIFIER_CLASSES}
        if authorization != f"Bearer {self.keys['management']}":
            return REFUSAL
        return 200, {"models": [{"modelName": "classifier", "modelUrl": "classifier.mar"}]}


@pytest.fixture
def stub(tmp_path):
    server = StubServer(tmp_path / "key_file.json")
    with stub_http_server(server.answer) as url:
        server.url = url
        yield server


def test_a_key_source_follows_the_file_and_keeps_the_last_key_while_it_is_rewritten(stub):
    keys = auth.KeySource("inference", stub.key_file)
    assert keys.key() == "inference-key-0" and keys.headers() == {"Authorization": "Bearer inference-key-0"}
    stub.rotate("inference")
    assert keys.key() == "inference-key-1"  # re-read because the file changed, before any refusal
    stub.key_file.write_text("")  # TorchServe truncates, then writes
    assert keys.key() == "inference-key-1"
    stub.key_file.write_text('{"management": {"key": "management-key-0"}, "infer')
    assert keys.key() == "inference-key-1"
    stub.rotate("inference")
    assert keys.key() == "inference-key-2"


def test_renew_waits_for_the_file_the_server_rewrites_just_after_switching_the_key(stub):
    keys = auth.KeySource("inference", stub.key_file)
    sent = keys.key()
    rotation = threading.Thread(target=stub.rotate, args=("inference", 0.2))
    rotation.start()
    assert keys.renew(sent) and keys.key() == "inference-key-1"
    rotation.join()
    # Nothing newer in the file (an expired key nobody rotated): no renewal, after the settle time.
    started = time.monotonic()
    assert not keys.renew("inference-key-1")
    assert time.monotonic() - started >= keys.settle_s
    assert not auth.KeySource("inference", token="given").renew("given")  # a fixed token is never renewed


def test_a_refused_request_is_sent_once_more_with_the_new_key(stub):
    import requests

    keys = auth.KeySource("inference", stub.key_file)
    url = f"{stub.url}/predictions/classifier"
    keys.key()
    stub.keys["inference"] = "switched"  # the server switched; the file is rewritten 0.1 s later
    threading.Timer(0.1, stub.write).start()
    answer = auth.send_renewing(lambda headers: requests.post(url, json={}, headers=headers, timeout=10), keys)
    assert answer.status_code == 200
    assert stub.seen == ["Bearer inference-key-0", "Bearer switched"]

    stub.seen.clear()
    stub.keys["inference"] = "never-written"  # refused, and the file has nothing newer: one request only
    answer = auth.send_renewing(lambda headers: requests.post(url, json={}, headers=headers, timeout=10), keys)
    assert auth.refused(answer.status_code, answer.text) and stub.seen == ["Bearer switched"]


def test_the_management_client_renews_its_key_and_explains_an_expired_one(stub):
    client = ManagementClient.with_key_file(stub.url, None, stub.key_file, timeout=5)
    assert client.list_models()[0]["modelName"] == "classifier"
    stub.rotate("management")
    assert client.list_models()[0]["modelName"] == "classifier"
    stub.keys["management"] = "not-in-the-file"
    with pytest.raises(ManagementError) as refusal:
        client.list_models()
    assert refusal.value.exit_code == 6
    assert "nobody rotated it" in str(refusal.value) and str(stub.key_file) in str(refusal.value)


def test_rotate_keys_rotates_with_the_api_key_and_reports_the_new_expiry(stub, capsys):
    code = modelctl.main(["--management-url", stub.url, "--key-file", str(stub.key_file), "--json", "rotate-keys"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["rotated"] == ["inference", "management"]
    assert LIFETIME_S - 5 < result["lifetime_s"] <= LIFETIME_S
    stub.keys["API"] = "another-server"
    code = modelctl.main(["--management-url", stub.url, "--key-file", str(stub.key_file), "rotate-keys"])
    assert code == 6 and "API key" in capsys.readouterr().err


def test_keep_fresh_rotates_at_half_the_lifetime_and_retries_a_failed_rotation(stub):
    client = key_rotation.rotation_client(stub.url, stub.key_file, timeout=5)
    waits, lines = [], []
    key_rotation.keep_fresh(client, stub.key_file, ("inference",), log=lines.append, sleep=waits.append, rounds=2)
    assert len(waits) == 1 and LIFETIME_S / 2 - 5 < waits[0] <= LIFETIME_S / 2
    assert all("rotated inference" in line for line in lines) and len(lines) == 2

    stub.keys["API"] = "restarted"  # a restarted server has a new API key: rewritten to the file after the failure
    waits, lines = [], []

    def sleep(seconds):
        waits.append(seconds)
        stub.write()

    key_rotation.keep_fresh(client, stub.key_file, ("inference",), retry_s=3, log=lines.append, sleep=sleep, rounds=2)
    assert waits == [3] and "rotation failed" in lines[0] and "rotated inference" in lines[1]


def test_keep_fresh_refuses_a_period_the_keys_do_not_outlive(stub):
    client = key_rotation.rotation_client(stub.url, stub.key_file, timeout=5)
    with pytest.raises(ManagementError) as error:
        key_rotation.keep_fresh(client, stub.key_file, every=LIFETIME_S, sleep=lambda _: None, rounds=1)
    assert error.value.exit_code == EXIT_USAGE and "lifetime" in str(error.value)
    args = ["--management-url", stub.url, "--key-file", str(stub.key_file), "keep-keys-fresh", "--every", "0"]
    assert modelctl.main(args) == EXIT_USAGE


def test_a_load_test_given_the_key_file_goes_through_rotations(tmp_path):
    stub = StubServer(tmp_path / "key_file.json")
    rotating, stop = [], threading.Event()

    def rotate_every(seconds):
        while not stop.wait(seconds):
            stub.rotate("inference", file_delay=0.01)
            rotating.append(stub.keys["inference"])

    with stub_http_server(stub.answer) as url:
        keys = auth.KeySource.for_inference(None, stub.key_file)
        rotator = threading.Thread(target=rotate_every, args=(1.0,))
        rotator.start()
        try:
            settings = loadtest.settings_for("classifier", "smoke", users=2, duration=4)
            summary = loadtest.run(settings, url, report_dir=tmp_path / "report", log=lambda *_: None, token=keys)
        finally:
            stop.set()
            rotator.join()

    reasons = {row["error"] for row in summary.get("failure_reasons") or []}
    assert len(rotating) >= 3 and len(set(stub.seen)) >= 3  # Locust sent the keys the rotations gave it
    assert summary["requests"] > summary["failures"]
    # Only requests already on their way when the key switched were refused, and each was sent again with the new key
    # (loadtests/locustfile.py's messages; importing it here would patch this process for gevent).
    assert all("the key was rotated as this was sent" in reason for reason in reasons), reasons
    assert (
        str(stub.key_file) in summary["token"]
        and "inference-key-" not in (tmp_path / "report" / "summary.json").read_text()
    )
