"""The ``spike`` profile: ``--spike-base-users`` users, a sudden jump to ``-u`` users for ``--step-seconds``, back down.

Phases: base for one ``--step-seconds``, spike for one, then base until ``-t``. The history plot shows how far p99
rises during the spike (queueing, 503s once the job queue is full) and how quickly it recovers after it.
"""

from loadtests.shapes import TimedShape


class SpikeShape(TimedShape):
    """-u is the spike's users."""

    def users_at(self, elapsed, options):
        base = max(1, options.spike_base_users)
        in_spike = options.step_seconds <= elapsed < 2 * options.step_seconds
        users = max(base, options.num_users or base) if in_spike else base
        return users, 1000.0  # all at once: a spike, not a ramp
