"""The ``step`` profile: add ``--step-users`` users every ``--step-seconds`` up to ``-u``, then hold until ``-t``.

Each step is a plateau long enough for latency to settle, so the history plot shows where p99 starts to climb.
"""

from loadtests.shapes import TimedShape


class StepShape(TimedShape):
    """-u is the peak users."""

    def users_at(self, elapsed, options):
        step = int(elapsed // options.step_seconds) + 1
        users = min(options.num_users or options.step_users, step * options.step_users)
        # Spawn a whole step at once: the plateau, not the ramp, is what is measured.
        return users, max(1.0, float(options.step_users) * 10)
