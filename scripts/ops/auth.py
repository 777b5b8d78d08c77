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
in ``ps``); a token read from a key file reaches them as the file's path (``$TS_KEY_FILE``), so they follow rotations.

Rotation (docs/operations.md, "Key rotation"): TorchServe 0.12 replaces a key the moment its ``/token`` API is asked
(the old key is refused at once, there is no grace period), then rewrites the key file; a key nobody rotates is
refused from its "expiration time" on. So every client of ours takes its key from a :class:`KeySource`: a fixed
token, or the key file, re-read when the file changed and once more after the server refused the key sent, and
:func:`send_renewing` retries a refused request once with the renewed key. `modelctl keep-keys-fresh` is what
rotates the keys before they expire.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

REPO = Path(__file__).resolve().parents[2]
DEFAULT_KEY_FILE = REPO / ".run" / "key_file.json"
TOKEN_ENV = "TS_INFERENCE_TOKEN"
KEY_FILE_ENV = "TS_KEY_FILE"
# How long a refused client waits for the key file to show a new key: TorchServe switches the key in memory first and
# rewrites the file right after (truncating it first), in the same request.
KEY_SETTLE_S = 0.5


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
    source = KeySource.for_inference(token, key_file)
    return source.key(), source.source


def file_stamp(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """What changes when a file is rewritten (modification time, size, inode); None when it is not there."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


class KeySource:
    """The key a client sends to one API ("inference", "management" or "API"): a fixed token, or TorchServe's key
    file, re-read whenever the file changed (one stat per request) and again after the server refused the key sent.

    A file that is being rewritten (empty or half written) keeps the key read last. Safe to share between threads."""

    def __init__(
        self,
        api: str = "inference",
        key_file: str | os.PathLike | None = None,
        token: str | None = None,
        settle_s: float = KEY_SETTLE_S,
    ):
        self.api = api
        self.key_file = Path(key_file) if key_file else None
        self.settle_s = settle_s
        self._key = token
        self._stamp: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        self.source = f"key file {self.key_file}" if self.key_file else (f"--token/${TOKEN_ENV}" if token else "none")

    @classmethod
    def for_inference(cls, token: str | None = None, key_file: str | os.PathLike | None = None) -> KeySource:
        """The inference key as the tools take it: `token`, else the key file (`key_file`, else the default one when
        it exists), else none. A named key file that is missing or has no inference key is a KeyFileError."""
        if token:
            return cls("inference", token=token)
        path = Path(key_file) if key_file else DEFAULT_KEY_FILE
        if not path.is_file():
            if key_file:
                raise KeyFileError(
                    f"key file {path} not found (TorchServe writes key_file.json into its working "
                    f"directory when token authorization is on)"
                )
            source = cls("inference")
            source.source = f"none (no --token, no key file at {path})"
            return source
        source = cls("inference", path)
        source.key()  # a file that cannot give the key is an error now, not at the first request
        return source

    @classmethod
    def of(cls, token: str | KeySource | None) -> KeySource:
        """`token` as a source: itself when it is one, else that fixed token (or none)."""
        return token if isinstance(token, KeySource) else cls("inference", token=token or None)

    @classmethod
    def from_environment(cls, token: str | None = None) -> KeySource:
        """The inference key of a process started by a load tool (Locust): `token` (its --token, default
        $TS_INFERENCE_TOKEN) as it is, else the key file $TS_KEY_FILE names, re-read after rotations, else none."""
        key_file = os.environ.get(KEY_FILE_ENV)
        return cls("inference", key_file) if key_file and not token else cls("inference", token=token or None)

    @property
    def renewable(self) -> bool:
        return self.key_file is not None

    def key(self) -> str | None:
        """The key to send now: the key file's current one (re-read when the file changed), or the fixed token."""
        if self.key_file is None:
            return self._key
        stamp = file_stamp(self.key_file)
        if stamp != self._stamp:
            with self._lock:
                self._reload(stamp)
        return self._key

    def _reload(self, stamp: tuple[int, int, int] | None) -> None:
        assert self.key_file is not None
        try:
            key = key_from_file(self.key_file, self.api)
        except KeyFileError:
            if self._key is None:
                raise
            return  # being rewritten: keep the last key, read again at the next call (the stamp stays old)
        if not key:
            if self._key is None:
                raise KeyFileError(f"key file {self.key_file} has no {self.api} key")
            return
        self._key, self._stamp = key, stamp

    def headers(self) -> dict[str, str]:
        return bearer(self.key())

    def renew(self, refused_key: str | None) -> bool:
        """After the server refused `refused_key`: True when the key file now holds another key (waiting up to
        settle_s for TorchServe to finish rewriting it); False for a fixed token, or when the file still holds the
        refused key (it expired and nobody rotated it, or the file is another server's)."""
        if self.key_file is None:
            return False
        deadline = time.monotonic() + self.settle_s
        while True:
            self._stamp = None  # read the file again even if it looks unchanged
            try:
                key = self.key()
            except KeyFileError:
                key = refused_key
            if key != refused_key:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def expires(self) -> str | None:
        """The "expiration time" the key file gives the key (None for a fixed token or an unreadable file)."""
        if self.key_file is None:
            return None
        try:
            return (read_key_file(self.key_file).get(self.api) or {}).get("expiration time")
        except KeyFileError:
            return None

    def refusal_hint(self) -> str:
        """Why a key from this source may have been refused, for an error message."""
        if self.key_file is None:
            return "the token given is wrong or expired (a key file would be re-read after a rotation)"
        expires = self.expires()
        return (
            f"the {self.api} key in {self.key_file} was refused and the file has no newer one: it expired"
            f"{' at ' + expires if expires else ''} and nobody rotated it (run `python -m scripts.modelctl "
            f"keep-keys-fresh` beside the server), or the file is another server's"
        )


class Answer(Protocol):
    """An HTTP answer as requests and Locust give it."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...


AnswerT = TypeVar("AnswerT", bound=Answer)


def send_renewing(send: Callable[[dict[str, str]], AnswerT], keys: KeySource) -> AnswerT:
    """`send(headers)` with the source's key; when the server refuses that key and the key file holds another one
    by now (a rotation), once more with it. The answer is the last one (still a refusal when nothing newer came)."""
    sent = keys.key()
    answer = send(bearer(sent))
    if refused(answer.status_code, answer.text) and keys.renew(sent):
        answer = send(keys.headers())
    return answer


def refused(status: int, text: str | None) -> bool:
    """True when TorchServe refused a request for its token: 0.12 answers 400 "Token Authorization failed. Token
    either incorrect, expired, or not provided correctly", not 401 (a handler's own 400 may mention tokens too)."""
    return status in (400, 401, 403) and "token authorization" in (text or "").lower()


REFUSED_HINT = (
    f"the server wants an inference token: pass TOKEN=... (make), --token or ${TOKEN_ENV}, or --key-file "
    f"with TorchServe's key_file.json (in the server's working directory; `make serve "
    f"PROFILE=production` writes .run/key_file.json). Tokens expire after token_expiration_min minutes unless "
    f"rotated: run `python -m scripts.modelctl keep-keys-fresh` beside the server, and pass the key file, not "
    f"the token, so the new keys are picked up"
)
