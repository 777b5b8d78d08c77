"""A client of TorchServe's gRPC APIs (inference on grpc_inference_port, default 7070; management on
grpc_management_port, default 7071), built on stubs generated from TorchServe's own .proto files
(scripts/ops/grpc_stubs.py, on first use).

    python -m scripts.ops.grpc_client ping
    python -m scripts.ops.grpc_client predict classifier '{"inputs": [0.1, ...]}'
    python -m scripts.ops.grpc_client stream generator '{"prompt": "Once upon a time", "stream": true}'
    python -m scripts.ops.grpc_client describe minilm --customized
    python -m scripts.ops.grpc_client list

A BODY is JSON text, @path for a file's bytes, or - for standard input; it is sent unchanged as the request's
"body" input, which is what the HTTP API hands the handler too, so each model answers with the same bytes as over
HTTP. The server is the one config.properties describes (--config, or --host/--inference-port/--management-port);
a server with token authorization needs --token/$TS_INFERENCE_TOKEN or --key-file (its key_file.json); describe and
list use the key file's management key, or $TS_MANAGEMENT_TOKEN.

What TorchServe 0.12's gRPC API does differently from HTTP (docs/clients.md):
- A model's own refusal (our handlers' 4xx with {"code", "type", "message"}) arrives with gRPC status OK: the frontend
  drops a per-request status code on gRPC. This client reads the body: `answer_error()`; the CLI exits 7.
- A streamed answer must be read with StreamPredictions (`stream_predict`), and StreamPredictions must only be used
  for a request the model streams: a unary Predictions call that the model streams, and a StreamPredictions call it
  answers in one piece, each make TorchServe's frontend fail that worker (the worker restarts or hangs). Both calls
  are refused here before anything is sent.
- There is no Content-Type and no URL path: a body is always taken as JSON (minilm's text/plain form and the
  generator's /v1/... OpenAI routes are HTTP only).

Exit codes: 0 ok; 1 failed (server error); 2 bad arguments or a request this client will not send;
3 server unreachable or no answer in time; 4 model or version unknown; 6 token missing or refused;
7 the model refused the request (its error body is printed on stdout).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from scripts.ops import grpc_stubs
from scripts.ops.auth import KEY_FILE_ENV, TOKEN_ENV, KeyFileError, key_from_file, resolve_inference_token

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "config.properties"
MANAGEMENT_TOKEN_ENV = "TS_MANAGEMENT_TOKEN"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND, EXIT_AUTH, EXIT_REFUSED = 0, 1, 2, 3, 4, 6, 7
# The input name TorchServe's HTTP API gives a raw request body; handlers read it (handlers/core/http.request_body).
BODY_INPUT = "body"
STREAM_INPUT = "stream_pieces"  # handlers/generator.py GRPC_STREAM_INPUT

Body = bytes | str | dict[str, Any] | list[Any]


class GrpcError(Exception):
    """A failed call, as one line, with the CLI exit code that classifies it and the gRPC status (None: not sent)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, status: grpc.StatusCode | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status


# --------------------------------------------------------------------------------------------------- bodies
def encode_body(body: Body) -> bytes:
    """The bytes sent: bytes as they are, text as UTF-8, anything else as compact JSON."""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def asks_to_stream(raw: bytes) -> bool:
    """True when the body is a JSON object with "stream": true (the generator then answers in pieces)."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(value, dict) and value.get("stream") is True


def answer_error(answer: bytes) -> dict[str, Any] | None:
    """A model's own error answer ({"code": 4xx/5xx, "type", "message"}), which gRPC delivers with status OK; None for
    any other answer."""
    try:
        value = json.loads(answer)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if isinstance(value, dict) and isinstance(value.get("code"), int) and value["code"] >= 400 and "message" in value:
        return value
    return None


# --------------------------------------------------------------------------------------------------- client
class TorchServeGrpc:
    """TorchServe's gRPC inference and management APIs; every failure is a GrpcError."""

    def __init__(
        self,
        inference: str = "127.0.0.1:7070",
        management: str = "127.0.0.1:7071",
        token: str | None = None,
        management_token: str | None = None,
        timeout: float = 60.0,
    ):
        self.inference_target = inference
        self.management_target = management
        self.timeout = timeout
        self._tokens = {"inference": token, "management": management_token}
        self._pb: ModuleType = grpc_stubs.load("inference_pb2")
        self._mpb: ModuleType = grpc_stubs.load("management_pb2")
        # grpcio refuses a received message over 4 MB unless told otherwise, while an answer may be as large as the
        # server's max_response_size (6,553,500 bytes by default; the worker refuses larger ones with a 413): the
        # server bounds what it sends, so the client takes whatever size it is sent.
        options = [("grpc.max_receive_message_length", -1)]
        self._channels = [grpc.insecure_channel(inference, options), grpc.insecure_channel(management, options)]
        self._inference = grpc_stubs.load("inference_pb2_grpc").InferenceAPIsServiceStub(self._channels[0])
        self._management = grpc_stubs.load("management_pb2_grpc").ManagementAPIsServiceStub(self._channels[1])

    @classmethod
    def for_server(cls, server: Any, timeout: float = 60.0) -> TorchServeGrpc:
        """A client of a scripts.ops.server.Server: its gRPC addresses and ports, its tokens (when it has them)."""
        props, tokens = server.props, server.tokens()
        return cls(
            f"{props.get('grpc_inference_address', '127.0.0.1')}:{props.get('grpc_inference_port', '7070')}",
            f"{props.get('grpc_management_address', '127.0.0.1')}:{props.get('grpc_management_port', '7071')}",
            tokens.get("inference"),
            tokens.get("management"),
            timeout,
        )

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> TorchServeGrpc:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------- calls
    def _metadata(self, api: str) -> list[tuple[str, str]]:
        token = self._tokens[api]
        return [("authorization", f"Bearer {token}")] if token else []

    def _request(self, model: str, body: Body, version: str | None, streamed: bool = False) -> Any:
        # A streaming call says so in a second input: the generator then sends its pieces one by one (a unary call
        # with "stream": true gets them all in one answer; handlers/generator.py GRPC_STREAM_INPUT).
        inputs = {BODY_INPUT: body, **({STREAM_INPUT: b"true"} if streamed else {})}
        return self._pb.PredictionsRequest(model_name=model, model_version=version or "", input=inputs)

    def ping(self) -> str:
        """TorchServe's health ("Healthy" when it serves)."""
        empty = importlib.import_module("google.protobuf.empty_pb2").Empty()  # protobuf has no type stubs here
        try:
            answer = self._inference.Ping(empty, timeout=self.timeout, metadata=self._metadata("inference"))
        except grpc.RpcError as error:
            raise rpc_error("Ping", self.inference_target, error) from None
        try:
            return str(json.loads(answer.health).get("status", answer.health))
        except (ValueError, AttributeError):
            return str(answer.health)

    def predict(self, model: str, body: Body, version: str | None = None) -> bytes:
        """The model's answer, byte for byte as over HTTP (a refusal included: see answer_error)."""
        raw = encode_body(body)
        if asks_to_stream(raw):
            raise GrpcError(
                'a body with "stream": true needs stream_predict (StreamPredictions): TorchServe 0.12 answers a '
                "unary Predictions call with the first piece only and then fails the model's worker",
                EXIT_USAGE,
            )
        try:
            answer = self._inference.Predictions(
                self._request(model, raw, version), timeout=self.timeout, metadata=self._metadata("inference")
            )
        except grpc.RpcError as error:
            raise rpc_error(f"Predictions {model}", self.inference_target, error) from None
        return bytes(answer.prediction)

    def stream_predict(self, model: str, body: Body, version: str | None = None) -> Iterator[bytes]:
        """The pieces of a streamed answer as they arrive (the generator's NDJSON lines with "stream": true); joined,
        they are the HTTP stream's bytes. The timeout covers the whole stream."""
        raw = encode_body(body)
        if not asks_to_stream(raw):
            raise GrpcError(
                'StreamPredictions is only for a body the model streams ("stream": true): TorchServe 0.12 fails '
                "the model's worker after an answer sent in one piece; use predict",
                EXIT_USAGE,
            )
        call = self._inference.StreamPredictions(
            self._request(model, raw, version, streamed=True),
            timeout=self.timeout,
            metadata=self._metadata("inference"),
        )
        try:
            for piece in call:
                yield bytes(piece.prediction)
        except grpc.RpcError as error:
            raise rpc_error(f"StreamPredictions {model}", self.inference_target, error) from None
        finally:
            call.cancel()  # a consumer that stops early frees the stream (no-op once it has ended)

    def describe(self, model: str, version: str | None = None, customized: bool = False) -> list[dict[str, Any]]:
        """The management API's description, the JSON list GET /models/<model>[/<version>] answers over HTTP;
        ``customized`` asks the handler too."""
        request = self._mpb.DescribeModelRequest(model_name=model, model_version=version or "", customized=customized)
        return json.loads(self._manage("DescribeModel", request, model))

    def scale(self, model: str, min_worker: int, max_worker: int, version: str | None = None) -> str:
        """ScaleWorker, synchronous: TorchServe's answer text ("Workers scaled to ...")."""
        request = self._mpb.ScaleWorkerRequest(
            model_name=model,
            model_version=version or "",
            min_worker=min_worker,
            max_worker=max_worker,
            synchronous=True,
        )
        return self._manage("ScaleWorker", request, model)

    def list_models(self) -> list[dict[str, Any]]:
        """Every registered model: [{"modelName", "modelUrl"}], all pages."""
        models: list[dict[str, Any]] = []
        page_token = 0
        while True:
            request = self._mpb.ListModelsRequest(limit=100, next_page_token=page_token)
            page = json.loads(self._manage("ListModels", request, "models"))
            models += page.get("models", [])
            if not page.get("nextPageToken"):
                return models
            page_token = int(page["nextPageToken"])

    def _manage(self, method: str, request: Any, what: str) -> str:
        try:
            answer = getattr(self._management, method)(
                request, timeout=self.timeout, metadata=self._metadata("management")
            )
        except grpc.RpcError as error:
            raise rpc_error(f"{method} {what}", self.management_target, error) from None
        return str(answer.msg)


def rpc_error(call: str, target: str, error: grpc.RpcError) -> GrpcError:
    """A GrpcError for a failed call: TorchServe's text (its exception class on the last line) and an exit code."""
    code_of, details_of = getattr(error, "code", None), getattr(error, "details", None)  # grpc.Call's, when it is one
    code = code_of() if callable(code_of) else None
    details = (details_of() if callable(details_of) else None) or str(error)
    message, _, exception = details.strip().rpartition("\n")
    message = message or exception
    name = code.name if code else "ERROR"
    if code == grpc.StatusCode.UNAVAILABLE:
        return GrpcError(f"{call}: no gRPC server at {target} ({details})", EXIT_UNREACHABLE, code)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return GrpcError(f"{call}: no answer from {target} in time", EXIT_UNREACHABLE, code)
    # TorchServe 0.12 refuses a missing or wrong token with PERMISSION_DENIED "Token Authorization failed. ..."
    token_refused = "token authorization" in details.lower()
    if token_refused or code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return GrpcError(f"{call}: refused ({name}): {message}; pass --token or --key-file", EXIT_AUTH, code)
    if code == grpc.StatusCode.NOT_FOUND or "NotFoundException" in exception:
        return GrpcError(f"{call}: {name}: {message}", EXIT_NOT_FOUND, code)
    return GrpcError(f"{call}: {name}: {message}".replace("\n", " "), EXIT_FAILED, code)


# --------------------------------------------------------------------------------------------------- CLI
def read_properties(path: Path) -> dict[str, str]:
    props = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def read_body(text: str) -> bytes:
    if text == "-":
        return sys.stdin.buffer.read()
    if text.startswith("@"):
        try:
            return Path(text[1:]).read_bytes()
        except OSError as error:
            raise GrpcError(f"cannot read {text[1:]}: {error.strerror}", EXIT_USAGE) from None
    return text.encode("utf-8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.ops.grpc_client",
        description="Call TorchServe's gRPC inference (predict, stream, ping) and management (describe, list) APIs "
        "with stubs generated from TorchServe's own .proto files.",
        epilog="BODY: JSON text, @file or - (stdin), sent as is. Exit codes: 0 ok, 1 failed, 2 bad arguments, "
        "3 unreachable or timed out, 4 model/version unknown, 6 token missing or refused, 7 the model refused the "
        "request (its error body is printed).",
    )
    parser.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help="server properties for host and ports (config.properties)"
    )
    parser.add_argument("--host", help="gRPC host (default: the config's grpc_inference_address)")
    parser.add_argument("--inference-port", type=int, help="default: the config's grpc_inference_port (7070)")
    parser.add_argument("--management-port", type=int, help="default: the config's grpc_management_port (7071)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per call, a whole stream (default 60)")
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"inference token (default ${TOKEN_ENV}, else the key file's)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        default=os.environ.get(KEY_FILE_ENV),
        help=f"TorchServe's key_file.json (default ${KEY_FILE_ENV}, else .run/key_file.json when it exists)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("ping", help="the server's health")
    for name, text in (
        ("predict", "one answer (Predictions)"),
        ("stream", 'a streamed answer, piece by piece as it arrives (StreamPredictions; needs "stream": true)'),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("model")
        command.add_argument("body", metavar="BODY", help="JSON text, @file or - (stdin)")
        command.add_argument("--version", help="a model version (default: the default version)")
    describe = sub.add_parser("describe", help="a model's description (DescribeModel), JSON")
    describe.add_argument("model")
    describe.add_argument("--version", help="a model version (default: the default version)")
    describe.add_argument("--customized", action="store_true", help="with the handler's customizedMetadata")
    sub.add_parser("list", help="registered models (ListModels), JSON")
    return parser


def client_from_args(args: argparse.Namespace) -> TorchServeGrpc:
    props = read_properties(args.config) if args.config.is_file() else {}
    host = args.host or props.get("grpc_inference_address", "127.0.0.1")
    management_host = args.host or props.get("grpc_management_address", "127.0.0.1")
    inference_port = args.inference_port or int(props.get("grpc_inference_port", 7070))
    management_port = args.management_port or int(props.get("grpc_management_port", 7071))
    try:
        token, _ = resolve_inference_token(args.token, args.key_file)
        management_token = os.environ.get(MANAGEMENT_TOKEN_ENV) or None
        key_file = args.key_file or REPO / ".run" / "key_file.json"
        if not management_token and Path(key_file).is_file():
            management_token = key_from_file(key_file, "management")
    except KeyFileError as error:
        raise GrpcError(str(error), EXIT_USAGE) from None
    return TorchServeGrpc(
        f"{host}:{inference_port}", f"{management_host}:{management_port}", token, management_token, args.timeout
    )


def run(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        if args.command == "ping":
            print(client.ping())
            return EXIT_OK
        if args.command in ("describe", "list"):
            value = client.describe(args.model, args.version, args.customized) if args.command == "describe" else None
            print(json.dumps(value if value is not None else client.list_models(), indent=2))
            return EXIT_OK
        body = read_body(args.body)
        if args.command == "predict":
            pieces: Iterator[bytes] = iter([client.predict(args.model, body, args.version)])
        else:
            pieces = client.stream_predict(args.model, body, args.version)
        last = b""
        for piece in pieces:
            sys.stdout.buffer.write(piece)
            sys.stdout.buffer.flush()
            last = piece
        if last and not last.endswith(b"\n"):
            sys.stdout.buffer.write(b"\n")
        # A refusal is the whole answer, or a stream's last line ({"code": 4xx, ...} after a failed start).
        error = answer_error(last.splitlines()[-1] if last.strip() else last)
        if error is not None:
            print(f"grpc_client: {args.model} answered {error['code']}: {error['message']}", file=sys.stderr)
            return EXIT_REFUSED if error["code"] < 500 else EXIT_FAILED
        return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except GrpcError as error:
        print(f"grpc_client: {error}", file=sys.stderr)
        return error.exit_code
    except grpc_stubs.StubsError as error:
        print(f"grpc_client: cannot generate the gRPC stubs: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
