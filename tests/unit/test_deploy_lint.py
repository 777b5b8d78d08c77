"""What `make test` checks of deploy/ without a cluster: every manifest against the Kubernetes schemas
(kubernetes-validate ships them: offline), the Dockerfile through hadolint, and the shared embedding cache wiring (the
TorchServe pods point at the cache Service, with its password from a Secret; only they reach it)."""

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from handlers.text.shared_cache import PASSWORD_FILE_ENV, URL_ENV

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MANIFESTS = sorted(
    [*(path for folder in ("k8s", "kserve") for path in (DEPLOY / folder).glob("*.yaml"))]
    + [DEPLOY / "monitoring" / "prometheus-adapter-config.yaml"]
)
# Custom resources: their schemas come with the operator, not with Kubernetes.
CUSTOM_KINDS = {("serving.kserve.io/v1beta1", "InferenceService")}


def documents(path):
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


@pytest.mark.parametrize("path", MANIFESTS, ids=[str(p.relative_to(DEPLOY)) for p in MANIFESTS])
def test_every_manifest_is_valid_against_the_kubernetes_schemas(path):
    for document in documents(path):
        if (document["apiVersion"], document["kind"]) in CUSTOM_KINDS:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)
            continue
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_the_manifests_include_the_cache_and_are_checked():
    names = {path.name for path in MANIFESTS}
    assert {"deployment.yaml", "cache-deployment.yaml", "cache-service.yaml", "cache-networkpolicy.yaml"} <= names


def test_an_invalid_manifest_is_refused():
    broken = documents(DEPLOY / "k8s" / "cache-service.yaml")[0]
    broken["spec"]["ports"][0]["port"] = "six thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_the_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def env_of(container):
    return {item["name"]: item for item in container.get("env", [])}


def test_torchserve_pods_use_the_cache_service_with_the_secrets_password():
    settings = yaml.safe_load((DEPLOY / "deploy.yaml").read_text())
    cache_service = documents(DEPLOY / "k8s" / "cache-service.yaml")[0]
    pod = documents(DEPLOY / "k8s" / "deployment.yaml")[0]["spec"]["template"]["spec"]
    container = next(container for container in pod["containers"] if container["name"] == "torchserve")
    env = env_of(container)
    port = cache_service["spec"]["ports"][0]["port"]
    assert env[URL_ENV]["value"] == f"redis://{cache_service['metadata']['name']}:{port}/0"
    password_dir = str(Path(env[PASSWORD_FILE_ENV]["value"]).parent)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == password_dir)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == settings["cache"]["password_secret"]
    inference_service = documents(DEPLOY / "kserve" / "inferenceservice.yaml")[0]
    assert env_of(inference_service["spec"]["predictor"]["model"])[URL_ENV]["value"] == env[URL_ENV]["value"]


def test_the_cache_is_bounded_password_protected_and_reachable_by_torchserve_only():
    cache = documents(DEPLOY / "k8s" / "cache-deployment.yaml")[0]
    [container] = cache["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "allkeys-lru" and "--maxmemory" in args
    assert args[args.index("--requirepass") + 1] == "$(CACHE_PASSWORD)"
    assert env_of(container)["CACHE_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "password"
    policy = documents(DEPLOY / "k8s" / "cache-networkpolicy.yaml")[0]
    torchserve = documents(DEPLOY / "k8s" / "deployment.yaml")[0]
    assert policy["spec"]["podSelector"]["matchLabels"] == cache["spec"]["selector"]["matchLabels"]
    [rule] = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": torchserve["spec"]["selector"]["matchLabels"]}}]
