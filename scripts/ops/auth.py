"""TorchServe's token authorization as our tools see it: the key file, the token each API wants, the header that
carries it, and how a refusal looks.

TorchServe writes key_file.json into its working directory when token authorization is on (the production profile;
`make serve PROFILE=production` writes .run/key_file.json): {"management": {"key", "expiration time"},
"inference": {...}, "API": {"key"}}. The management CLI (scripts/modelctl.py) and the load tools (loadtests/) read it
through this module only.

The inference token the load tools send comes from, first found wins: ``--token`` (or ``$TS_INFERENCE_TOKEN``; ``make
loadtest TOKEN=...`` sets it), else the "inference" key of the key file (``--key-file``, ``$TS_KEY_FILE``, default
``.run/key_file.json``), else none: a development server has token authorization off. Locust processes get the token
through ``$TS_INFERENCE_TOKEN``, never on their command line (which goes into every report's summary.json and shows
in ``ps``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_KEY_FILE = REPO / ".run" / "key_file.json"
TOKEN_ENV = "TS_INFERENCE_TOKEN"
KEY_FILE_ENV = "TS_KEY_FILE"


class KeyFileError(ValueError):
    """A key file was named but cannot give the token asked for; the message says why."""


def read_key_file(path: str | os.PathLike) -> dict[str, Any]:
    """TorchServe's key file as a dict; KeyFileError when it cannot be read or is not JSON."""
    try:
        keys = json.loads(Path(path).read_text())
    except OSError as error:
        raise KeyFileError(f"cannot read key file {path}: {error.strerror}") from None
    except ValueError:
        raise KeyFileError(f"key file {path} is not JSON (is it TorchServe's key_file.json?)") from None
    if not isinstance(keys, dict):
        raise KeyFileError(f"key file {path} is not TorchServe's key_file.json (not a JSON object)")
    return keys


def key_from_file(path: str | os.PathLike, api: str) -> str | None:
    """The key for `api` ("management", "inference" or "API") in a key file, None when the file has none."""
    return (read_key_file(path).get(api) or {}).get("key")


def bearer(token: str | None) -> dict[str, str]:
    """The request headers that carry `token` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    """--token and --key-file for a tool that sends inference requests."""
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"inference token for a server with token authorization (default ${TOKEN_ENV}, "
        "else the key file's inference key)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        default=os.environ.get(KEY_FILE_ENV),
        help=f"TorchServe's key_file.json (default ${KEY_FILE_ENV}, else {DEFAULT_KEY_FILE} when it "
        "exists: `make serve PROFILE=production` writes it)",
    )


def resolve_inference_token(
    token: str | None = None, key_file: str | os.PathLike | None = None
) -> tuple[str | None, str]:
    """(token or None, where it came from). A key file that was named but cannot be used is a KeyFileError;
    the default one is used only when it exists, since a development server needs no token."""
    if token:
        return token, f"--token/${TOKEN_ENV}"
    path = Path(key_file) if key_file else DEFAULT_KEY_FILE
    if not path.is_file():
        if key_file:
            raise KeyFileError(
                f"key file {path} not found (TorchServe writes key_file.json into its working "
                f"directory when token authorization is on)"
            )
        return None, f"none (no --token, no key file at {path})"
    key = key_from_file(path, "inference")
    if not key:
        raise KeyFileError(f"key file {path} has no inference key")
    return key, f"key file {path}"


def refused(status: int, text: str | None) -> bool:
    """True when TorchServe refused a request for its token: 0.12 answers 400 "Token Authorization failed. Token
    either incorrect, expired, or not provided correctly", not 401 (a handler's own 400 may mention tokens too)."""
    return status in (400, 401, 403) and "token authorization" in (text or "").lower()


REFUSED_HINT = (
    f"the server wants an inference token: pass TOKEN=... (make), --token or ${TOKEN_ENV}, or --key-file "
    f"with TorchServe's key_file.json (in the server's working directory; `make serve "
    f"PROFILE=production` writes .run/key_file.json). Tokens expire after token_expiration_min minutes: "
    f"`python -m scripts.modelctl refresh-token --type inference` renews it"
)
