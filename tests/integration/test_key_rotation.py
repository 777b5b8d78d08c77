"""Keys that rotate without an outage, on a real production-profile TorchServe whose keys live one minute.

`modelctl keep-keys-fresh --type inference` rotates the inference key beside the server while two clients send
requests back to back for longer than the first keys' lifetime: the project's own (scripts/ops/auth.py KeySource with
send_renewing) and the Python snippet of docs/operations.md ("Key rotation"), run as its own process. The management
key, which that rotator leaves alone, shows that the expiry is real and was passed; the first inference key shows that
a rotation refuses the old key at once.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from scripts.ops.auth import KeySource, bearer, read_key_file, refused, send_renewing
from scripts.ops.key_rotation import expiry
from scripts.ops.management import EXIT_AUTH, ManagementClient, ManagementError

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "config" / "production.properties"
ROW = {"inputs": [0.01 * i for i in range(128)]}
# Sent back to back, with this pause: enough requests to meet each rotation, little of the machine's CPU.
PAUSE_S = 0.05
# The outsider snippet's loop: until the file $LOOP_STOP exists, then its counts as one JSON line.
SNIPPET_DRIVER = f"""
statuses, renewals = {{}}, 0
while not os.path.exists(os.environ["LOOP_STOP"]):
    before = token
    status = predict("classifier", {ROW!r}).status_code
    statuses[status] = statuses.get(status, 0) + 1
    renewals += token != before
    time.sleep({PAUSE_S!r})
print(json.dumps({{"statuses": statuses, "renewals": renewals}}))
"""


@pytest.fixture(scope="module")
def server(start_ts_server):
    # 1 minute: the shortest whole value (fractions work too), and longer than the server's start, during which the
    # first management key must stay valid for the start to see the model READY.
    return start_ts_server(
        config=PROFILE, overrides={"token_expiration_min": "1"}, models=["classifier"], name="key-rotation"
    )


def docs_snippet():
    """The Python client of docs/operations.md's "Key rotation" section."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text[text.index("## Key rotation") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def modelctl(server, *args):
    command = [sys.executable, "-m", "scripts.modelctl", "--management-url", server.management_url]
    return [*command, "--key-file", str(server.key_file), *args]


def own_client_loop(url, keys, past, give_up):
    """The project's client, back to back until the time `past` is past and it has used three keys (the first and two
    rotations), or `give_up`: every answer's status and each key it was sent with."""
    statuses, keys_used = Counter(), set()
    session = requests.Session()

    def send(headers):
        keys_used.add(headers.get("Authorization"))
        return session.post(url, json=ROW, headers=headers, timeout=30)

    while (time.time() < past or len(keys_used) < 3) and time.time() < give_up:
        statuses[send_renewing(send, keys).status_code] += 1
        time.sleep(PAUSE_S)
    return statuses, keys_used


def test_clients_get_200_through_rotations_and_past_the_expiry(server, tmp_path):
    first = read_key_file(server.key_file)
    first_expiry = expiry(first["management"]["expiration time"]).timestamp()
    assert expiry(first["inference"]["expiration time"]).timestamp() == pytest.approx(first_expiry, abs=1)
    url = f"{server.inference_url}/predictions/classifier"
    management_url = f"{server.management_url}/models"
    # Clients that keep the first keys and never read the file again: served now.
    assert requests.post(url, json=ROW, headers=bearer(first["inference"]["key"]), timeout=30).status_code == 200
    assert requests.get(management_url, headers=bearer(first["management"]["key"]), timeout=10).status_code == 200
    management = ManagementClient.with_key_file(server.management_url, None, server.key_file, timeout=10)

    rotator_log = tmp_path / "rotator.log"
    with open(rotator_log, "w") as log:
        rotator = subprocess.Popen(
            modelctl(server, "keep-keys-fresh", "--type", "inference"), cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
    env = {**os.environ, "TS_KEY_FILE": str(server.key_file), "TS_INFERENCE_URL": server.inference_url}
    outsider = subprocess.Popen(
        [sys.executable, "-c", docs_snippet() + SNIPPET_DRIVER],
        cwd=tmp_path,
        env={**env, "LOOP_STOP": str(tmp_path / "stop")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        keys = KeySource.for_inference(None, server.key_file)
        statuses, keys_used = own_client_loop(url, keys, past=first_expiry + 3, give_up=first_expiry + 60)
        (tmp_path / "stop").touch()
        outsider_out, outsider_err = outsider.communicate(timeout=60)
    finally:
        outsider.kill()
        rotator.send_signal(signal.SIGTERM)
        rotator_code = rotator.wait(timeout=30)
    rotations = rotator_log.read_text()

    assert rotator_code == 0, rotations
    assert rotations.count("rotated inference") >= 2, rotations
    # Every request of our client answered 200, none lost, with at least three keys (the first and two rotations).
    assert sum(statuses.values()) > 0 and set(statuses) == {200}, statuses
    assert len(keys_used) >= 3, keys_used
    # The docs' snippet (re-reads only after a refusal): every request 200, its key refused and renewed at rotations.
    assert outsider.returncode == 0, outsider_err
    outside = json.loads(outsider_out.strip().splitlines()[-1])
    assert set(outside["statuses"]) == {"200"} and outside["statuses"]["200"] > 0, outside
    assert outside["renewals"] >= 1, outside
    assert expiry(read_key_file(server.key_file)["inference"]["expiration time"]).timestamp() > first_expiry

    # A rotated key is refused at once; a key nobody rotated (the management key) is refused after its expiry.
    assert_refused(requests.post(url, json=ROW, headers=bearer(first["inference"]["key"]), timeout=30))
    assert time.time() > first_expiry
    assert_refused(requests.get(management_url, headers=bearer(first["management"]["key"]), timeout=10))

    # The project's management client: the file has no newer key, so it says the key expired and nobody rotated it;
    # after one rotation it renews the key itself.
    with pytest.raises(ManagementError) as refusal:
        management.list_models()
    assert refusal.value.exit_code == EXIT_AUTH and "nobody rotated it" in str(refusal.value)
    rotated = subprocess.run(
        modelctl(server, "--json", "rotate-keys", "--type", "management"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(rotated.stdout)["rotated"] == ["management"]
    assert [model["modelName"] for model in management.list_models()] == ["classifier"]


def assert_refused(response):
    assert refused(response.status_code, response.text), (response.status_code, response.text)
