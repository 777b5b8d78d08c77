"""The gRPC client without a server: stubs generated from the installed torchserve wheel's .proto files, bodies, the
two calls it refuses to send (each fails a TorchServe 0.12 worker), error mapping and the CLI's exit codes.
Against a real server: tests/integration/test_clients_grpc.py."""

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from scripts.ops import grpc_stubs
from scripts.ops.grpc_client import (
    EXIT_AUTH,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    GrpcError,
    TorchServeGrpc,
    answer_error,
    asks_to_stream,
    encode_body,
    rpc_error,
)
from scripts.ops.server import free_ports

REPO = Path(__file__).resolve().parents[2]


def test_stubs_come_from_the_wheel_and_generate_deterministically(tmp_path):
    first = grpc_stubs.generate(tmp_path / "a")
    second = grpc_stubs.generate(tmp_path / "b", force=True)
    assert first.name == second.name  # the fingerprint: same protos, same grpcio-tools
    files = sorted(path.name for path in (first / "ts_grpc").iterdir())
    for name in ("inference", "management", "open_inference_grpc"):
        assert {f"{name}_pb2.py", f"{name}_pb2.pyi", f"{name}_pb2_grpc.py"} <= set(files)
        for suffix in ("_pb2.py", "_pb2_grpc.py"):
            assert (first / "ts_grpc" / f"{name}{suffix}").read_bytes() == (
                second / "ts_grpc" / f"{name}{suffix}"
            ).read_bytes()
    assert grpc_stubs.generate(tmp_path / "a") == first  # up to date: not generated again


def test_stubs_speak_torchserves_service_names():
    services = {
        "inference_pb2": ("InferenceAPIsService", "org.pytorch.serve.grpc.inference.InferenceAPIsService"),
        "management_pb2": ("ManagementAPIsService", "org.pytorch.serve.grpc.management.ManagementAPIsService"),
        "open_inference_grpc_pb2": (
            "GRPCInferenceService",
            "org.pytorch.serve.grpc.openinference.GRPCInferenceService",
        ),
    }
    for module, (service, full_name) in services.items():
        assert grpc_stubs.load(module).DESCRIPTOR.services_by_name[service].full_name == full_name
    methods = grpc_stubs.load("inference_pb2").DESCRIPTOR.services_by_name["InferenceAPIsService"].methods_by_name
    assert {"Ping", "Predictions", "StreamPredictions", "StreamPredictions2"} <= set(methods)


def test_bodies():
    assert encode_body({"inputs": [1, 2]}) == b'{"inputs":[1,2]}'
    assert encode_body("é") == "é".encode()
    assert encode_body(b"\x00raw") == b"\x00raw"
    assert asks_to_stream(b'{"prompt": "x", "stream": true}')
    assert not asks_to_stream(b'{"prompt": "x", "stream": "true"}')
    assert not asks_to_stream(b"[1]") and not asks_to_stream(b"\xff")
    assert answer_error(b'{"code":400,"type":"InvalidRequest","message":"m"}')["code"] == 400
    assert answer_error(b'{"label":1}') is None and answer_error(b'{"code":200,"message":"m"}') is None


def closed_client():
    port = free_ports(1)[0]
    return TorchServeGrpc(f"127.0.0.1:{port}", f"127.0.0.1:{port}", timeout=5)


def test_calls_that_fail_a_torchserve_worker_are_refused_before_sending():
    with closed_client() as client:
        with pytest.raises(GrpcError) as unary:
            client.predict("generator", {"prompt": "x", "stream": True})
        assert unary.value.exit_code == EXIT_USAGE and unary.value.status is None
        with pytest.raises(GrpcError) as one_piece:
            list(client.stream_predict("classifier", {"inputs": [0.1] * 128}))
        assert one_piece.value.exit_code == EXIT_USAGE and one_piece.value.status is None
        with pytest.raises(GrpcError) as unreachable:
            client.predict("classifier", {"inputs": [0.1] * 128})
        assert unreachable.value.exit_code == EXIT_UNREACHABLE


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "exit_code", "text"),
    [
        (
            grpc.StatusCode.INTERNAL,
            "Model not found: x\norg.pytorch.serve.archive.model.ModelNotFoundException",
            EXIT_NOT_FOUND,
            "INTERNAL: Model not found: x",
        ),
        (grpc.StatusCode.NOT_FOUND, "Model not found: x", EXIT_NOT_FOUND, "NOT_FOUND: Model not found: x"),
        (
            grpc.StatusCode.PERMISSION_DENIED,
            "Token Authorization failed. Token either incorrect, expired, or not provided correctly",
            EXIT_AUTH,
            "pass --token",
        ),
        (
            grpc.StatusCode.INTERNAL,
            "Worker died.\norg.pytorch.serve.http.InternalServerException",
            EXIT_FAILED,
            "INTERNAL: Worker died.",
        ),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", EXIT_UNREACHABLE, "in time"),
    ],
)
def test_rpc_errors_map_to_exit_codes(code, details, exit_code, text):
    error = rpc_error("Predictions x", "127.0.0.1:7070", FakeRpcError(code, details))
    assert error.exit_code == exit_code and error.status == code
    assert text in str(error) and "\n" not in str(error)


def run_cli(*args):
    command = [sys.executable, "-m", "scripts.ops.grpc_client", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_cli_help_usage_and_unreachable():
    helped = run_cli("--help")
    assert helped.returncode == 0 and "Exit codes" in helped.stdout
    assert run_cli("bogus").returncode == EXIT_USAGE
    port = str(free_ports(1)[0])
    refused = run_cli("--inference-port", port, "predict", "generator", '{"prompt": "x", "stream": true}')
    assert refused.returncode == EXIT_USAGE and "stream_predict" in refused.stderr
    missing = run_cli("--inference-port", port, "predict", "classifier", "@/no/such/file")
    assert missing.returncode == EXIT_USAGE and "cannot read" in missing.stderr
    closed = run_cli("--inference-port", port, "--timeout", "5", "ping")
    assert closed.returncode == EXIT_UNREACHABLE and "no gRPC server at" in closed.stderr
