"""The inference token the load tools send, for servers with token authorization (the production profile).

Where it comes from, first found wins: ``--token`` (or ``$TS_INFERENCE_TOKEN``; ``make loadtest TOKEN=...`` sets it),
else the "inference" key of TorchServe's key file (``--key-file``, ``$TS_KEY_FILE``, default ``.run/key_file.json``,
which ``make serve PROFILE=production`` writes), else none: a development server has token authorization off.
The key file is read by scripts/modelctl.py's reader, the same one the management CLI uses.

The Locust processes get the token through ``$TS_INFERENCE_TOKEN``, never on their command line (which goes into
every report's summary.json and shows in ``ps``), and send it as ``Authorization: Bearer <key>``.
"""

import os
from pathlib import Path

TOKEN_ENV = "TS_INFERENCE_TOKEN"


class TokenError(ValueError):
    """A key file was named but cannot give an inference token."""


def headers(token):
    """The request headers that carry `token` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def add_arguments(parser):
    from scripts.modelctl import DEFAULT_KEY_FILE

    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"inference token for a server with token authorization (default ${TOKEN_ENV}, "
                             "else the key file's inference key)")
    parser.add_argument("--key-file", type=Path, default=os.environ.get("TS_KEY_FILE"),
                        help=f"TorchServe's key_file.json (default $TS_KEY_FILE, else {DEFAULT_KEY_FILE} when it "
                             "exists: `make serve PROFILE=production` writes it)")


def resolve(token=None, key_file=None):
    """(token or None, where it came from). A key file that was named but cannot be used is a TokenError;
    the default one is used only when it exists, since a development server needs no token."""
    from scripts.modelctl import DEFAULT_KEY_FILE, CtlError, read_key_file

    if token:
        return token, f"--token/${TOKEN_ENV}"
    path = Path(key_file) if key_file else DEFAULT_KEY_FILE
    if not path.is_file():
        if key_file:
            raise TokenError(f"key file {path} not found (TorchServe writes key_file.json into its working "
                             f"directory when token authorization is on)")
        return None, f"none (no --token, no key file at {path})"
    try:
        keys = read_key_file(path)
    except CtlError as error:
        raise TokenError(str(error)) from None
    key = (keys.get("inference") or {}).get("key") if isinstance(keys, dict) else None
    if not key:
        raise TokenError(f"key file {path} has no inference key")
    return key, f"key file {path}"


def refused(status, text):
    """True when TorchServe refused a request for its token: 0.12 answers 400 "Token Authorization failed. Token
    either incorrect, expired, or not provided correctly", not 401 (a handler's own 400 may mention tokens too)."""
    return status in (400, 401, 403) and "token authorization" in (text or "").lower()


REFUSED_HINT = (f"the server wants an inference token: pass TOKEN=... (make), --token or ${TOKEN_ENV}, or --key-file "
                f"with TorchServe's key_file.json (in the server's working directory; `make serve "
                f"PROFILE=production` writes .run/key_file.json). Tokens expire after token_expiration_min minutes: "
                f"`python -m scripts.modelctl refresh-token --type inference` renews it")
