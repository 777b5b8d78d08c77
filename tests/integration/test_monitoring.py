"""A real Prometheus (deploy/monitoring/prometheus.yml and rules.yml, 1 s scrapes) watching the session's TorchServe
and a queue exporter, both started as `make monitor` starts them (scripts/ops/prometheus.py): asked through
Prometheus' HTTP API, the targets are up, TorchServe's, the handlers' and the exporter's metrics are ingested, every
rule loads and evaluates, and the recording rules yield series for the served model."""

import time

import pytest
import requests

from scripts.ops.prometheus import Monitor, running_monitor
from scripts.ops.server import free_ports
from tests.conftest import skip_unless_served

MODEL = "minilm"


def wait_for(what, check, timeout=60.0):
    """check()'s first truthy answer, polled; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = check()
        if answer:
            return answer
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout:.0f}s")


def values(monitor, expression):
    return {tuple(sorted(row["metric"].items())): float(row["value"][1]) for row in monitor.query(expression)}


@pytest.fixture(scope="module")
def monitor(ts_server, tmp_path_factory):
    skip_unless_served(ts_server, MODEL)
    prometheus_port, exporter_port = free_ports(2)
    run_dir = tmp_path_factory.mktemp("monitor")
    watcher = Monitor(
        run_dir, run_dir / "logs", prometheus_port, ts_server.metrics_url, ts_server.management_url, exporter_port, "1s"
    )
    with running_monitor(watcher) as started:
        yield started


def test_prometheus_scrapes_torchserve_and_the_queue_exporter(monitor, ts_server):
    def healthy():
        targets = monitor.api("targets")["activeTargets"]
        return {target["labels"]["job"]: target["health"] for target in targets} == {
            "torchserve": "up",
            "torchserve-queue": "up",
        }

    wait_for("both targets up", healthy)
    assert set(values(monitor, "up").values()) == {1.0}
    # The queue exporter reads the model's job queue: pending + free places = job_queue_size of the server's config.
    capacity = values(
        monitor,
        f'sum(torchserve_queue_pending_requests{{ModelName="{MODEL}"}}) + '
        f'sum(torchserve_queue_remaining_capacity{{ModelName="{MODEL}"}})',
    )
    assert list(capacity.values()) == [float(ts_server.props["job_queue_size"])]
    assert values(monitor, "torchserve_management_up") and set(
        values(monitor, "torchserve_management_up").values()
    ) == {1}


def test_the_projects_metrics_are_ingested_and_the_rules_evaluate(monitor, ts_server):
    wait_for("first scrapes", lambda: values(monitor, 'up{job="torchserve"} == 1'))
    session = requests.Session()
    for index in range(6):
        answer = session.post(
            f"{ts_server.inference_url}/predictions/{MODEL}", json={"text": f"monitoring {index}"}, timeout=60
        )
        assert answer.status_code == 200, answer.text
        time.sleep(0.5)
    # TorchServe's own counter and the handlers' histogram, labelled as the rules expect.
    assert wait_for(
        "ts_inference_requests_total",
        lambda: values(monitor, f'ts_inference_requests_total{{model_name="{MODEL}"}} > 0'),
    )
    assert wait_for("InferenceSeconds", lambda: values(monitor, f'InferenceSeconds_count{{ModelName="{MODEL}"}} > 0'))
    # Recording rules over each source: the SLO (configured), the queue (exporter), the finished work (handlers).
    slo = wait_for("the SLO rule", lambda: values(monitor, f'torchserve:slo_p99_seconds{{ModelName="{MODEL}"}}'))
    assert list(slo.values()) == [0.25]
    fill = wait_for("the queue rule", lambda: values(monitor, f'torchserve:queue_fill:ratio{{ModelName="{MODEL}"}}'))
    assert 0 <= next(iter(fill.values())) <= 1
    assert wait_for("progress", lambda: values(monitor, f'torchserve:progress:rate2m{{ModelName="{MODEL}"}} > 0'))
    assert wait_for(
        "the latency estimate",
        lambda: values(monitor, f'torchserve:request_seconds:p99_estimate_5m{{ModelName="{MODEL}"}} > 0'),
    )

    def rules_evaluated():
        groups = monitor.api("rules")["groups"]
        health = {rule["name"]: rule["health"] for group in groups for rule in group["rules"]}
        return (groups, health) if health and set(health.values()) == {"ok"} else None

    groups, health = wait_for("every rule evaluated without error", rules_evaluated)
    assert {group["name"] for group in groups} == {"torchserve-slo", "torchserve-recording", "torchserve-alerts"}
    assert "TorchServeModelStuck" in health and "torchserve:queue_fill:ratio" in health
    # A served, idle, healthy model is not stuck.
    assert not values(monitor, f'ALERTS{{alertname="TorchServeModelStuck",ModelName="{MODEL}"}}')
