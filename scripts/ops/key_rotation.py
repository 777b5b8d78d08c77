"""Rotating TorchServe's inference and management keys before they expire (`modelctl rotate-keys`,
`modelctl keep-keys-fresh`).

What TorchServe 0.12 does (seen on a real server): ``GET /token?type=inference|management`` on the management API,
sent with the key file's "API" key, issues a new key of that kind, valid for token_expiration_min minutes from now;
the old key is refused from that moment (no grace period); then key_file.json is rewritten. A key nobody rotates is
refused from its "expiration time" on, and nothing renews it by itself. The API key itself never expires; a restarted
server writes a new file with new keys of all three kinds.

So the keys are rotated well inside their lifetime (by default at half of it: a failed rotation, say while the server
restarts, has the other half to be retried), and clients take their key from the key file and re-read it after a
refusal (scripts/ops/auth.py KeySource), so a rotation costs them at most one refused request, retried.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from typing import Any

from scripts.ops.auth import KeyFileError, KeySource, read_key_file
from scripts.ops.management import EXIT_USAGE, ManagementClient, ManagementError, quiet

KINDS = ("inference", "management")
RETRY_SECONDS = 10.0

Log = Callable[[str], None]


def rotation_client(url: str, key_file: str | os.PathLike, timeout: float = 30.0) -> ManagementClient:
    """A management client that sends the key file's API key (re-read each time the file changes: a restarted
    server has a new one), as TorchServe's /token API wants."""
    keys = KeySource("API", key_file)
    return ManagementClient(url, token_source=f"the API key in {key_file}", timeout=timeout, keys=keys)


def expiry(text: str | None) -> datetime.datetime | None:
    """TorchServe's "expiration time" (ISO 8601 with nanoseconds and Z) as an aware datetime; None if absent."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return None


def rotate(client: ManagementClient, key_file: str | os.PathLike, kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """Have TorchServe issue a new key of each kind; {"rotated", "expires": {kind: time}, "lifetime_s"} where
    lifetime_s is how long the shortest-lived new key has left (None if the file gives no times)."""
    for kind in kinds:
        client.refresh_token(kind)
    try:
        keys = read_key_file(key_file)
    except KeyFileError as error:
        raise ManagementError(f"rotated {', '.join(kinds)}, but then: {error}") from None
    expires = {kind: (keys.get(kind) or {}).get("expiration time") for kind in kinds}
    now = datetime.datetime.now(datetime.UTC)
    left = [(when - now).total_seconds() for when in map(expiry, expires.values()) if when is not None]
    return {"rotated": list(kinds), "expires": expires, "lifetime_s": min(left) if left else None}


def next_rotation_s(lifetime_s: float | None, every: float | None) -> float:
    """Seconds until the next rotation: `every`, else half the keys' lifetime. ManagementError (usage) when `every` is
    not shorter than the lifetime (the keys would expire first), or neither is known."""
    if every is not None:
        if lifetime_s is not None and every >= lifetime_s:
            raise ManagementError(
                f"--every {every:g}s is not shorter than the keys' lifetime ({lifetime_s:.0f}s, the server's "
                f"token_expiration_min): they would expire before the next rotation",
                EXIT_USAGE,
            )
        return every
    if lifetime_s is None:
        raise ManagementError("the key file gives no expiration time: pass --every SECONDS", EXIT_USAGE)
    return lifetime_s / 2


def keep_fresh(
    client: ManagementClient,
    key_file: str | os.PathLike,
    kinds: tuple[str, ...] = KINDS,
    every: float | None = None,
    retry_s: float = RETRY_SECONDS,
    log: Log = quiet,
    sleep: Callable[[float], None] = time.sleep,
    rounds: int | None = None,
) -> None:
    """Rotate now, then again every `every` seconds (default: half the keys' lifetime), until stopped (or `rounds`
    rotations were tried). A failed rotation (server unreachable or restarting, key file being rewritten) is logged
    and retried after `retry_s`; only a usage error ends the loop."""
    tried = 0
    while rounds is None or tried < rounds:
        tried += 1
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        try:
            result = rotate(client, key_file, kinds)
            wait = next_rotation_s(result["lifetime_s"], every)
            until = ", ".join(f"{kind} {when}" for kind, when in result["expires"].items())
            log(f"{stamp} rotated {', '.join(kinds)} (valid until {until}); next rotation in {wait:.0f}s")
        except ManagementError as error:
            if error.exit_code == EXIT_USAGE:
                raise
            wait = retry_s
            log(f"{stamp} rotation failed, retrying in {wait:.0f}s: {error}")
        if rounds is None or tried < rounds:
            sleep(wait)
