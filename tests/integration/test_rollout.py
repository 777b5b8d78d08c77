"""Versioned rollout under traffic: `modelctl rollout` replaces classifier 1.0 with a retrained 2.0 while threads keep
calling /predictions/classifier. No request may fail, every answer is 1.0's or 2.0's for that input, and afterwards
the default route answers as 2.0. A rollout whose new version cannot load leaves the old one serving.

Its own server (the classifier only), so the switch does not disturb the session server's other tests.
"""

import json
import random
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
import requests

from scripts import package

REPO = Path(__file__).resolve().parents[2]
TRAFFIC_THREADS = 3
# Rows computed in different batch compositions differ in the last float bits; two models differ far more.
SAME, DIFFERENT = 1e-5, 1e-2


@pytest.fixture(scope="module")
def versions_built(model_store):
    """classifier-2.0.mar: the same spec trained with another seed (what a retrained model is)."""
    entry = package.build("classifier", model_store, version="2.0", variables={"seed": "1"}, log=lambda *_: None)
    return entry["archive"]


@pytest.fixture(scope="module")
def server(start_ts_server, versions_built):
    return start_ts_server(models=["classifier"], name="rollout")


def rows(count, seed=7):
    generator = random.Random(seed)
    return [[generator.gauss(0.0, 1.0) for _ in range(128)] for _ in range(count)]


def modelctl(server, *args, timeout=600):
    command = [
        sys.executable,
        "-m",
        "scripts.modelctl",
        "--management-url",
        server.management_url,
        "--key-file",
        str(server.key_file),
        *args,
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def predict(session, server, body, version=None):
    route = "/predictions/classifier" + (f"/{version}" if version else "")
    return session.post(f"{server.inference_url}{route}", json=body, timeout=60)


def distance(answer, other):
    """Largest difference between two answers' class probabilities (inf if either is not an answer)."""
    if not (isinstance(answer, dict) and isinstance(other, dict)):
        return float("inf")
    return max(abs(a - b) for a, b in zip(answer["probabilities"], other["probabilities"], strict=True))


def registered_versions(server):
    return sorted(v["modelVersion"] for v in server.management(timeout=10).versions("classifier"))


class Traffic:
    """Threads that call the default route with fixed inputs until stopped, recording every outcome."""

    def __init__(self, server, inputs):
        self.server, self.inputs = server, inputs
        self.outcomes = []  # (finished_at, input index, status or exception text, answer)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(n,)) for n in range(TRAFFIC_THREADS)]

    def run(self, offset):
        session = requests.Session()
        index = offset
        while not self.stop.is_set():
            index = (index + 1) % len(self.inputs)
            try:
                response = predict(session, self.server, {"inputs": self.inputs[index]})
                answer = response.json() if response.status_code == 200 else response.text
                self.outcomes.append((time.monotonic(), index, response.status_code, answer))
            except Exception as error:  # a refused connection or a timeout is a failed request too
                self.outcomes.append((time.monotonic(), index, repr(error), None))
            time.sleep(0.005)  # continuous, but leaves the 2 CI cores to the server

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)


def test_rollout_under_traffic_has_no_failed_requests(server, versions_built):
    session = requests.Session()
    inputs = rows(8)
    assert registered_versions(server) == ["1.0"]
    before = [predict(session, server, {"inputs": row}, "1.0").json() for row in inputs]

    with Traffic(server, inputs) as traffic:
        while len(traffic.outcomes) < 20:  # traffic is flowing before the rollout starts
            time.sleep(0.05)
        started = time.monotonic()
        result = modelctl(server, "--json", "rollout", versions_built)
        finished = time.monotonic()
        while sum(1 for o in traffic.outcomes if o[0] > finished) < 20:  # and keeps flowing after it
            time.sleep(0.05)

    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["version"] == "2.0" and summary["previous_default"] == "1.0" and summary["unregistered"] == ["1.0"]

    failures = [o for o in traffic.outcomes if o[2] != 200]
    assert not failures, f"{len(failures)} of {len(traffic.outcomes)} requests failed, e.g. {failures[:3]}"
    assert sum(1 for o in traffic.outcomes if started < o[0] < finished) > 0, "no traffic during the rollout"

    after = [predict(session, server, {"inputs": row}, "2.0").json() for row in inputs]
    default_route = [predict(session, server, {"inputs": row}).json() for row in inputs]
    assert all(distance(default, new) < SAME for default, new in zip(default_route, after, strict=True))
    assert all(distance(old, new) > DIFFERENT for old, new in zip(before, after, strict=True)), "2.0 answers as 1.0 did"
    served_by = [
        min(("1.0", distance(answer, before[index])), ("2.0", distance(answer, after[index])), key=lambda pair: pair[1])
        for _, index, _, answer in traffic.outcomes
    ]
    assert all(gap < SAME for _, gap in served_by), "an answer that is neither 1.0's nor 2.0's"
    assert {version for version, _ in served_by} == {"1.0", "2.0"}, "traffic did not see the switch"
    assert all(
        version == "2.0"
        for (when, *_), (version, _) in zip(traffic.outcomes, served_by, strict=True)
        if when > finished
    )
    assert registered_versions(server) == ["2.0"]
    assert predict(session, server, {"inputs": inputs[0]}, "1.0").status_code == 404


def broken_archive(source, target, version):
    """A copy of an archive under another version whose program file is garbage: its workers cannot load."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for item in original.infolist():
            data = original.read(item.filename)
            if item.filename == "MAR-INF/MANIFEST.json":
                manifest = json.loads(data)
                manifest["model"]["modelVersion"] = version
                data = json.dumps(manifest).encode()
            elif item.filename.endswith("model.pt2"):
                data = b"not an exported program"
            copy.writestr(item, data)


def test_failed_rollout_leaves_the_old_version_serving(server, model_store, versions_built):
    before = registered_versions(server)
    default = server.management(timeout=10).default_version("classifier")
    archive = model_store / "classifier-broken-for-test.mar"
    broken_archive(model_store / versions_built, archive, "9.9")
    try:
        result = modelctl(server, "rollout", archive.name, "--wait-timeout", "15")
    finally:
        archive.unlink()
    assert result.returncode == 1
    assert (
        "rollout of classifier 9.9 failed" in result.stderr and f"classifier {default} keeps serving" in result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1
    assert registered_versions(server) == before
    answer = predict(requests.Session(), server, {"inputs": rows(1)[0]})
    assert answer.status_code == 200


def test_rollout_of_a_registered_version_is_refused(server, versions_built):
    before = registered_versions(server)
    result = modelctl(server, "rollout", versions_built if "2.0" in before else "classifier.mar")
    assert result.returncode == 5
    assert "already registered" in result.stderr
    assert registered_versions(server) == before
