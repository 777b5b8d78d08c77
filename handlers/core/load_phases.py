"""Where a worker's start-up time goes: ``initialize`` timed phase by phase.

Scale-up, restarts and rollouts wait for every new worker's ``initialize``; when it is slow, the split says which
step to cut (reading the model, the accuracy gate's fp32 reference, loading a compiled backend, the gate's own pass,
warm-up). The phases are logged on the worker's "ready" line and shown in ``describe`` as ``load_phases``; they add
up to ``load_seconds`` (what no phase covers is ``other``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

OTHER = "other"


class LoadPhases:
    """Seconds per named phase since the timer was made; a phase timed twice (one per backend candidate) adds up."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.total: float | None = None  # set by finish()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        begun = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - begun

    def finish(self) -> float:
        """End the timing: the total seconds, with the time outside every phase recorded as ``other``."""
        self.total = time.perf_counter() - self.started
        self.seconds[OTHER] = max(0.0, self.total - sum(s for name, s in self.seconds.items() if name != OTHER))
        return self.total

    def rounded(self, digits: int = 2) -> dict[str, float]:
        """The phases in the order they first ran, rounded for describe."""
        return {name: round(seconds, digits) for name, seconds in self.seconds.items()}

    def summary(self) -> str:
        """One line for the log: 'model 0.4, gate_reference 0.3, backend_load 2.9, ...'."""
        return ", ".join(f"{name} {seconds:.1f}" for name, seconds in self.seconds.items())
