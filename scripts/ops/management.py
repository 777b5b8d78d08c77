"""The one client of TorchServe's management API: every CLI, tool and test that lists, describes, registers, scales,
switches or unregisters models goes through ManagementClient.

Failures become a ManagementError with a one-line message and the exit code that classifies it (the CLI's exit
codes, scripts/modelctl.py): unreachable, not found, conflict, token missing or refused, anything else.
Standard library and `requests` only: the readiness probe (scripts/ready_probe.py) runs it inside the image.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from scripts.ops.auth import KeyFileError, KeySource, send_renewing

DEFAULT_MANAGEMENT_URL = "http://127.0.0.1:8081"

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_AUTH = 0, 1, 2, 3, 4, 5, 6

Description = dict[str, Any]  # one version's entry of GET /models/<name>[/<version>]
Log = Callable[[str], None]


def quiet(_message: str) -> None:
    """A log that says nothing."""


class ManagementError(Exception):
    """A failure to report as one line, with the exit code that classifies it."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, status: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status  # the HTTP status TorchServe answered, None when it did not answer


def ready_workers(description: Description) -> list[dict[str, Any]]:
    """The workers of one version that are READY."""
    return [worker for worker in description.get("workers", []) if worker.get("status") == "READY"]


def wanted_workers(description: Description) -> int:
    """How many READY workers make a version ready: its minWorkers, at least one."""
    return max(1, int(description.get("minWorkers") or 1))


class ManagementClient:
    """TorchServe's management API, one method per endpoint we use; every failure is a ManagementError."""

    def __init__(
        self,
        url: str = DEFAULT_MANAGEMENT_URL,
        token: str | None = None,
        token_source: str | None = None,
        key_file: str | os.PathLike | None = None,
        timeout: float = 30.0,
        keys: KeySource | None = None,
    ):
        """`token` is sent as it is; `keys` (a key file's management key, or its API key for /token) is re-read when
        the file changes and after a refusal, so the client follows key rotations (scripts/ops/auth.py)."""
        self.url = url.rstrip("/")
        self.keys = keys or KeySource("management", token=token)
        self.token_source = token_source or self.keys.source
        self.key_file = key_file or self.keys.key_file
        self.timeout = timeout
        self.session = requests.Session()

    @property
    def token(self) -> str | None:
        return self.keys.key()

    @classmethod
    def with_key_file(
        cls, url: str, token: str | None, key_file: str | os.PathLike | None, timeout: float = 30.0
    ) -> ManagementClient:
        """A client with `token`, else the key file's management key when the file exists (a dev server without
        token authorization needs none; one that wants a token says so, and the error names the key file)."""
        if token or not (key_file and Path(key_file).is_file()):
            return cls(url, token, "--token/$TS_MANAGEMENT_TOKEN", key_file, timeout)
        keys = KeySource("management", key_file)
        try:
            keys.key()
        except KeyFileError as error:
            raise ManagementError(str(error), EXIT_AUTH) from None
        return cls(url, timeout=timeout, keys=keys)

    # ------------------------------------------------------------------------------------------- HTTP
    def request(
        self, method: str, path: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> requests.Response:
        """The raw answer (any status); ManagementError only when nothing answered. A key refused because it was
        rotated is renewed from the key file and the call sent once more."""
        timeout = timeout or self.timeout

        def send(headers: dict[str, str]) -> requests.Response:
            try:
                return self.session.request(
                    method, f"{self.url}{path}", params=params, headers=headers, timeout=timeout
                )
            except requests.ConnectionError:
                raise ManagementError(
                    f"cannot reach TorchServe's management API at {self.url} (is the server running? "
                    f"`make serve`; or pass --management-url)",
                    EXIT_UNREACHABLE,
                ) from None
            except requests.Timeout:
                raise ManagementError(
                    f"{method} {path}: no answer from {self.url} within {timeout:.0f}s", EXIT_FAILED
                ) from None

        try:
            return send_renewing(send, self.keys)
        except KeyFileError as error:
            raise ManagementError(str(error), EXIT_AUTH) from None

    def call(self, method: str, path: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """The JSON answer of a successful call; a ManagementError for any other."""
        response = self.request(method, path, params, timeout)
        if response.status_code < 300:
            try:
                return response.json()
            except ValueError:
                return {"status": response.text.strip()}
        raise self.error_for(method, path, response)

    def error_for(self, method: str, path: str, response: requests.Response) -> ManagementError:
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        kind = body.get("type", "")
        message = body.get("message") or response.text.strip() or response.reason
        code = response.status_code
        # TorchServe 0.12 refuses a missing or wrong token with 400 InvalidKeyException (not 401).
        if kind == "InvalidKeyException" or code == 401 or (code == 403 and "Version" not in kind):
            if self.keys.renewable:
                hint = self.keys.refusal_hint()
            elif self.token:
                hint = (
                    f"the token from {self.token_source} was refused: it is for another server, or it expired "
                    f"(tokens live token_expiration_min minutes unless rotated; pass --key-file instead of a "
                    f"token, and it is re-read after each rotation)"
                )
            else:
                found = "not found" if not Path(self.key_file or "").is_file() else "it has no management key"
                hint = (
                    f"this server requires a token and none was given: pass --token, or --key-file pointing "
                    f"at TorchServe's key_file.json (in the server's working directory; looked for "
                    f"{self.key_file}: {found})"
                )
            return ManagementError(
                f"{method} {path}: refused ({code} {kind or 'unauthorized'}): {hint}", EXIT_AUTH, code
            )
        exit_code = {404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT}.get(code, EXIT_FAILED)
        return ManagementError(f"{method} {path}: {code} {kind}: {message}".replace("\n", " "), exit_code, code)

    # ------------------------------------------------------------------------------------------- endpoints
    def list_models(self) -> list[dict[str, Any]]:
        """Every registered model: [{"modelName", "modelUrl"}], all pages."""
        models: list[dict[str, Any]] = []
        token = None
        while True:
            page = self.call("GET", "/models", params={"limit": 100, **({"next_page_token": token} if token else {})})
            models += page.get("models", [])
            token = page.get("nextPageToken")
            if not token:
                return models

    def versions(self, name: str) -> list[Description]:
        return self.call("GET", f"/models/{name}/all")

    def describe(self, name: str, version: str | None = None, customized: bool = False) -> list[Description]:
        """GET /models/<name>[/<version>]: a list of one description (the default version without `version`).

        ``customized`` asks the handler too (what it chose at load). Safe for every model, a continuous-batching one
        included, once the frontend carries the project's fixes (scripts/frontend_fixes)."""
        path = f"/models/{name}" + (f"/{version}" if version else "")
        return self.call("GET", path, params={"customized": "true"} if customized else None)

    def description(self, name: str, version: str | None = None) -> Description:
        """The one description of a version (default: the default version)."""
        return self.describe(name, version)[0]

    def registered(self, name: str) -> bool:
        try:
            self.describe(name)
        except ManagementError as error:
            if error.exit_code == EXIT_NOT_FOUND:
                return False
            raise
        return True

    def handler_choices(self, name: str, version: str | None = None) -> dict[str, Any]:
        """What the handler chose at load (backend, precision, threads...), from the customized describe; {} for a
        handler that does not answer it (TorchServe returns its metadata as a JSON string)."""
        metadata = self.describe(name, version, customized=True)[0].get("customizedMetadata") or {}
        if isinstance(metadata, str):
            try:
                metadata = json.loads(metadata)
            except ValueError:
                return {}
        return metadata if isinstance(metadata, dict) else {}

    def default_version(self, name: str) -> str:
        return self.description(name)["modelVersion"]

    def worker_pids(self, name: str, version: str | None = None) -> list[int]:
        return sorted(worker["pid"] for worker in self.description(name, version).get("workers", []))

    def register(
        self, archive: str, synchronous: bool = True, timeout: float | None = None, **options: Any
    ) -> dict[str, Any]:
        """POST /models?url=<archive>; options are the API's own (model_name, batch_size, initial_workers...)."""
        params = {
            "url": archive,
            "synchronous": str(synchronous).lower(),
            **{key: value for key, value in options.items() if value is not None},
        }
        return self.call("POST", "/models", params=params, timeout=timeout)

    def scale(
        self, name: str, version: str | None, min_workers: int, max_workers: int, timeout: float | None = None
    ) -> dict[str, Any]:
        """Set min/max workers and wait until TorchServe has them (synchronous)."""
        path = f"/models/{name}" + (f"/{version}" if version else "")
        params = {"min_worker": min_workers, "max_worker": max_workers, "synchronous": "true"}
        return self.call("PUT", path, params=params, timeout=timeout)

    def set_default(self, name: str, version: str) -> dict[str, Any]:
        return self.call("PUT", f"/models/{name}/{version}/set-default")

    def unregister(
        self,
        name: str,
        version: str,
        drain: bool = True,
        quiet_seconds: float = 2.0,
        drain_timeout: float = 60.0,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """DELETE a version, after draining it (TorchServe never answers requests still queued at a version it
        unregisters, so draining is the default; drain=False only for a version that took no traffic)."""
        if drain:
            self.drain(name, version, quiet_seconds, drain_timeout)
        return self.call("DELETE", f"/models/{name}/{version}", timeout=timeout)

    def refresh_token(self, kind: str) -> dict[str, Any]:
        """Have TorchServe issue a new key of this kind (needs the API key as this client's token)."""
        return self.call("GET", "/token", params={"type": kind})

    # ------------------------------------------------------------------------------------------- waiting
    def wait_ready(
        self, name: str, version: str | None = None, timeout: float = 600.0, poll: float = 1.0, log: Log = quiet
    ) -> Description:
        """Wait until the version has as many READY workers as its minWorkers (at least one); returns its
        description. A version not registered yet (an async registration) is waited for too."""
        deadline = time.monotonic() + timeout
        last = None
        label = f"{name} {version or '(default)'}"
        while True:
            try:
                description = self.description(name, version)
                wanted, ready = wanted_workers(description), len(ready_workers(description))
                if ready >= wanted:
                    return description
                state = f"{ready}/{wanted} workers READY"
            except ManagementError as error:
                if error.exit_code not in (EXIT_NOT_FOUND, EXIT_UNREACHABLE):
                    raise
                state = "not registered yet" if error.exit_code == EXIT_NOT_FOUND else "not answering yet"
            if state != last:
                log(f"  {label}: {state}")
                last = state
            if time.monotonic() >= deadline:
                raise ManagementError(
                    f"{label} not READY after {timeout:.0f}s ({state}); see the server's model_log.log", EXIT_FAILED
                )
            time.sleep(poll)

    def drain(self, name: str, version: str, quiet_seconds: float, timeout: float, poll: float = 0.25) -> None:
        """Wait until no request has been queued for this version for `quiet_seconds` (after a default switch,
        requests that resolved the old default a moment earlier may still arrive and must be answered)."""
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while True:
            description = self.description(name, version)
            if description.get("jobQueueStatus", {}).get("pendingRequests", 0) > 0:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_seconds:
                return
            if time.monotonic() >= deadline:
                raise ManagementError(f"{name} {version} still had queued requests after {timeout:.0f}s", EXIT_FAILED)
            time.sleep(poll)
