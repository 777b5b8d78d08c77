"""Replacing the serving version of a model without failed requests, on top of the management client.

Register the new version beside the old, wait until its workers are READY, make it the default, drain each old
version (wait until its queue stayed empty) and unregister it. On any failure before the switch the new version is
removed again and the old one keeps serving.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scripts.ops.management import (
    EXIT_CONFLICT,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    Log,
    ManagementClient,
    ManagementError,
    quiet,
)


def archive_identity(archive: str, model_store: str | os.PathLike) -> tuple[str, str] | None:
    """(name, version) from the archive's MAR-INF/MANIFEST.json when the store is readable here, else None."""
    path = Path(model_store) / archive
    try:
        with zipfile.ZipFile(path) as mar:
            model = json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]
        return model["modelName"], str(model["modelVersion"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def find_registered(client: ManagementClient, archive: str) -> tuple[str, str] | None:
    """(name, version) of the registered version whose modelUrl is this archive (for stores we cannot read)."""
    for entry in client.list_models():
        for version in client.versions(entry["modelName"]):
            if version.get("modelUrl") == archive:
                return version["modelName"], str(version["modelVersion"])
    return None


def versions_and_default(client: ManagementClient, name: str) -> tuple[list[str], str | None]:
    """The registered versions of a model and its default; ([], None) for a model not registered."""
    try:
        return [v["modelVersion"] for v in client.versions(name)], client.default_version(name)
    except ManagementError as error:
        if error.exit_code != EXIT_NOT_FOUND:
            raise
        return [], None


@dataclass
class RolloutResult:
    model: str
    version: str
    previous_default: str | None
    unregistered: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def rollout(
    client: ManagementClient,
    archive: str,
    model_store: str | os.PathLike,
    wait_timeout: float = 600.0,
    register_timeout: float = 30.0,
    drain_seconds: float = 2.0,
    smoke_test_seconds: float = 0.0,
    keep_old: bool = False,
    log: Log = quiet,
) -> RolloutResult:
    """Roll `archive` (a file in the server's model store, readable here) out as its model's default version."""
    started = time.monotonic()
    identity = archive_identity(archive, model_store)
    if identity is None:
        raise ManagementError(
            f"cannot read {Path(model_store) / archive} (rollout needs the archive's model name "
            f"and version before it registers it; pass --model-store)",
            EXIT_NOT_FOUND,
        )
    name, version = identity
    before, old_default = versions_and_default(client, name)
    if version in before:
        raise ManagementError(
            f"{name} {version} is already registered (versions: {before}); a rollout needs a new "
            f"version: build one with `python -m scripts.package {name} --version X`",
            EXIT_CONFLICT,
        )
    log(f"rollout {name}: {old_default or '(none)'} -> {version} from {archive}")

    client.register(archive, synchronous=False, timeout=register_timeout)
    log(f"  registered {name} {version}; waiting for its workers")
    try:
        client.wait_ready(name, version, wait_timeout, log=log)
        if smoke_test_seconds:
            time.sleep(smoke_test_seconds)
            client.wait_ready(name, version, 0)  # still READY: the workers did not crash after loading
        client.set_default(name, version)
    except ManagementError as error:
        # Roll back: the new version never took traffic through the default route; remove it again.
        rollback = "removed it again"
        try:
            client.unregister(name, version, drain=False)
        except ManagementError as cleanup_error:
            rollback = f"could not remove it ({cleanup_error})"
        keeps = f"{name} {old_default} keeps serving" if old_default else "nothing was serving before"
        raise ManagementError(
            f"rollout of {name} {version} failed: {error}; {rollback}; {keeps}", EXIT_FAILED
        ) from None
    log(f"  {name} {version} is the default; draining {before or 'nothing'}")

    result = RolloutResult(name, version, old_default)
    for old in before:
        if keep_old:
            result.kept.append(old)
            continue
        try:
            client.unregister(name, old, quiet_seconds=drain_seconds, drain_timeout=wait_timeout)
        except ManagementError as error:
            raise ManagementError(
                f"{name} {version} serves as default, but retiring {old} failed: {error}", EXIT_FAILED
            ) from None
        result.unregistered.append(old)
        log(f"  unregistered {name} {old}")
    result.seconds = round(time.monotonic() - started, 2)
    log(
        f"rollout done in {result.seconds:.1f}s: {name} {version} is the default"
        + (f"; kept {result.kept}" if result.kept else "")
    )
    return result
