"""The load tools against the production profile (token authorization on): with the inference token every request
is served; without it every one is refused, and the CLI stops at its pre-flight request with a hint.

A private TorchServe from config/production.properties serving the classifier; its key_file.json is where
TorchServe writes it (the server's working directory), read as `make loadtest` reads .run/key_file.json.
"""

import json
import os
import subprocess
import sys

import pytest

from loadtests import capacity, preflight, run
from tests.conftest import REPO


@pytest.fixture(scope="module")
def production(start_ts_server):
    server = start_ts_server(
        config=REPO / "config" / "production.properties", models=["classifier"], name="production-loadtest"
    )
    assert server.key_file.is_file(), "the production profile must write key_file.json (token authorization on)"
    return server


def test_smoke_profile_with_the_token_has_no_failures_and_without_it_all_fail(production, tmp_path):
    token = production.tokens()["inference"]
    preflight.wait_for_model(production.inference_url, "classifier", token=token)
    settings = run.settings_for("classifier", "smoke", users=2, duration=4)

    served = run.run(settings, production.inference_url, report_dir=tmp_path / "with", log=lambda *_: None, token=token)
    assert served["requests"] > 0 and served["failures"] == 0, served.get("failure_reasons")
    assert served["token"] != "none" and token not in (tmp_path / "with" / "summary.json").read_text()

    refused = run.run(settings, production.inference_url, report_dir=tmp_path / "without", log=lambda *_: None)
    assert refused["requests"] > 0 and refused["failures"] == refused["requests"]
    reasons = " ".join(row["error"] for row in refused["failure_reasons"])
    assert "HTTP 400" in reasons and "Token Authorization failed" in reasons


def test_cli_reads_the_key_file_and_refuses_clearly_without_a_token(production, tmp_path):
    base = [
        sys.executable,
        "-m",
        "loadtests.run",
        "--model",
        "classifier",
        "--profile",
        "open",
        "--rate",
        "10",
        "--duration",
        "3",
        "--host",
        production.inference_url,
        "--json",
    ]
    env_without_token = {
        key: value for key, value in os.environ.items() if key not in ("TS_INFERENCE_TOKEN", "TS_KEY_FILE")
    }

    result = subprocess.run(
        base + ["--key-file", str(production.key_file), "--out", str(tmp_path / "open")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env_without_token,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["requests"] > 0 and summary["failures"] == 0, summary.get("failure_reasons")

    # A named key file that does not exist is a usage error (2); a wrong token is refused at the pre-flight request
    # (1), with the hint, before any Locust run.
    missing = subprocess.run(
        base + ["--key-file", str(tmp_path / "absent.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env_without_token,
    )
    assert missing.returncode == 2 and "not found" in missing.stderr
    wrong = subprocess.run(
        base + ["--token", "not-the-key"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env_without_token
    )
    assert wrong.returncode == 1 and "wants an inference token" in wrong.stderr, wrong.stderr[-2000:]


def test_capacity_steps_send_the_token(production, tmp_path):
    result = capacity.capacity(
        production.inference_url,
        "classifier",
        slo_ms=5000,
        out_dir=tmp_path / "capacity",
        start_rate=5,
        max_rate=5,
        max_steps=1,
        step_seconds=3,
        warmup_seconds=0,
        cooldown_seconds=0,
        log=lambda *_: None,
        token=production.tokens()["inference"],
    )
    [step] = result["steps"]
    assert step["requests"] > 0 and step["failures"] == 0 and step["passed"], step
