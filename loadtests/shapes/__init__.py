"""Load shapes (one LoadTestShape per module, so a run names exactly one with ``-f locustfile.py,shapes/X.py``).

Each shape says how many users run at a moment of the run (:meth:`TimedShape.users_at`); :class:`TimedShape` reads
the run's options and ends the run at ``-t``.
"""

from locust import LoadTestShape


class TimedShape(LoadTestShape):
    """A shape of users over time that stops at ``-t`` (abstract: Locust does not pick it as a run's shape)."""

    abstract = True
    use_common_options = True  # reads -u (peak users) and -t (run time) itself

    def tick(self):
        options = self.runner.environment.parsed_options
        elapsed = self.get_run_time()
        if options.run_time and elapsed >= options.run_time:
            return None
        return self.users_at(elapsed, options)

    def users_at(self, elapsed, options):
        """(users, spawn rate) at `elapsed` seconds into the run."""
        raise NotImplementedError
