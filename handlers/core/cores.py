"""A core lease shared by the workers of one server: a batch computes on every core no other worker is using.

TorchServe runs several single-thread workers per model so that a short text never waits behind a long one's forward
pass; but a lone request then computes on one core while the others idle. The lease lets a worker widen a forward
pass onto idle cores without giving that layout up: the server start exports a directory (``TS_CORE_LEASE_DIR``,
scripts/ops/server.py) holding one lock file per core. At a forward pass a worker takes its own share of them and
every other one that is free, without waiting, computes with that many threads and lets them go. Under load every
worker finds the others' cores taken and computes on its own share, as without a lease. A model opts in with
``handler.borrow_idle_cores`` (handlers/text/engine.py): on a busy 2-core machine a long text borrowing the core
between two short requests made those short requests slower (docs/performance.md).

The locks are ``flock`` locks: the kernel releases them when the holder's file is closed, so a worker that dies
mid-forward (killed, crashed) leaves no core taken. Without the variable (a bare ``torchserve --start``) there is
no lease and nothing changes.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LEASE_DIR_ENV = "TS_CORE_LEASE_DIR"


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container's cpuset narrows)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class CoreLease:
    """``cores`` lock files in ``directory``, one per core; :meth:`hold` takes some of them for one forward pass."""

    def __init__(self, directory: str | Path, cores: int) -> None:
        self.directory = Path(directory)
        self.cores = max(1, cores)
        self.directory.mkdir(parents=True, exist_ok=True)
        # Opened once: a lock belongs to the open file, so holding the descriptors costs nothing between batches.
        self.files = [
            os.open(self.directory / f"core-{index}.lock", os.O_RDWR | os.O_CREAT, 0o600) for index in range(self.cores)
        ]

    def try_take(self, index: int) -> bool:
        try:
            fcntl.flock(self.files[index], fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    @contextmanager
    def hold(self, own: int, widen: bool = True) -> Iterator[int]:
        """Take this worker's own share of cores and, with ``widen``, every other free one; yields the threads to
        compute with: how many were taken, and never fewer than ``own``.

        It never waits. A worker whose share a borrower holds computes on its share anyway, beside the borrower's
        threads, until the borrower's forward pass ends: waiting for the whole of it made short requests behind a
        long one 2.6x slower at p50 under a mixed load (docs/performance.md); sharing a core for a short forward
        pass costs the long one a little instead."""
        own = min(max(1, own), self.cores)
        held: list[int] = []
        try:
            # Start at a core of this process's own, so workers that only ever take their share do not contend.
            start = os.getpid() % self.cores
            for index in [(start + step) % self.cores for step in range(self.cores)]:
                if (len(held) < own or widen) and self.try_take(index):
                    held.append(index)
            yield max(len(held), own)
        finally:
            self.release(held)

    def release(self, held: list[int]) -> None:
        for index in held:
            fcntl.flock(self.files[index], fcntl.LOCK_UN)


def lease_from_environment() -> CoreLease | None:
    """The server's lease (``TS_CORE_LEASE_DIR``, one lock per core this process may use), or None where unset."""
    directory = os.environ.get(LEASE_DIR_ENV, "").strip()
    if not directory:
        return None
    return CoreLease(directory, available_cores())
