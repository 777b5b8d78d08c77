"""The load-test tooling against the session's TorchServe: a few seconds of the smoke and open-loop profiles.

Asserts that the runs are clean (no failures: every answer had the right status and shape) and that the report
folder holds sane numbers. No timing thresholds: speed is measured by `make loadtest/capacity/compare`, not here.
"""

import json
import subprocess
import sys

import pytest

from loadtests import preflight, run
from scripts.ops.server import loaded_model_names

REPORT_FILES = (
    "summary.json",
    "summary.md",
    "timeline.png",
    "report.html",
    "final_stats.json",
    "locust.log",
    "locust_stats.csv",
    "locust_stats_history.csv",
    "locust_failures.csv",
)


def served(server, model):
    if model not in loaded_model_names(server.props):
        pytest.skip(f"{model} is not loaded by this session's server (TS_TEST_MODELS)")


def assert_sane_report(summary, folder):
    for name in REPORT_FILES:
        assert (folder / name).is_file() and (folder / name).stat().st_size > 0, name
    assert json.loads((folder / "summary.json").read_text())["requests"] == summary["requests"]
    assert summary["requests"] > 0 and summary["failures"] == 0, summary.get("failure_reasons")
    assert summary["rps"] > 0
    assert 0 < summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"] <= summary["p999_ms"] <= summary["max_ms"]
    assert f"| {summary['requests']} | 0 |" in (folder / "summary.md").read_text()


@pytest.mark.parametrize("model", ["classifier", "minilm"])
def test_smoke_profile_runs_clean_and_writes_the_report(ts_server, model, tmp_path):
    served(ts_server, model)
    preflight.wait_for_model(ts_server.inference_url, model)  # answers at all (and warm) before the clock starts
    settings = run.settings_for(model, "smoke", users=2, duration=6)
    summary = run.run(
        settings, ts_server.inference_url, ts_server.metrics_url, tmp_path / "report", log=lambda *_: None
    )

    assert_sane_report(summary, tmp_path / "report")
    server = summary["server"]
    assert server["available"] and server["requests"] >= summary["requests"]  # the server saw every answered request
    assert server["inference_batches"] > 0 and server["mean_batch_requests"] >= 1
    assert 0 < summary["generator"]["cpu_seconds"] and 0 < summary["generator"]["cpu_share"] <= 1
    if model == "minilm":
        assert server["cache_hits"] + server["cache_misses"] > 0 and server["cache_hit_rate"] is not None


def test_open_loop_cli_reports_target_and_achieved_rate(ts_server, tmp_path):
    served(ts_server, "classifier")
    folder = tmp_path / "open"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtests.run",
            "--model",
            "classifier",
            "--profile",
            "open",
            "--rate",
            "20",
            "--duration",
            "4",
            "--host",
            ts_server.inference_url,
            "--metrics-url",
            ts_server.metrics_url,
            "--out",
            str(folder),
            "--json",
        ],
        cwd=run.REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)

    assert_sane_report(summary, folder)
    loop = summary["open_loop"]
    assert json.loads((folder / "open_loop.json").read_text()) == loop
    assert summary["target_rate"] == loop["target_rate"] == 20.0
    assert summary["achieved_rate"] == loop["achieved_rate"] > 0
    assert loop["scheduled"] == loop["started"] + loop["not_started"]
    # Without failures nothing was retried: each finished request was started once and counted once.
    assert summary["requests"] == loop["started"] - loop["unfinished_at_stop"] > 0
