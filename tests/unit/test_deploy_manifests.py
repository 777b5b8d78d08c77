"""The scale-out files (scripts/deploy_manifests.py): what can be checked without a cluster or Docker. The manifests
parse and carry probes, resources, ports and scrape annotations; they name exactly the archives packaging builds;
the KServe layout (config/config.properties + model-store/*.mar) is produced; the committed deploy/ is current."""

import json
import re
import zipfile
from pathlib import Path

import pytest
import yaml

from scripts import deploy_manifests, package
from scripts.ops import queue_exporter
from scripts.ops.server import loaded_model_names, read_properties

REPO = Path(__file__).resolve().parents[2]
SETTINGS = yaml.safe_load((REPO / "deploy" / "deploy.yaml").read_text())
PROFILE = read_properties(REPO / "config" / "production.properties")


@pytest.fixture(scope="module")
def generated(model_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("deploy")
    result = deploy_manifests.generate(out, model_store)
    return out, result


def load(out, relative):
    documents = list(yaml.safe_load_all((out / relative).read_text()))
    assert len(documents) == 1
    return documents[0]


def spec_archives():
    """Archive each spec's default build produces (scripts/package.py: NAME.mar for the spec's own version)."""
    return {f"{package.load_spec(name)['name']}.mar": name for name in package.all_model_names()}


def deployed_models():
    return loaded_model_names(PROFILE)


def test_deployment_has_probes_resources_ports_and_scrape_annotations(generated):
    out, _ = generated
    deployment = load(out, "k8s/deployment.yaml")
    # The replica count is the HorizontalPodAutoscaler's (hpa.yaml), starting at deploy.yaml's replicas.
    assert deployment["kind"] == "Deployment" and "replicas" not in deployment["spec"]
    template = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(SETTINGS["ports"]["metrics"])
    containers = {container["name"]: container for container in template["spec"]["containers"]}
    assert set(containers) == {"torchserve", "model-watchdog", "queue-exporter"}
    container = containers["torchserve"]
    assert container["image"] == SETTINGS["image"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"inference": SETTINGS["ports"]["inference"], "metrics": SETTINGS["ports"]["metrics"]}
    # Readiness and startup ask the management API on loopback through the probe script the image carries
    # (TorchServe's /ping says Healthy before the workers are up); liveness is the frontend's /ping.
    for probe in ("readinessProbe", "startupProbe"):
        command = container[probe]["exec"]["command"]
        assert command[1:3] == ["-m", "scripts.ready_probe"]
        assert command[command.index("--management-url") + 1] == f"http://127.0.0.1:{SETTINGS['ports']['management']}"
        # ... and its metrics port: a model with work that answers nothing for the bound makes the pod unready.
        assert command[command.index("--metrics-url") + 1] == f"http://127.0.0.1:{SETTINGS['ports']['metrics']}"
        assert command[command.index("--stuck-after") + 1] == str(SETTINGS["stuck_after_seconds"])
    # The watchdog beside it (same image, same pod: loopback) replaces a stuck model's workers with the same bound,
    # and serves its metrics on the port the network policy opens to monitoring.
    watchdog = containers["model-watchdog"]
    assert watchdog["image"] == SETTINGS["image"] and watchdog["command"][1:3] == ["-m", "scripts.server_watchdog"]
    assert watchdog["command"][3:] == command[3:] + ["--metrics-port", str(SETTINGS["ports"]["watchdog_metrics"])]
    assert watchdog["ports"] == [{"name": "watchdog-metrics", "containerPort": SETTINGS["ports"]["watchdog_metrics"]}]
    monitoring = load(out, "k8s/networkpolicy.yaml")["spec"]["ingress"][1]["ports"]
    assert {"protocol": "TCP", "port": SETTINGS["ports"]["watchdog_metrics"]} in monitoring
    assert container["livenessProbe"]["httpGet"] == {"path": "/ping", "port": "inference"}
    startup_budget = container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"]
    for name in deployed_models():
        spec = package.load_spec(name)
        config = yaml.safe_load((spec["dir"] / spec["config"]).read_text())
        assert startup_budget >= config["startupTimeout"], f"startup probe gives up before {name} may load"
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_service_network_policy_and_budget_select_the_pods(generated):
    out, _ = generated
    pod_labels = load(out, "k8s/deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    service = load(out, "k8s/service.yaml")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"inference", "metrics"}
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    policy = load(out, "k8s/networkpolicy.yaml")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    allowed_ports = {port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]}
    ports = SETTINGS["ports"]
    # management is not reachable from outside the pod
    assert allowed_ports == {ports[name] for name in ("inference", "metrics", "watchdog_metrics", "queue_metrics")}
    budget = load(out, "k8s/poddisruptionbudget.yaml")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_manifests_name_the_archives_packaging_builds(generated, model_store):
    out, _ = generated
    builds = spec_archives()
    built = json.loads((model_store / "manifest.json").read_text())
    in_cluster = read_properties(out / "k8s" / "config.properties")
    snapshot = json.loads(read_properties(out / "kserve" / "config" / "config.properties")["model_snapshot"])
    named = set(in_cluster["load_models"].split(","))
    assert named == {f"{m}.mar" for m in deployed_models()}
    assert named == {v["marName"] for versions in snapshot["models"].values() for v in versions.values()}
    for archive in named:
        assert archive in builds, f"{archive} is not what any models/*/model.yaml builds"
        assert archive in built, f"{archive} is not in model_store/manifest.json: packaging did not build it"
        spec = package.load_spec(builds[archive])
        assert list(snapshot["models"][spec["name"]]) == [str(spec["version"])]


def test_kserve_layout_is_produced(generated):
    out, result = generated
    layout = out / "kserve"
    props = read_properties(layout / "config" / "config.properties")
    assert props["model_store"] == "/mnt/models/model-store"
    assert (
        props["metrics_config"] == "/mnt/models/config/metrics.yaml" and (layout / "config" / "metrics.yaml").is_file()
    )
    archives = sorted(p.name for p in (layout / "model-store").glob("*.mar"))
    assert archives == result["archives"] == sorted(f"{m}.mar" for m in deployed_models())
    for archive in archives:
        with zipfile.ZipFile(layout / "model-store" / archive) as mar:
            assert json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]["modelName"] == Path(archive).stem
    service = load(out, "kserve/inferenceservice.yaml")
    assert service["kind"] == "InferenceService"
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "pytorch" and model["storageUri"] == SETTINGS["kserve"]["storage_uri"]
    assert set(model["resources"]["limits"]) == {"cpu", "memory"}


def test_in_cluster_profile_is_the_production_profile_adapted(generated):
    out, _ = generated
    props = read_properties(out / "k8s" / "config.properties")
    for key in ("job_queue_size", "max_request_size", "vmargs", "metrics_mode"):
        assert props[key] == PROFILE[key]
    assert props["management_address"].startswith("http://127.0.0.1:")
    assert props["disable_token_authorization"] == "true" and props["enable_model_api"] == "false"
    assert "{model_store}" not in props["allowed_urls"] and props["model_store"] in props["allowed_urls"]


def test_dockerfile_builds_what_the_deployment_runs():
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:", dockerfile, re.M)
    assert "-r requirements.txt" in dockerfile and "openjdk-17" in dockerfile
    copies = [line.split()[1:] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    copied = {source for sources in copies for source in sources[:-1] if not source.startswith("--")}
    assert {
        "deploy/k8s/config.properties",
        "deploy/kserve/model-store/",
        "config/metrics.yaml",
        "scripts/ready_probe.py",
        "scripts/server_watchdog.py",
        "scripts/__init__.py",
        "scripts/ops/",
    } <= copied
    # The probe runs as `python -m scripts.ready_probe` from the WORKDIR: the package keeps its layout there.
    probe_and_watchdog = ["scripts/__init__.py", "scripts/ready_probe.py", "scripts/server_watchdog.py", "scripts/"]
    assert ["--chown=model-server", *probe_and_watchdog] in copies
    assert ["--chown=model-server", "scripts/ops/", "scripts/ops/"] in copies
    assert re.search(r"^WORKDIR " + re.escape(SETTINGS["home"]) + "$", dockerfile, re.M)
    included = {line[1:] for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert copied <= included, "the build context leaves out a file the Dockerfile copies"
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", dockerfile, re.M)[0].split()}
    served = ("inference", "metrics", "watchdog_metrics", "queue_metrics")
    assert exposed == {SETTINGS["ports"][name] for name in served}


def test_the_autoscaler_scales_the_deployment_on_the_queue_exporters_metric(generated):
    out, _ = generated
    hpa = load(out, "k8s/hpa.yaml")
    deployment = load(out, "k8s/deployment.yaml")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] == SETTINGS["replicas"] < hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == queue_exporter.PENDING
    assert metric["pods"]["target"] == {
        "type": "AverageValue",
        "averageValue": str(SETTINGS["autoscaling"]["queue_per_pod"]),
    }
    # The pod serves that metric: the sidecar runs the exporter the image carries, on the port Prometheus keeps.
    sidecar = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}["queue-exporter"]
    command = sidecar["command"]
    assert command[:3] == ["python", "-m", "scripts.ops.queue_exporter"]
    assert command[command.index("--management-url") + 1] == f"http://127.0.0.1:{SETTINGS['ports']['management']}"
    assert command[command.index("--port") + 1] == str(SETTINGS["ports"]["queue_metrics"])
    assert sidecar["ports"] == [{"name": "queue-metrics", "containerPort": SETTINGS["ports"]["queue_metrics"]}]
    assert sidecar["resources"]["requests"] == sidecar["resources"]["limits"]  # Guaranteed QoS needs every container's
    # prometheus-adapter turns the series into that metric of pods: the rule names it and maps namespace and pod.
    adapter = load(out, "monitoring/prometheus-adapter-config.yaml")
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["seriesQuery"].startswith(queue_exporter.PENDING + "{") and rule["name"]["as"] == queue_exporter.PENDING
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    # ... from series that carry those labels and the job names the alerts use.
    scrape = load(out, "monitoring/prometheus-kubernetes.yml")
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    assert set(jobs) == {"torchserve", "torchserve-queue", "torchserve-watchdog"}
    for job, port in (("torchserve", "metrics"), ("torchserve-queue", "queue-metrics")):
        relabels = jobs[job]["relabel_configs"]
        assert {
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": port,
            "action": "keep",
        } in relabels
        assert {r.get("target_label") for r in relabels} >= {"namespace", "pod"}


def test_missing_archive_is_a_clear_error(tmp_path, capsys):
    assert deploy_manifests.main(["--out", str(tmp_path / "out"), "--store", str(tmp_path / "empty")]) == 1
    assert "make mar" in capsys.readouterr().err


def test_committed_deploy_files_are_current(capsys):
    assert deploy_manifests.main(["--check"]) == 0, capsys.readouterr().err
