"""TorchServe's gRPC Python stubs, generated from the .proto files of the installed torchserve wheel.

TorchServe 0.12 ships its gRPC interface only as .proto files inside its frontend jar
(site-packages/ts/frontend/model-server.jar: proto/inference.proto, proto/management.proto and
proto/open_inference_grpc.proto). This module extracts them and runs grpcio-tools' protoc on them, so the client
(scripts/ops/grpc_client.py) speaks exactly the interface of the pinned server and no generated or copied source is
kept in the repository:

    python -m scripts.ops.grpc_stubs            # generate (once; `make grpc-stubs`), print where
    python -m scripts.ops.grpc_stubs --force    # generate again

The stubs land in build/grpc/<fingerprint>/ts_grpc/ (inference_pb2, inference_pb2_grpc, management_pb2, ...;
.pyi type stubs beside them). The fingerprint is a hash of the three .proto files and of the grpcio-tools version, so
a new torchserve or grpcio-tools pin generates a new folder, and generation is deterministic (same inputs, same
bytes). Each folder is written under a temporary name and renamed into place, so processes that generate at the same
time never see a half-written one. `load(name)` generates on first use: a fresh checkout or `make clean` needs no
separate step. It takes about a second.

The .proto files name each other and google/protobuf/empty.proto, google/rpc/status.proto by bare file name. They
are compiled as ts_grpc/<name>.proto so the generated modules import each other as the package ts_grpc; the proto
packages (org.pytorch.serve.grpc.*) and so the service and method names on the wire are unchanged. google/rpc/status
at run time is googleapis-common-protos' status_pb2 (its descriptor is registered under the same file name).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import importlib.resources
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / "build" / "grpc"
PACKAGE = "ts_grpc"
# The frontend jar's .proto files: TorchServe's own inference and management APIs, and its Open Inference Protocol.
PROTOS = ("inference.proto", "management.proto", "open_inference_grpc.proto")
# Imported by inference.proto and shipped in the jar: compiled against, not generated (googleapis-common-protos is
# the run-time module).
INCLUDES = ("google/rpc/status.proto",)
STAMP = "GENERATED_FROM"


class StubsError(RuntimeError):
    """The stubs cannot be generated (no torchserve wheel, no grpcio-tools, protoc failed); the message says why."""


def frontend_jar() -> Path:
    """The installed torchserve wheel's frontend jar, which carries the .proto files."""
    spec = importlib.util.find_spec("ts")
    if spec is None or not spec.submodule_search_locations:
        raise StubsError("the torchserve package is not installed in this Python (pip install -r requirements.txt)")
    jar = Path(next(iter(spec.submodule_search_locations))) / "frontend" / "model-server.jar"
    if not jar.is_file():
        raise StubsError(f"{jar} is missing: is torchserve installed completely?")
    return jar


def read_protos(jar: Path) -> dict[str, bytes]:
    """{path inside the jar: bytes} for the protos to generate (proto/<name>) and the includes."""
    wanted = [f"proto/{name}" for name in PROTOS] + list(INCLUDES)
    with zipfile.ZipFile(jar) as archive:
        names = set(archive.namelist())
        missing = [name for name in wanted if name not in names]
        if missing:
            raise StubsError(f"{jar} has no {', '.join(missing)} (another torchserve version than 0.12?)")
        return {name: archive.read(name) for name in wanted}


def tools_version() -> str:
    try:
        return importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        raise StubsError(
            "grpcio-tools is not installed: pip install grpcio-tools (the version pinned in requirements.txt)"
        ) from None


def fingerprint(protos: dict[str, bytes], tools: str) -> str:
    digest = hashlib.sha256(f"grpcio-tools=={tools}\n".encode())
    for name in sorted(protos):
        digest.update(name.encode() + b"\0" + protos[name] + b"\0")
    return digest.hexdigest()[:16]


def protoc(source: Path, out: Path) -> None:
    """grpcio-tools' protoc (in a subprocess: it writes its errors to stderr and exits) on ts_grpc/*.proto."""
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{source}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(f"{PACKAGE}/{name}" for name in PROTOS),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise StubsError(f"protoc failed (exit {result.returncode}): {result.stderr.strip() or result.stdout.strip()}")


def generate(out_dir: Path = OUT_DIR, force: bool = False) -> Path:
    """The folder that holds the ts_grpc package for the installed torchserve and grpcio-tools (generated when
    missing, or always with `force`). Put it on sys.path to import ts_grpc.inference_pb2 and the rest."""
    jar = frontend_jar()
    protos = read_protos(jar)
    tools = tools_version()
    target = out_dir / fingerprint(protos, tools)
    if (target / PACKAGE / STAMP).is_file() and not force:
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".generating-", dir=out_dir))
    try:
        source, result = work / "proto", work / "result"
        for name, content in protos.items():
            path = source / (f"{PACKAGE}/{Path(name).name}" if name.startswith("proto/") else name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        result.mkdir()
        protoc(source, result)
        package = result / PACKAGE
        (package / "__init__.py").write_text(
            '"""TorchServe gRPC stubs generated by scripts/ops/grpc_stubs.py; do not edit."""\n'
        )
        (package / STAMP).write_text(
            f"{jar} ({', '.join(f'proto/{name}' for name in PROTOS)})\ngrpcio-tools=={tools}\n"
        )
        if force and target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(result, target)  # atomic; fails if another process put the same stubs there first
        except OSError:
            if not (target / PACKAGE / STAMP).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def load(name: str) -> ModuleType:
    """ts_grpc.<name> (e.g. "inference_pb2_grpc"), generating the stubs first when needed."""
    folder = str(generate())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(f"{PACKAGE}.{name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.ops.grpc_stubs",
        description="Generate TorchServe's gRPC Python stubs from the .proto files in the installed torchserve wheel.",
    )
    parser.add_argument("--force", action="store_true", help="generate again even when up to date")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    args = parser.parse_args(argv)
    try:
        folder = generate(args.out, args.force)
    except StubsError as error:
        print(f"grpc_stubs: {error}", file=sys.stderr)
        return 1
    print(f"{folder / PACKAGE} ({', '.join(PROTOS)}; {tools_version()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
