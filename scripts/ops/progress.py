"""Is each model answering, or stuck? The one progress check the readiness probe (scripts/ready_probe.py) and the
watchdog (scripts/server_watchdog.py) share.

A model is STUCK when it has work (requests waiting in TorchServe's queue, or received and not answered) and has made
no progress for ``stuck_after_s`` seconds. Every signal comes from TorchServe's frontend, so it holds while the
model's only worker is hung (a hung worker cannot report that it is hung):

- waiting: ``jobQueueStatus.pendingRequests`` of the management API's describe (the requests no worker has taken);
- received: the frontend counter ``ts_inference_requests_total`` on the metrics port (counted when a request for the
  model arrives, every version label summed);
- progress: ``ts_inference_latency_microseconds`` (a sum the frontend adds to when it sends an answer: any change
  is at least one answer) and the handlers' ``Batches`` counter (one per batch or generation step a worker finished:
  a long stream, answered only at its end, still shows progress step by step).

Worker status is no signal: TorchServe 0.12 reports a worker READY while it computes, and while it is wedged.

What progress cannot tell: requests the frontend answers itself without an answer counted (503 queue full, a worker
that died, a timeout) still count as received; they are forgotten at the next progress, at a worker replacement
(the workers' start times change) and when the counters restart with the server.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import requests

from scripts.ops.management import ManagementClient

DEFAULT_METRICS_URL = "http://127.0.0.1:8082"
DEFAULT_STUCK_AFTER_S = 60.0
RECEIVED = "ts_inference_requests_total"
ANSWERED = "ts_inference_latency_microseconds"
BATCHES = "Batches"
# Prometheus text: name{label="value",...} value (TorchServe writes a trailing comma inside the braces).
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Signals:
    """One look at one model (its default version)."""

    version: str
    pending: int  # requests waiting in TorchServe's queue
    received: float  # inference requests received, all versions
    answered: float  # the frontend's answer counter (a latency sum: only its changes mean anything)
    batches: float  # batches / steps the handlers finished
    workers: tuple[str, ...]  # each worker's id and start time: a change means workers were replaced


@dataclass
class Track:
    """What the monitor remembers of one model between looks."""

    version: str
    workers: list[str]
    received: float  # at the last progress (or the first look)
    answered: float
    batches: float
    stalled_since: float | None  # when work without progress was first seen


@dataclass(frozen=True)
class Verdict:
    model: str
    version: str
    stuck: bool
    stalled_for: float  # seconds with work and no progress (0 while it progresses or is idle)
    pending: int
    unanswered: float  # requests received since the last progress (an upper bound: see the module's docstring)

    def why(self) -> str:
        """What it has waiting and for how long it made no progress."""
        waiting = f"{self.pending} request{'s' if self.pending != 1 else ''} waiting"
        return (
            f"{waiting}, {self.unanswered:.0f} received since its last answer, no progress for {self.stalled_for:.1f} s"
        )

    def describe(self) -> str:
        """One line: the model and why."""
        return f"{self.model} {self.version}: {self.why()}"


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """Prometheus text -> {model: {RECEIVED, ANSWERED, BATCHES: sum over its samples}} (other metrics ignored)."""
    totals: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match is None or match.group(1) not in (RECEIVED, ANSWERED, BATCHES):
            continue
        labels = dict(LABEL.findall(match.group(2) or ""))
        model = labels.get("model_name") or labels.get("ModelName")
        if model is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        counters = totals.setdefault(model, dict.fromkeys((RECEIVED, ANSWERED, BATCHES), 0.0))
        counters[match.group(1)] += value
    return totals


class MetricsUnusable(Exception):
    """The metrics port did not answer with Prometheus text."""


def read_metrics(metrics_url: str, timeout: float) -> dict[str, dict[str, float]]:
    url = metrics_url.rstrip("/") + "/metrics"
    try:
        response = requests.get(url, timeout=timeout)
    except requests.RequestException as error:
        raise MetricsUnusable(f"metrics API at {url} unusable: {type(error).__name__}") from None
    if response.status_code != 200:
        raise MetricsUnusable(f"metrics API at {url} answered {response.status_code}")
    return parse_metrics(response.text)


def read_signals(client: ManagementClient, metrics_url: str, timeout: float = 2.0) -> dict[str, Signals]:
    """Every registered model's signals; ManagementError or MetricsUnusable when a port does not answer."""
    counters = read_metrics(metrics_url, timeout)
    signals = {}
    for entry in client.list_models():
        name = entry["modelName"]
        description = client.description(name)
        mine = counters.get(name, {})
        signals[name] = Signals(
            version=str(description.get("modelVersion")),
            pending=int((description.get("jobQueueStatus") or {}).get("pendingRequests") or 0),
            received=mine.get(RECEIVED, 0.0),
            answered=mine.get(ANSWERED, 0.0),
            batches=mine.get(BATCHES, 0.0),
            workers=tuple(sorted(f"{w.get('id')}@{w.get('startTime')}" for w in description.get("workers", []))),
        )
    return signals


class ProgressMonitor:
    """Remembers each model's last progress across looks; ``observe`` says which models are stuck."""

    def __init__(self, stuck_after_s: float = DEFAULT_STUCK_AFTER_S, tracks: dict[str, Track] | None = None):
        if stuck_after_s <= 0:
            raise ValueError("stuck_after_s must be positive")
        self.stuck_after_s = stuck_after_s
        self.tracks: dict[str, Track] = dict(tracks or {})

    def observe(self, name: str, signals: Signals, now: float) -> Verdict:
        track = self.tracks.get(name)
        if track is None or self.starts_afresh(track, signals):
            # First look, another default version, replaced workers or a restarted server: a new baseline. Requests
            # already waiting count from now.
            track = self.baseline(signals, now if signals.pending else None)
        elif (signals.answered, signals.batches) != (track.answered, track.batches):
            # Progress: requests still waiting get the whole bound from now.
            track = self.baseline(signals, now if signals.pending else None)
        elif signals.pending > 0 or signals.received > track.received:
            track.stalled_since = track.stalled_since if track.stalled_since is not None else now
        else:
            track.stalled_since = None
        self.tracks[name] = track
        stalled_for = now - track.stalled_since if track.stalled_since is not None else 0.0
        return Verdict(
            model=name,
            version=signals.version,
            stuck=stalled_for >= self.stuck_after_s,
            stalled_for=stalled_for,
            pending=signals.pending,
            unanswered=max(0.0, signals.received - track.received),
        )

    @staticmethod
    def starts_afresh(track: Track, signals: Signals) -> bool:
        counters_went_back = signals.received < track.received or signals.batches < track.batches
        return track.version != signals.version or track.workers != list(signals.workers) or counters_went_back

    @staticmethod
    def baseline(signals: Signals, stalled_since: float | None) -> Track:
        return Track(
            signals.version,
            list(signals.workers),
            signals.received,
            signals.answered,
            signals.batches,
            stalled_since,
        )

    def observe_all(self, signals: dict[str, Signals], now: float) -> list[Verdict]:
        """Verdicts for every model looked at; models no longer registered are forgotten."""
        for gone in set(self.tracks) - set(signals):
            del self.tracks[gone]
        return [self.observe(name, one, now) for name, one in sorted(signals.items())]

    def forget(self, name: str) -> None:
        """Start over for this model (after the watchdog replaced its workers)."""
        self.tracks.pop(name, None)

    # A probe is one short process per look: it keeps the tracks in a file between looks.
    def state(self) -> dict[str, Any]:
        return {"stuck_after_s": self.stuck_after_s, "tracks": {name: asdict(t) for name, t in self.tracks.items()}}

    @classmethod
    def from_state(cls, state: Any, stuck_after_s: float) -> ProgressMonitor:
        """The monitor a saved state describes; a state that does not parse is ignored (a fresh start)."""
        tracks = {}
        try:
            for name, fields in state["tracks"].items():
                tracks[name] = Track(**fields)
        except (TypeError, KeyError, AttributeError):
            tracks = {}
        return cls(stuck_after_s, tracks)


def stuck_models(
    client: ManagementClient, metrics_url: str, monitor: ProgressMonitor, now: float, timeout: float = 2.0
) -> list[Verdict]:
    """One look at every model: its verdict (ManagementError / MetricsUnusable when the server cannot be asked)."""
    return monitor.observe_all(read_signals(client, metrics_url, timeout), now)
