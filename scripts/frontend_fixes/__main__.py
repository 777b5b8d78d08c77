"""Fix TorchServe 0.12.0's frontend in place: `python -m scripts.frontend_fixes [--check] [--jar PATH]`.

TorchServe is archived upstream, and three of its frontend's behaviours let one management call stop a model or the
host (docs/operations.md, "Management calls that cannot hurt serving"):

- a customized describe (`GET /models/<m>?customized=true`, gRPC DescribeModel) of a `continuousBatching` model is
  answered, then taken from the queue again and again: the worker answers it hundreds of times a second and serves
  nothing else until the model is registered again;
- a `continuousBatching` model with two or more workers stops a running generation until another request arrives (an
  idle worker waits for work holding the queue's lock, which a busy worker waits for between steps);
- a negative worker count takes every worker away, a huge one starts workers until the host stops answering, and a
  non-numeric one is read as its default;
- unregistering a model, or scaling it to 0 workers, leaves the requests still queued for it (and those its stopped
  workers held) without any answer: their clients wait until their own timeout. They get a 503 now;
- a worker thread that stops while collecting a batch drops the requests it had taken but not yet sent: they go back
  to the queue for another worker, or get a 503 when the model has no workers left;
- a `continuousBatching` worker cannot send stream pieces in the middle of a call: the frontend took any message as
  the call's answer, so a generator running several decoding steps in one call had to send their text together. The
  pieces marked as such (STEP_PIECES) now go to their clients while the call goes on.

This rewrites the call sites involved in the installed `ts/frontend/model-server.jar` to the replacements in
FrontendFixes.java (compiled here with javac), keeping the original beside it as `model-server.jar.orig`. Only the
0.12.0 jar is patched (checked by its SHA-256); running it again changes nothing. `make install` runs it.
Exit codes: 0 patched (or already), 1 `--check` found the jar unpatched or patched by other sources, 2 cannot patch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from handlers.core.frontend_jar import MARKER, installed_jar, marker
from scripts.frontend_fixes.classfile import ClassFile, ClassFileError

HERE = Path(__file__).resolve().parent
JAVA_SOURCE = HERE / "FrontendFixes.java"
FIXES_CLASS = "servingfixes/FrontendFixes"
# model-server.jar as the torchserve 0.12.0 wheel ships it.
ORIGINAL_SHA256 = "ce340411ce54beaacd3dcfa31644a9aa369a83a36ed687172ba1088a13123dfe"

UPDATE_WORKERS = (
    "(Ljava/lang/String;Ljava/lang/String;IIZZLjava/util/function/Function;)Lorg/pytorch/serve/http/StatusResponse;"
)
INT_PARAMETER = "(Lio/netty/handler/codec/http/QueryStringDecoder;Ljava/lang/String;I)I"


@dataclass(frozen=True)
class Redirect:
    """In ``entry``'s method ``method`` ("*": all), the calls of ``target`` go to FrontendFixes.``name``."""

    entry: str
    method: str
    target: tuple[str, str, str]
    name: str
    descriptor: str
    expected: int


WORKER_RESPONSE = "Lorg/pytorch/serve/util/messages/ModelWorkerResponse;"
REDIRECTS = (
    Redirect(
        "org/pytorch/serve/wlm/ContinuousBatching.class",
        "pollBatch",
        ("org/pytorch/serve/wlm/Model", "pollInferJob", "(Ljava/util/Map;I)V"),
        "pollContinuousBatch",
        "(Lorg/pytorch/serve/wlm/Model;Ljava/util/Map;I)V",
        1,
    ),
    Redirect(
        "org/pytorch/serve/http/api/rest/ManagementRequestHandler.class",
        "handleScaleModel",
        ("org/pytorch/serve/util/ApiUtils", "updateModelWorkers", UPDATE_WORKERS),
        "updateModelWorkers",
        UPDATE_WORKERS,
        1,
    ),
    Redirect(
        "org/pytorch/serve/util/ApiUtils.class",
        "handleRegister",
        ("org/pytorch/serve/util/ApiUtils", "updateModelWorkers", UPDATE_WORKERS),
        "updateModelWorkers",
        UPDATE_WORKERS,
        1,
    ),
    Redirect(
        "org/pytorch/serve/grpcimpl/ManagementImpl.class",
        "scaleWorker",
        ("org/pytorch/serve/util/ApiUtils", "updateModelWorkers", UPDATE_WORKERS),
        "updateModelWorkers",
        UPDATE_WORKERS,
        1,
    ),
    Redirect(
        "org/pytorch/serve/util/ApiUtils.class",
        "unregisterModel",
        ("org/pytorch/serve/wlm/ModelManager", "unregisterModel", "(Ljava/lang/String;Ljava/lang/String;)I"),
        "unregisterModel",
        "(Lorg/pytorch/serve/wlm/ModelManager;Ljava/lang/String;Ljava/lang/String;)I",
        1,
    ),
    Redirect(
        "org/pytorch/serve/wlm/WorkerThread.class",
        "run",
        ("org/pytorch/serve/wlm/BatchAggregator", "sendResponse", f"({WORKER_RESPONSE})Z"),
        "sendResponse",
        f"(Lorg/pytorch/serve/wlm/BatchAggregator;{WORKER_RESPONSE})Z",
        1,
    ),
    Redirect(
        "org/pytorch/serve/wlm/WorkerThread.class",
        "run",
        ("org/pytorch/serve/wlm/BatchAggregator", "cleanJobs", "()V"),
        "releaseJobs",
        "(Lorg/pytorch/serve/wlm/BatchAggregator;)V",
        7,
    ),
    Redirect(
        "org/pytorch/serve/http/api/rest/ManagementRequestHandler.class",
        "*",
        ("org/pytorch/serve/util/NettyUtils", "getIntParameter", INT_PARAMETER),
        "intParameter",
        INT_PARAMETER,
        4,
    ),
    Redirect(
        "org/pytorch/serve/http/messages/RegisterModelRequest.class",
        "*",
        ("org/pytorch/serve/util/NettyUtils", "getIntParameter", INT_PARAMETER),
        "intParameter",
        INT_PARAMETER,
        5,
    ),
)


class PatchError(RuntimeError):
    """The jar cannot be patched; the message says why and what to do."""


def fixes_digest() -> str:
    """Names this version of the fixes: the Java source and the table of redirected calls."""
    digest = hashlib.sha256(JAVA_SOURCE.read_bytes())
    digest.update(repr(REDIRECTS).encode())
    return digest.hexdigest()[:16]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def javac() -> str:
    """javac from $JAVA_HOME, else the PATH (the fixes compile against the jar they patch)."""
    home = os.environ.get("JAVA_HOME")
    candidates = [Path(home) / "bin" / "javac"] if home else []
    found = shutil.which("javac")
    candidates += [Path(found)] if found else []
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    raise PatchError("no javac found: install a JDK 17 or newer (Debian: openjdk-17-jdk-headless) or set JAVA_HOME")


def compile_fixes(original: Path) -> bytes:
    with tempfile.TemporaryDirectory() as out:
        result = subprocess.run(
            [javac(), "--release", "17", "-nowarn", "-cp", str(original), "-d", out, str(JAVA_SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise PatchError(f"javac failed on {JAVA_SOURCE.name}:\n{result.stderr.strip()}")
        return (Path(out) / f"{FIXES_CLASS}.class").read_bytes()


def patched_classes(original: zipfile.ZipFile) -> dict[str, bytes]:
    """Each class named in REDIRECTS with its calls redirected; a count other than expected stops the patch."""
    classes: dict[str, ClassFile] = {}
    for redirect in REDIRECTS:
        parsed = classes.setdefault(redirect.entry, ClassFile.parse(original.read(redirect.entry)))
        replacement = (FIXES_CLASS, redirect.name, redirect.descriptor)
        count = parsed.redirect_calls(redirect.method, redirect.target, replacement)
        if count != redirect.expected:
            raise PatchError(
                f"{redirect.entry} {redirect.method}: {count} calls of {redirect.target[1]} found, "
                f"{redirect.expected} expected: not the 0.12.0 frontend"
            )
    return {entry: bytes(parsed.data) for entry, parsed in classes.items()}


def write_patched(original_path: Path, target: Path, fixes_class: bytes) -> None:
    with zipfile.ZipFile(original_path) as original:
        replaced = patched_classes(original)
        info = {
            "fixes": [f"{r.entry}:{r.method} {r.target[1]} -> {r.name}" for r in REDIRECTS],
            "digest": fixes_digest(),
            "original_sha256": ORIGINAL_SHA256,
        }
        buffer = target.with_name(target.name + ".tmp")
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as patched:
            for item in original.infolist():
                patched.writestr(item, replaced.get(item.filename, original.read(item.filename)))
            patched.writestr(f"{FIXES_CLASS}.class", fixes_class)
            patched.writestr(MARKER, json.dumps(info, indent=1))
    os.replace(buffer, target)


def patch(jar: Path, log=print) -> str:
    """Patch ``jar`` in place (idempotent). Returns what happened, in words."""
    backup = jar.with_name(jar.name + ".orig")
    current = marker(jar)
    if current and current.get("digest") == fixes_digest():
        return f"{jar}: frontend fixes already applied ({current['digest']})"
    if current is None:
        if sha256(jar) != ORIGINAL_SHA256:
            raise PatchError(f"{jar} is not torchserve 0.12.0's model-server.jar (SHA-256 differs): not patched")
        shutil.copyfile(jar, backup)
    elif not backup.is_file() or sha256(backup) != ORIGINAL_SHA256:
        raise PatchError(f"{jar} carries older fixes and {backup.name} is missing: reinstall torchserve==0.12.0")
    log(f"patching {jar} (original kept as {backup.name}) ...")
    write_patched(backup, jar, compile_fixes(backup))
    return f"{jar}: frontend fixes applied ({fixes_digest()})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.frontend_fixes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jar", type=Path, help="model-server.jar to patch (default: the installed torchserve's)")
    parser.add_argument("--check", action="store_true", help="only say whether the jar carries these fixes")
    args = parser.parse_args(argv)
    jar = args.jar or installed_jar()
    if not jar.is_file():
        print(f"{jar}: no such file (is torchserve==0.12.0 installed?)", file=sys.stderr)
        return 2
    if args.check:
        current = marker(jar)
        ok = bool(current) and current.get("digest") == fixes_digest()
        print(f"{jar}: {'fixes applied' if ok else 'NOT patched with these fixes'}")
        return 0 if ok else 1
    try:
        print(patch(jar))
    except (PatchError, ClassFileError, OSError) as error:
        print(f"frontend fixes: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
