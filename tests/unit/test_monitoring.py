"""The monitoring files (deploy/monitoring/) checked offline with promtool: the rule tests pass (and fail when a rule
breaks), the configs and rules are valid, every expression of the rules and the Grafana dashboard names only metrics
that exist (TorchServe's and the handlers' in config/metrics.yaml, the queue exporter's, the recording rules), and the
queue exporter's output is valid Prometheus text. promtool comes from `make prometheus-tools` (part of `make test`); a
missing promtool fails these tests with that instruction rather than skipping them."""

import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
import yaml

from scripts import server_watchdog
from scripts.ops import prometheus, queue_exporter
from scripts.ops.management import ManagementClient
from scripts.ops.server import free_ports

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "rules.yml"
RULE_TESTS = sorted((MONITORING / "tests").glob("*.yml"))
DASHBOARD = MONITORING / "grafana-dashboard.json"
OPTIONAL_METRICS: set[str] = set()
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def promtool(*args, cwd=None):
    try:
        return prometheus.promtool(*args, cwd=cwd)
    except prometheus.MissingBinary as error:
        pytest.fail(str(error))


def exported_metrics():
    """Every series name TorchServe exports with config/metrics.yaml (a histogram as its _bucket/_sum/_count), the
    queue exporter's, and Prometheus' own `up`."""
    declared = yaml.safe_load((REPO / "config" / "metrics.yaml").read_text())
    names = {"up", *queue_exporter.METRICS, *server_watchdog.METRICS}
    for section in ("ts_metrics", "model_metrics"):
        for kind, metrics in declared[section].items():
            for metric in metrics:
                suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
                names |= {metric["name"] + suffix for suffix in suffixes}
    return names


def rule_groups():
    return yaml.safe_load(RULES.read_text())["groups"]


def recorded_names():
    return {rule["record"] for group in rule_groups() for rule in group["rules"] if "record" in rule}


def metric_names(expression):
    """The metric names a PromQL expression reads: what is left once strings, label matchers, groupings, ranges,
    numbers, function calls and keywords are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expression)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = GROUPING.sub(" ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", text):
        if re.match(r"\s*\(", text[match.end() :]) or match.group().lower() in PROMQL_KEYWORDS:
            continue
        names.add(match.group())
    return names


def dashboard_expressions(dashboard):
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def as_rules_file(expressions, path):
    """The expressions as recording rules (Grafana's $__rate_interval as 5m), for promtool's parser."""
    rules = [
        {"record": f"dashboard:expression_{index}", "expr": expression.replace("$__rate_interval", "5m")}
        for index, expression in enumerate(expressions)
    ]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return path


# ------------------------------------------------------------------------------------------------ rules
def test_every_rule_file_test_passes():
    assert RULE_TESTS, "no promtool rule tests in deploy/monitoring/tests/"
    result = promtool("test", "rules", *[str(path) for path in RULE_TESTS])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_rule_tests_fail_when_an_alert_is_broken(tmp_path):
    """The rule tests are not vacuous: with the queue alert's threshold moved past the test's 90% fill, they fail."""
    broken = RULES.read_text().replace("torchserve:queue_fill:ratio > 0.8", "torchserve:queue_fill:ratio > 0.95")
    assert broken != RULES.read_text()
    (tmp_path / "rules.yml").write_text(broken)
    (tmp_path / "tests").mkdir()
    for test in RULE_TESTS:
        shutil.copy(test, tmp_path / "tests" / test.name)
    result = promtool("test", "rules", *[str(tmp_path / "tests" / test.name) for test in RULE_TESTS])
    assert result.returncode != 0
    assert "TorchServeQueueNearLimit" in result.stdout + result.stderr


def test_rules_and_prometheus_configs_are_valid(tmp_path):
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    result = promtool("check", "config", "--syntax-only", str(MONITORING / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    # The Kubernetes scrape jobs (generated by `make k8s`): Debian's promtool is built without Kubernetes service
    # discovery, so the discovery block is swapped for static targets and the rest (relabelling, rules) is checked.
    config = yaml.safe_load((MONITORING / "prometheus-kubernetes.yml").read_text())
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["static_configs"] = [{"targets": ["127.0.0.1:1"]}]
    config["rule_files"] = [str(MONITORING / name) for name in config["rule_files"]]
    (tmp_path / "kubernetes.yml").write_text(yaml.safe_dump(config))
    result = promtool("check", "config", "--syntax-only", str(tmp_path / "kubernetes.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_cover_what_an_operator_watches():
    alerts = {rule["alert"] for group in rule_groups() for rule in group["rules"] if "alert" in rule}
    assert {
        "TorchServeQueueNearLimit",
        "TorchServeServerErrors",
        "TorchServeLatencyOverSLO",
        "TorchServeWorkerRestarts",
        "TorchServeModelStuck",
        "TorchServeSharedCacheDown",
    } <= alerts
    tested = "\n".join(path.read_text() for path in RULE_TESTS)
    assert not [alert for alert in alerts if f"alertname: {alert}" not in tested], "an alert without a rule test"


def test_rule_expressions_read_only_metrics_that_exist():
    known = exported_metrics() | recorded_names() | OPTIONAL_METRICS
    for group in rule_groups():
        for rule in group["rules"]:
            unknown = metric_names(rule["expr"]) - known
            assert not unknown, f"{rule.get('record') or rule.get('alert')} reads {sorted(unknown)}"


def test_the_metric_name_check_sees_names_and_nothing_else():
    expression = (
        'sum by (ModelName) (label_replace(rate(CacheHits{ModelName=~"$model"}[5m]), "c", "l1", "", "")) / 1e6'
        " + on (ModelName) group_left () histogram_quantile(0.99, rate(InferenceSecond_bucket[$__rate_interval]))"
        " > bool 0.5 unless torchserve:slo_p99_seconds"
    )
    assert metric_names(expression) == {"CacheHits", "InferenceSecond_bucket", "torchserve:slo_p99_seconds"}
    assert "InferenceSecond_bucket" not in exported_metrics()  # a misspelt name is caught by the tests above


# ------------------------------------------------------------------------------------------------ dashboard
def test_the_dashboard_is_templated_on_its_datasource():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert panels and len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_expressions_parse_and_read_only_metrics_that_exist(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = dashboard_expressions(dashboard)
    result = promtool("check", "rules", str(as_rules_file(expressions, tmp_path / "dashboard.yml")))
    assert result.returncode == 0, result.stdout + result.stderr
    known = exported_metrics() | recorded_names()
    for expression in expressions:
        assert not metric_names(expression) - known, expression
    # The recording rules an operator needs most are on it.
    shown = set().union(*map(metric_names, expressions))
    assert {"torchserve:queue_pending_requests", "torchserve:request_seconds:p99_estimate_5m"} <= shown
    assert {"torchserve:worker_restarts:increase15m", "torchserve:shared_cache_failures:rate5m"} <= shown


def test_a_dashboard_expression_that_does_not_parse_is_refused(tmp_path):
    result = promtool("check", "rules", str(as_rules_file(["sum by (ModelName (rate(Batches[5m]))"], tmp_path / "x")))
    assert result.returncode != 0


# ------------------------------------------------------------------------------------------------ queue exporter
DESCRIPTION = {
    "modelName": "minilm",
    "modelVersion": "1.0",
    "minWorkers": 2,
    "workers": [{"id": "9000", "status": "READY"}, {"id": "9001", "status": "UNLOADING"}],
    "jobQueueStatus": {"remainingCapacity": 250, "pendingRequests": 6},
}


def series(text):
    """{'name{labels}': value} of Prometheus text."""
    rows = [line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")]
    return {name: float(value) for name, value in rows}


def test_the_exporter_turns_a_description_into_queue_and_worker_gauges():
    text = queue_exporter.render(
        [(queue_exporter.MANAGEMENT_UP, {}, 1.0), *queue_exporter.version_samples(DESCRIPTION)]
    )
    labels = 'ModelName="minilm",ModelVersion="1.0"'
    assert series(text) == {
        "torchserve_management_up": 1,
        f"torchserve_queue_pending_requests{{{labels}}}": 6,
        f"torchserve_queue_remaining_capacity{{{labels}}}": 250,
        f'torchserve_workers{{{labels},Status="READY"}}': 1,
        f'torchserve_workers{{{labels},Status="UNLOADING"}}': 1,
        f"torchserve_min_workers{{{labels}}}": 2,
    }
    assert "# TYPE torchserve_queue_pending_requests gauge" in text


def test_the_exporters_text_parses():
    text = queue_exporter.render(
        [(queue_exporter.MANAGEMENT_UP, {}, 1.0), *queue_exporter.version_samples({**DESCRIPTION, "modelName": 'a"b'})]
    )
    result = subprocess.run(
        [prometheus.binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    output = result.stdout + result.stderr
    assert "parsing error" not in output, output
    # The one lint remark: the labels are the handlers' CamelCase ones, on purpose (rules join on ModelName).
    remarks = {line.split(" ", 1)[1] for line in output.splitlines() if line.strip()}
    assert remarks <= {"label names should be written in 'snake_case' not 'camelCase'"}, output


def test_the_exporter_says_when_the_management_api_is_unreachable():
    client = ManagementClient(f"http://127.0.0.1:{free_ports(1)[0]}", timeout=2)
    assert series(queue_exporter.render(queue_exporter.collect(client))) == {"torchserve_management_up": 0}


def test_the_exporter_answers_over_http_as_prometheus_scrapes_it():
    nothing_there = f"http://127.0.0.1:{free_ports(1)[0]}"
    port = free_ports(1)[0]
    server = queue_exporter.serve("127.0.0.1", port, lambda: ManagementClient(nothing_there, timeout=2))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        answer = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
        assert answer.status_code == 200
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert series(answer.text) == {"torchserve_management_up": 0}
        assert requests.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_the_exporter_cli_refuses_a_bad_port():
    result = subprocess.run(
        [sys.executable, "-m", "scripts.ops.queue_exporter", "--port", "not-a-port"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "--port" in result.stderr
