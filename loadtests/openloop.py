"""Open-loop load: request start times fixed in advance by an arrival process, independent of the responses.

Locust's users are closed-loop: a user waits for its response before sending again, so a slow server slows the load
down and queueing hides (coordinated omission). An open-loop generator starts each request when its arrival is due,
however many are still in flight, like independent clients do. These are its pure parts: the arrival schedule and
the counters that say whether the generator kept up (a late or skipped start means the *generator*, not the server,
limited the offered rate, and the run must say so).
"""

import random
from dataclasses import asdict, dataclass, field, fields


def arrival_offsets(rate, process="poisson", seed=0):
    """Endless arrival times in seconds from the start: ``poisson`` (exponential gaps, seeded) or ``uniform``.

    The first arrival comes one gap after the start (not at 0), so n arrivals in t seconds estimate the rate as n / t.
    """
    if rate <= 0:
        raise ValueError(f"arrival rate must be positive, got {rate}")
    if process not in ("poisson", "uniform"):
        raise ValueError(f"unknown arrival process {process!r}; use poisson or uniform")
    rng = random.Random(f"arrivals-{seed}")
    offset = 0.0
    count = 0
    while True:
        if process == "uniform":
            count += 1
            yield count / rate
        else:
            offset += rng.expovariate(rate)
            yield offset


@dataclass
class OpenLoopCounters:
    """What the generator did with its arrivals (summed over users and Locust workers)."""

    scheduled: int = 0  # arrivals whose time came
    started: int = 0  # requests started (on time or late)
    late: int = 0  # started more than the tolerance after their due time (the generator was busy)
    not_started: int = 0  # dropped because max_in_flight requests were already open
    completed: int = 0  # started requests that finished (answered, failed or gave up retrying)
    max_lag_ms: float = 0.0  # worst start delay behind schedule
    # Per open-loop user: [requests started, seconds its schedule ran] (absolute values, not deltas), so the
    # achieved rate is the sum of the users' own rates even when they started at different moments.
    users: dict = field(default_factory=dict)

    def record(self, lag_seconds, started, tolerance_seconds, user="0", elapsed=None):
        self.scheduled += 1
        mine = self.users.setdefault(str(user), [0, 0.0])
        if elapsed is not None:
            mine[1] = max(mine[1], elapsed)
        self.max_lag_ms = max(self.max_lag_ms, lag_seconds * 1000.0)
        if not started:
            self.not_started += 1
            return
        self.started += 1
        mine[0] += 1
        if lag_seconds > tolerance_seconds:
            self.late += 1

    def ran(self, user, elapsed):
        """How long a user's schedule has run (called per arrival and when the user stops)."""
        mine = self.users.setdefault(str(user), [0, 0.0])
        mine[1] = max(mine[1], elapsed)

    def take(self):
        """The counts since the last take (for a Locust worker's periodic report), then reset them."""
        snapshot = asdict(self)
        for counter in fields(self):
            if counter.name not in ("max_lag_ms", "users"):
                setattr(self, counter.name, 0)
        return snapshot

    def merge(self, report):
        for counter in fields(self):
            value = report.get(counter.name)
            if value is None:
                continue
            if counter.name == "max_lag_ms":
                self.max_lag_ms = max(self.max_lag_ms, value)
            elif counter.name == "users":
                self.users.update({key: list(entry) for key, entry in value.items()})
            else:
                setattr(self, counter.name, getattr(self, counter.name) + value)

    @property
    def achieved_rate(self):
        return sum(started / seconds for started, seconds in self.users.values() if seconds > 0)

    @property
    def seconds(self):
        return max((seconds for _, seconds in self.users.values()), default=0.0)

    def summary(self, target_rate):
        """Target vs achieved start rate, and how many starts the generator could not make on time."""
        achieved = self.achieved_rate
        return {
            "target_rate": target_rate,
            "achieved_rate": round(achieved, 3),
            "achieved_share": round(achieved / target_rate, 4) if target_rate else None,
            "scheduled": self.scheduled,
            "started": self.started,
            "late_starts": self.late,
            "not_started": self.not_started,
            "unfinished_at_stop": self.started - self.completed,
            "max_start_lag_ms": round(self.max_lag_ms, 2),
            "schedule_seconds": round(self.seconds, 3),
            "open_loop_users": len(self.users),
        }
