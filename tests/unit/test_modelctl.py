"""scripts/modelctl.py without TorchServe: exit codes and one-line errors for an unreachable server and for the
answers TorchServe 0.12 gives (recorded from a real server), served by a stub management API on a free port.
The real server paths (register, scale, rollout, tokens) are covered by tests/integration/test_rollout.py and
test_production_profile.py."""

import json

import pytest

from scripts import modelctl
from scripts.ops import model_views
from scripts.ops.management import EXIT_AUTH, EXIT_UNREACHABLE, EXIT_USAGE
from scripts.ops.server import free_ports
from tests.stub_http import stub_http_server

# What TorchServe 0.12 answers, as seen on a real server.
INVALID_KEY = (
    400,
    {
        "code": 400,
        "type": "InvalidKeyException",
        "message": "Token Authorization failed. Token either incorrect, expired, or not provided correctly",
    },
)
VERSIONS = [
    {
        "modelName": "classifier",
        "modelVersion": v,
        "modelUrl": f"classifier-{v}.mar",
        "minWorkers": 1,
        "maxWorkers": 1,
        "workers": [{"id": "9000", "status": "READY", "pid": 1, "memoryUsage": 0}],
        "jobQueueStatus": {"remainingCapacity": 100, "pendingRequests": 0},
    }
    for v in ("1.0", "2.0")
]
ROUTES = {
    ("GET", "/models"): (200, {"models": [{"modelName": "classifier", "modelUrl": "classifier-1.0.mar"}]}),
    ("GET", "/models/classifier/all"): (200, VERSIONS),
    ("GET", "/models/classifier"): (200, VERSIONS[:1]),
    ("GET", "/models/nope"): (404, {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: nope"}),
    ("GET", "/models/classifier/1.0"): (200, VERSIONS[:1]),
    ("DELETE", "/models/classifier/1.0"): (200, {"status": 'Model "classifier" unregistered'}),
    ("POST", "/models"): (
        409,
        {
            "code": 409,
            "type": "ConflictStatusException",
            "message": "Model version 2.0 is already registered for model classifier",
        },
    ),
}
CALLS = []  # (method, path) of every request the stub answered


@pytest.fixture(scope="module")
def stub_api():
    """A management API that answers from ROUTES (and records the calls), and INVALID_KEY to any request whose token
    is not 'good'."""

    def answer(method, path, headers):
        CALLS.append((method, path))
        if headers.get("Authorization") != "Bearer good":
            return INVALID_KEY
        return ROUTES.get((method, path), (500, {"code": 500, "type": "Unexpected"}))

    with stub_http_server(answer) as url:
        yield url


def run(capsys, *argv):
    code = modelctl.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_unreachable_server_is_exit_3_in_one_line(capsys, tmp_path):
    (port,) = free_ports(1)
    code, _, err = run(
        capsys, "--management-url", f"http://127.0.0.1:{port}", "--key-file", str(tmp_path / "k"), "list"
    )
    assert code == EXIT_UNREACHABLE == 3
    assert err.count("\n") == 1 and "cannot reach" in err and str(port) in err


def test_missing_token_is_exit_6_with_a_key_file_hint(capsys, stub_api, tmp_path):
    code, _, err = run(capsys, "--management-url", stub_api, "--key-file", str(tmp_path / "key_file.json"), "list")
    assert code == EXIT_AUTH == 6
    assert err.count("\n") == 1 and "requires a token" in err and "key_file.json" in err


def test_wrong_token_from_the_key_file_is_exit_6(capsys, stub_api, tmp_path):
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"management": {"key": "stale"}}))
    code, _, err = run(capsys, "--management-url", stub_api, "--key-file", str(key_file), "list")
    assert code == 6 and "refused" in err and str(key_file) in err


def test_token_from_the_key_file_is_used(capsys, stub_api, tmp_path):
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"management": {"key": "good"}, "inference": {"key": "other"}}))
    code, out, _ = run(capsys, "--management-url", stub_api, "--key-file", str(key_file), "--json", "list")
    assert code == 0
    listed = json.loads(out)["models"][0]
    assert listed["default_version"] == "1.0" and [v["version"] for v in listed["versions"]] == ["1.0", "2.0"]


def test_unknown_model_is_exit_4(capsys, stub_api):
    code, _, err = run(capsys, "--management-url", stub_api, "--token", "good", "describe", "nope")
    assert code == 4 and "Model not found: nope" in err


def test_existing_version_is_exit_5(capsys, stub_api, tmp_path):
    code, _, err = run(
        capsys,
        "--management-url",
        stub_api,
        "--token",
        "good",
        "--model-store",
        str(tmp_path),
        "register",
        "classifier-2.0.mar",
    )
    assert code == 5 and "already registered" in err


def test_unregister_needs_a_version_when_there_are_several(capsys, stub_api):
    code, _, err = run(capsys, "--management-url", stub_api, "--token", "good", "unregister", "classifier")
    assert code == EXIT_USAGE and "--all-versions" in err and "1.0" in err


def test_json_is_accepted_after_the_command(capsys, stub_api):
    code, out, _ = run(capsys, "--management-url", stub_api, "--token", "good", "list", "--json")
    assert code == 0 and json.loads(out)["models"][0]["model"] == "classifier"
    code, out, _ = run(capsys, "--management-url", stub_api, "--token", "good", "--json", "describe", "classifier")
    assert code == 0 and json.loads(out)["default_version"] == "1.0"


def test_unregister_drains_by_default(capsys, stub_api):
    CALLS.clear()
    code, out, _ = run(
        capsys,
        "--management-url",
        stub_api,
        "--token",
        "good",
        "--json",
        "unregister",
        "classifier",
        "1.0",
        "--drain-seconds",
        "0.2",
    )
    assert code == 0 and json.loads(out) == {"model": "classifier", "unregistered": ["1.0"], "drained": True}
    deleted = CALLS.index(("DELETE", "/models/classifier/1.0"))
    assert ("GET", "/models/classifier/1.0") in CALLS[:deleted], "unregistered without looking at the queue first"
    CALLS.clear()
    code, out, _ = run(
        capsys,
        "--management-url",
        stub_api,
        "--token",
        "good",
        "--json",
        "unregister",
        "classifier",
        "1.0",
        "--no-drain",
    )
    assert code == 0 and json.loads(out)["drained"] is False
    assert ("GET", "/models/classifier/1.0") not in CALLS


def test_json_errors_are_machine_readable(capsys, stub_api):
    code, out, _ = run(capsys, "--management-url", stub_api, "--token", "good", "--json", "describe", "nope")
    assert json.loads(out) == {"error": json.loads(out)["error"], "exit_code": 4}


def test_help_documents_commands_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_info:
        modelctl.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for command in ("register", "scale", "describe", "list", "set-default", "unregister", "rollout"):
        assert command in text
    assert "Exit codes" in text and "6 token missing or refused" in text


def test_describe_shows_the_handlers_choices_as_json_not_python_reprs():
    description = {
        **VERSIONS[0],
        "customizedMetadata": json.dumps(
            {"precision": "fp32", "limits": {"max_prompt_tokens": 512, "stop": ["\n"]}, "gate_rejected": None}
        ),
    }
    view = model_views.version_view(description, "1.0", "http://127.0.0.1:8081", customized=True)
    (handler_line,) = [line for line in model_views.describe_lines(view) if line.startswith("  handler")]
    assert '"max_prompt_tokens": 512' in handler_line and '["\\n"]' in handler_line
    assert "{'" not in handler_line and "None" not in handler_line and "gate_rejected null" in handler_line
    assert view["customized"]["limits"] == {"max_prompt_tokens": 512, "stop": ["\n"]}
