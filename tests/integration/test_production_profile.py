"""The production profile (config/production.properties) on a real TorchServe: tokens on both APIs, registration only
from the model store (checked on the development profile too), and its limits (queue, request size, JVM heap) in
effect.

One server, started from the profile itself; the fixture swaps in free loopback ports (tests send traffic to loopback
only) and loads the classifier alone.
"""

import http.server
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest
import requests

from scripts.ops.auth import bearer
from scripts.ops.management import ManagementClient
from scripts.ops.server import read_properties

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "config" / "production.properties"
ROW = [0.01 * i for i in range(128)]


@pytest.fixture(scope="module")
def server(start_ts_server):
    return start_ts_server(config=PROFILE, models=["classifier"], name="production")


@pytest.fixture(scope="module")
def profile():
    return read_properties(PROFILE)


def assert_token_refused(response):
    # TorchServe 0.12 answers a missing or wrong token with 400 InvalidKeyException (not 401).
    assert response.status_code in (400, 401), response.text
    assert response.json()["type"] == "InvalidKeyException"


def test_profile_turns_token_authorization_on(profile, server):
    assert profile["disable_token_authorization"] == "false"
    keys = json.loads(server.key_file.read_text())
    assert (
        keys["management"]["key"] and keys["inference"]["key"] and keys["management"]["key"] != keys["inference"]["key"]
    )


def list_models_with(server, token):
    """GET /models sent with this token (None: without one); the raw answer."""
    return ManagementClient(server.management_url, token, timeout=10).request("GET", "/models")


def test_management_api_needs_the_management_token(server):
    tokens = server.tokens()
    assert_token_refused(list_models_with(server, None))
    assert_token_refused(list_models_with(server, "not-the-token"))
    assert_token_refused(list_models_with(server, tokens["inference"]))
    allowed = list_models_with(server, tokens["management"])
    assert allowed.status_code == 200
    assert [m["modelName"] for m in allowed.json()["models"]] == ["classifier"]


def test_inference_api_needs_the_inference_token(server):
    tokens = server.tokens()
    url = f"{server.inference_url}/predictions/classifier"
    assert_token_refused(requests.post(url, json={"inputs": ROW}, timeout=30))
    assert_token_refused(requests.post(url, json={"inputs": ROW}, headers=bearer(tokens["management"]), timeout=30))
    # Even the health check wants the token (which is why the Kubernetes profile turns tokens off; see README).
    assert_token_refused(requests.get(f"{server.inference_url}/ping", timeout=10))
    answer = requests.post(url, json={"inputs": ROW}, headers=bearer(tokens["inference"]), timeout=30)
    assert answer.status_code == 200
    assert len(answer.json()["probabilities"]) == 10


class CountingHandler(http.server.SimpleHTTPRequestHandler):
    requests_seen = 0

    def do_GET(self):
        type(self).requests_seen += 1
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture(params=["development", "production"])
def registering_server(request):
    """The session's server (config.properties, no tokens) and this module's production server: both register only
    archives in their own model store."""
    return request.getfixturevalue("ts_server" if request.param == "development" else "server")


def encoded_traversals(store, target):
    """file:// URLs that look like one file name in `store` but, decoded, climb out of it to `target`: '../' spelt
    with %2e and %2f in several case mixes (Java's file:// reader decodes them; the ".." TorchServe refuses is only
    the literal one)."""
    climb = len(Path(store).parts) - 1  # up to /
    rest = quote(str(target).lstrip("/"), safe="")  # its slashes as %2F: one path segment
    for step in ("%2e%2e%2f", "%2E%2e%2F", "%2e%2E/", ".%2e%2F", "%2e.%2f", "..%2f"):
        yield f"file://{store}/{step * climb}{rest}"


def test_registration_only_from_the_model_store(registering_server, tmp_path, model_store):
    server = registering_server
    client = server.management(timeout=300)
    store = model_store
    before = sorted(path.name for path in store.iterdir())
    # An archive outside the store, offered as file://, over HTTP and as an encoded ../ out of the store; and a store
    # archive's URL with the path in other letters (another folder on a case-sensitive disk): all refused, nothing
    # fetched, copied or registered.
    outside = tmp_path / "classifier-outside.mar"
    shutil.copy(store / "classifier.mar", outside)
    handler = type("Handler", (CountingHandler,), {"requests_seen": 0})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(tmp_path)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    urls = [
        outside.as_uri(),
        f"http://127.0.0.1:{httpd.server_address[1]}/{outside.name}",
        *encoded_traversals(store, outside),
        f"file://{str(store).upper()}/classifier.mar",
    ]
    try:
        for url in urls:
            response = client.request(
                "POST", "/models", timeout=60, params={"url": url, "model_name": "outside", "synchronous": "true"}
            )
            assert response.status_code == 404, f"{url}: {response.text}"
            # "Given URL ... does not match any allowed URL(s)", or for a literal '..' "Relative path is not allowed"
            assert url in response.json()["message"], response.text
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert handler.requests_seen == 0
    assert sorted(path.name for path in store.iterdir()) == before
    assert "outside" not in [model["modelName"] for model in client.list_models()]
    # An archive in the store, named as the store's files are: allowed.
    registered = client.register("classifier.mar", model_name="classifier_copy", initial_workers=1)
    assert "classifier_copy" in registered["status"]
    assert "unregistered" in client.unregister("classifier_copy", "1.0", drain=False)["status"]


def test_profile_limits_are_in_effect(server, profile):
    description = server.management().description("classifier")
    assert description["jobQueueStatus"]["remainingCapacity"] == int(profile["job_queue_size"])

    too_big = b"x" * (int(profile["max_request_size"]) + 1)
    response = requests.post(
        f"{server.inference_url}/predictions/classifier",
        data=too_big,
        timeout=30,
        headers={**server.headers("inference"), "Content-Type": "application/json"},
    )
    assert response.status_code == 413

    java = psutil.Process(server.pid()).cmdline()
    # As rendered: the profile's vmargs with the log4j2 configuration's path made absolute (scripts/ops/server.py).
    for option in server.props["vmargs"].split():
        assert option in java
    assert f"-Dlog4j.configurationFile={REPO / 'config' / 'log4j2.xml'}" in java and "-Xmx1g" in java

    metrics = requests.get(f"{server.metrics_url}/metrics", timeout=10)  # Prometheus scrapes without a token
    assert metrics.status_code == 200 and "# TYPE" in metrics.text


def modelctl(server, *args, key_file=None):
    command = [
        sys.executable,
        "-m",
        "scripts.modelctl",
        "--management-url",
        server.management_url,
        "--key-file",
        str(key_file or server.key_file),
        *args,
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_modelctl_uses_the_key_file(server, tmp_path):
    listed = modelctl(server, "--json", "list")
    assert listed.returncode == 0, listed.stderr
    assert [m["model"] for m in json.loads(listed.stdout)["models"]] == ["classifier"]

    described = modelctl(server, "describe", "classifier", "--customized")
    assert described.returncode == 0, described.stderr
    assert "READY" in described.stdout and "precision" in described.stdout


def test_modelctl_fails_clearly_without_or_with_a_wrong_token(server, tmp_path):
    missing = modelctl(server, "list", key_file=tmp_path / "key_file.json")
    assert missing.returncode == 6
    assert len(missing.stderr.strip().splitlines()) == 1
    assert "requires a token" in missing.stderr and "key_file.json" in missing.stderr

    wrong = tmp_path / "wrong_key_file.json"
    wrong.write_text(json.dumps({"management": {"key": "wrong"}, "inference": {"key": "wrong"}}))
    refused = modelctl(server, "list", key_file=wrong)
    assert refused.returncode == 6
    assert "was refused" in refused.stderr and str(wrong) in refused.stderr


def test_ready_probe_reads_the_key_file(server, tmp_path):
    probe = [sys.executable, "-m", "scripts.ready_probe", "--management-url", server.management_url]
    probe += ["--metrics-url", server.metrics_url]
    ready = subprocess.run(
        [*probe, "--key-file", str(server.key_file)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert (ready.returncode, ready.stdout.strip()) == (0, "ready")
    refused = subprocess.run(
        [*probe, "--key-file", str(tmp_path / "none.json")], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1 and "answered 400" in refused.stdout
